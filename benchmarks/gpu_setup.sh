#!/usr/bin/env bash
# Install onnxruntime-gpu on the lent GPU machine (run it THERE, in the repository root).
#
# What the GPU machine has (/work/.library/device/KINDS.md, package list read 2026-11-17, and
# a session's pip list from 2026-11): image 'cuda', python3 = Python 3.12.3 at
# /opt/torch/.venv/bin/python3, torch 2.11.0+cu130, numpy 2.5.2, onnx 1.23.1, onnx-ir 1.0.0,
# onnxscript 0.7.2, onnxruntime 1.30.0 (CPU only), ml-dtypes, typer, rich, click, shellingham,
# markdown-it-py, mdurl, pygments, typing-extensions, protobuf, pillow, jinja2, markupsafe,
# flatbuffers, packaging, sympy, cuda-bindings (cuda-python), and the CUDA 13 / cuDNN 9 wheels
# ONNX Runtime's CUDA EP loads (nvidia-cuda-runtime, -cublas, -cudnn-cu13, -cufft, -curand,
# -cuda-nvrtc). No TensorRT. Nothing can be downloaded there (no registry access).
# So only onnxruntime-gpu is missing; .gpu/deps holds py3.12 wheels of the project's other
# dependencies as a fallback, and `install` installs only those the machine lacks (FORCE_DEPS=1
# installs them all).
#
# Transport: one `run` call carries at most 64 MiB, so the 255,569,273-byte wheel
# onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
# (sha256 05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7, built for CUDA 13)
# was cut with `split -b 52M` into .gpu/c0/part0 ... .gpu/c4/part4 (.gpu/ is git-ignored).
# /tmp survives only while the machine stays warm (30 s after each call), so make the calls
# back to back, each with its own carry:
#   run carry=[".gpu/c0"]   bash benchmarks/gpu_setup.sh part 0
#   run carry=[".gpu/c1"]   bash benchmarks/gpu_setup.sh part 1
#   run carry=[".gpu/c2"]   bash benchmarks/gpu_setup.sh part 2
#   run carry=[".gpu/c3"]   bash benchmarks/gpu_setup.sh part 3
#   run carry=[".gpu/c4"]   bash benchmarks/gpu_setup.sh part 4 && bash benchmarks/gpu_setup.sh install
#   (only if `install` reports a missing dependency: run carry=[".gpu/deps"] ... install)
# Then in every later call on the same machine:
#   export PYTHONPATH=/tmp/site:$PWD/src; python3 -c "import onnxruntime; onnxruntime.preload_dlls()"
# (preload_dlls loads the CUDA/cuDNN libraries of PyTorch's wheels; see shared/docs/GPU.md).
#
# Usage: bash benchmarks/gpu_setup.sh part N | install | check | all
set -euo pipefail

WHEEL_NAME=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
WHEEL_SHA256=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
WHEEL_SIZE=255569273
PART_SHA256=(
  cac38f6e809e71d0b304152535816090ffadf0e2a35fa9eea9356977b4bfbc81
  6bea5020e24af4d7568a1855a68dd2cff98ef51d6bcef1435ce313c52a3ab787
  b70a898c4f100217a64f416637b9e1978e9c6ae4f35574636c7fabf3c687b408
  3ceb4c31c3dfd46726337d67fa18921dcac25d48ecafdb690e10e81ee9c4110f
  e31ddafc57e32550e4c7a837011578f27e7c6817796e9c34e330ba828c709169
)
ASSEMBLED=/tmp/ort.whl
LEDGER=/tmp/ort.parts
SITE=/tmp/site
PY=${PYTHON:-python3}

die() { echo "gpu_setup: $*" >&2; exit 1; }

append_part() {
  local n=$1 src=".gpu/c$1/part$1"
  [[ $n =~ ^[0-4]$ ]] || die "part number must be 0..4, not '$n'"
  [[ -f $src ]] || die "$src is missing: carry .gpu/c$n in this run call"
  local sum
  sum=$(sha256sum "$src" | cut -d' ' -f1)
  [[ $sum == "${PART_SHA256[$n]}" ]] || die "$src is corrupt (sha256 $sum)"
  if [[ $n == 0 ]]; then
    : > "$ASSEMBLED"; : > "$LEDGER"
  else
    local last
    last=$(tail -n 1 "$LEDGER" 2>/dev/null || true)
    [[ $last == $((n - 1)) ]] || die "part $n needs part $((n - 1)) first (have: '${last:-none}'; the machine may have been given back, start again at part 0)"
  fi
  cat "$src" >> "$ASSEMBLED"
  echo "$n" >> "$LEDGER"
  echo "gpu_setup: appended part $n; $ASSEMBLED is $(stat -c %s "$ASSEMBLED") of $WHEEL_SIZE bytes"
}

missing_deps() {  # wheels in .gpu/deps whose distribution the machine's python lacks
  [[ -d .gpu/deps ]] || return 0
  local whl dist
  for whl in .gpu/deps/*.whl; do
    dist=$(basename "$whl" | cut -d- -f1)
    if [[ ${FORCE_DEPS:-0} == 1 ]] || ! "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
      echo "$whl"
    fi
  done
}

install() {
  [[ -f $ASSEMBLED ]] || die "$ASSEMBLED is missing: run 'part 0' .. 'part 4' first"
  local size sum
  size=$(stat -c %s "$ASSEMBLED")
  [[ $size == "$WHEEL_SIZE" ]] || die "$ASSEMBLED has $size bytes, expected $WHEEL_SIZE (parts missing?)"
  sum=$(sha256sum "$ASSEMBLED" | cut -d' ' -f1)
  [[ $sum == "$WHEEL_SHA256" ]] || die "$ASSEMBLED sha256 $sum != $WHEEL_SHA256"
  cp "$ASSEMBLED" "/tmp/$WHEEL_NAME"  # pip needs the real wheel file name
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "/tmp/$WHEEL_NAME"
  local deps
  deps=$(missing_deps)
  if [[ -n $deps ]]; then
    echo "gpu_setup: installing missing dependencies:" $deps
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" $deps
  elif [[ ! -d .gpu/deps ]]; then
    echo "gpu_setup: .gpu/deps not carried; assuming the image's packages (see the header)"
  fi
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
  part) append_part "${2:?usage: gpu_setup.sh part N}" ;;
  install) install ;;
  check) check ;;
  all) for n in 0 1 2 3 4; do append_part "$n"; done; install ;;
  *) die "usage: bash benchmarks/gpu_setup.sh part N | install | check | all" ;;
esac
