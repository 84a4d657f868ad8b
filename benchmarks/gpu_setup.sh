#!/usr/bin/env bash
# Install onnxruntime-gpu on the lent GPU machine (run it THERE, in the repository root).
#
# What the GPU machine has (/work/.library/device/KINDS.md, package list read 2026-11-17, and
# a session's pip list from 2026-11): image 'cuda', python3 = Python 3.12.3 at
# /opt/torch/.venv/bin/python3, torch 2.11.0+cu130, numpy 2.5.2, onnx 1.23.1, onnx-ir 1.0.0,
# onnxscript 0.7.2, onnxruntime 1.30.0 (CPU only), ml-dtypes, typer, rich, jinja2, pillow,
# matplotlib, transformers, nvidia-ml-py, and the CUDA 13 / cuDNN 9 wheels ONNX Runtime's CUDA
# EP loads (nvidia-cuda-runtime, -cublas, -cudnn-cu13, -cufft, -curand, -cuda-nvrtc). No
# TensorRT. Nothing can be downloaded there (no registry access). So only onnxruntime-gpu is
# missing.
#
# Transport: one `run` call carries at most 64 MiB. The wheel
# onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl (255,569,273 bytes, sha256
# 05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7, built for CUDA 13) is
# unpacked here, its TensorRT EP library (libonnxruntime_providers_tensorrt.so: TensorRT cannot
# run there anyway) dropped, and the rest (wheel files and dist-info) repacked as one
# `tar | xz -9` stream (202,644,120 bytes, 79% of the wheel), cut into parts of at most 58 MiB:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d /tmp/ortw onnxruntime-gpu==1.31.1
#   bash benchmarks/gpu_setup.sh pack /tmp/ortw/onnxruntime_gpu-1.31.1-*.whl /work/main/.gpu
# which writes .gpu/o0/part, .gpu/o1/part, ... and .gpu/ort.sha256 (the parts' and the
# stream's sha256; .gpu/ is git-ignored in the lead's checkout, so the parts stay there for
# reuse). /tmp survives only while the machine stays warm (30 s after each call), so make the
# calls back to back, each with its own carry (N = number of parts, 4 for 1.31.1):
#   run carry=[".gpu/o0"]   bash benchmarks/gpu_setup.sh part 0
#   run carry=[".gpu/o1"]   bash benchmarks/gpu_setup.sh part 1
#   run carry=[".gpu/o2"]   bash benchmarks/gpu_setup.sh part 2
#   run carry=[".gpu/o3"]   bash benchmarks/gpu_setup.sh part 3 && bash benchmarks/gpu_setup.sh install
# (the last part is 19 MiB: other files can travel with it)
# (the script travels with the lead's checkout; a helper carrying its own copy runs
# `bash .gpu/pipe/benchmarks/gpu_setup.sh ...` instead). `install` checks the sha256 of the
# joined stream and unpacks it into /tmp/site. Then in every later call on the same machine:
#   export PYTHONPATH=/tmp/site:$PWD/src
# (precision_doctor.runners.device calls onnxruntime.preload_dlls(), which loads the CUDA and
# cuDNN libraries of PyTorch's nvidia wheels; see shared/docs/GPU.md).
#
# Usage: bash benchmarks/gpu_setup.sh pack WHEEL DEST | part N | install | check
set -euo pipefail

ASSEMBLED=/tmp/ort.tar.xz
LEDGER=/tmp/ort.parts
SITE=/tmp/site
PY=${PYTHON:-python3}
PART_BYTES=$((58 * 1024 * 1024))

die() { echo "gpu_setup: $*" >&2; exit 1; }

pack() {
  local wheel=$1 dest=$2 tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && unzip -q "$wheel" && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so \
     && tar cf - . | xz -9 -T0 > stream.xz)
  rm -rf "$dest"/o[0-9]*
  local n=0 off=0 size
  size=$(stat -c %s "$tmp/stream.xz")
  : > "$dest/ort.sha256"
  while (( off < size )); do
    mkdir -p "$dest/o$n"
    dd if="$tmp/stream.xz" of="$dest/o$n/part" bs=1M iflag=skip_bytes,count_bytes \
       skip=$off count=$PART_BYTES status=none
    echo "part$n $(sha256sum "$dest/o$n/part" | cut -d' ' -f1)" >> "$dest/ort.sha256"
    off=$((off + PART_BYTES)); n=$((n + 1))
  done
  echo "stream $(sha256sum "$tmp/stream.xz" | cut -d' ' -f1) $size $n" >> "$dest/ort.sha256"
  rm -rf "$tmp"
  cat "$dest/ort.sha256"
}

# sha256 of the parts and of the joined stream: from .gpu/ort.sha256 when it travels with the
# part (carry it beside .gpu/oN: a fresh checkout repacks, and xz output is not byte-identical
# across packs), else as `pack` last wrote them (onnxruntime-gpu 1.31.1, 2026-11-25)
expected() {  # expected part N | expected stream
  case $1 in
    part) sed -n "s/^part$2 //p" <<< "$SUMS" ;;
    stream) awk '/^stream/ {print $2}' <<< "$SUMS" ;;
    count) awk '/^stream/ {print $4}' <<< "$SUMS" ;;
  esac
}
SUMS=$(cat <<'EOF'
part0 7bfaf5f51d768efc4b56e0888eead40197017e3b18ec7055dd91c50a8b47794d
part1 4b363fb40014c028ad018a66c886e1d79e41e337702b7d21ba33416cd5983743
part2 00fcaf1a5b26c453869b56ba3eb5b8531da392cd0905872e3c27f7c2344b8028
part3 7171402e2b9a408c93c4ec5ac5174559a19f593fbde5acf866a89628d3c627f4
stream 62519a11b3ecb9e1a75ea74c2007a3868856d21593e8f8551a1b1c8706e1921c 202641108 4
EOF
)
[[ -f .gpu/ort.sha256 ]] && SUMS=$(cat .gpu/ort.sha256)

append_part() {
  local n=$1 src=".gpu/o$1/part" sum want
  [[ -f $src ]] || die "$src is missing: carry .gpu/o$n in this run call"
  sum=$(sha256sum "$src" | cut -d' ' -f1)
  want=$(expected part "$n")
  [[ -z $want || $sum == "$want" ]] || die "$src is corrupt (sha256 $sum, expected $want)"
  if [[ $n == 0 ]]; then
    : > "$ASSEMBLED"; : > "$LEDGER"
  else
    local last
    last=$(tail -n 1 "$LEDGER" 2>/dev/null || true)
    [[ $last == $((n - 1)) ]] || die "part $n needs part $((n - 1)) first (have: '${last:-none}'; the machine may have been given back: start again at part 0)"
  fi
  cat "$src" >> "$ASSEMBLED"
  echo "$n" >> "$LEDGER"
  echo "gpu_setup: appended part $n; $ASSEMBLED is $(stat -c %s "$ASSEMBLED") bytes"
}

install() {
  [[ -f $ASSEMBLED ]] || die "$ASSEMBLED is missing: run 'part 0' .. first"
  local sum want
  sum=$(sha256sum "$ASSEMBLED" | cut -d' ' -f1)
  want=$(expected stream)
  [[ -z $want || $sum == "$want" ]] || die "$ASSEMBLED sha256 $sum != $want (parts missing?)"
  mkdir -p "$SITE"
  xz -dc "$ASSEMBLED" | tar x -C "$SITE"
  check
}

check() {
  PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "
import onnxruntime
onnxruntime.preload_dlls()
print('onnxruntime', onnxruntime.__version__, 'from', onnxruntime.__file__)
print(onnxruntime.get_available_providers())
"
  echo "gpu_setup: now use: export PYTHONPATH=$SITE:\$PWD/src"
}

case "${1:-}" in
  pack) pack "$(realpath "${2:?wheel}")" "$(realpath "${3:?dest folder}")" ;;
  part) append_part "${2:?usage: gpu_setup.sh part N}" ;;
  install) install ;;
  check) check ;;
  *) die "usage: bash benchmarks/gpu_setup.sh pack WHEEL DEST | part N | install | check" ;;
esac
