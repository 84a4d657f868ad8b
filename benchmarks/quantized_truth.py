"""What `diagnose` and `fix --target fp16` say on the dynamically quantized encoders.

``onnxruntime.quantization.quantize_dynamic`` writes MatMulInteger + DynamicQuantizeLinear; the
int32 accumulators are Cast to float, where FP16 overflows. The models are the ones
``benchmarks/quantize_zoo.py`` writes into ``.models/quantized/`` (PP-OCRv4 rec from the
``rapidocr_onnxruntime`` wheel or ``../shared``, quantized on its MatMuls, 3 real crops;
all-MiniLM-L6-v2 and the Whisper tiny.en encoder, opset 17, after
``benchmarks/export_minilm.py`` / ``export_whisper.py``: one batch of 8 sentences, one 30 s clip).

Usage (CPU)::

    python -m benchmarks run quantize_zoo            # once: .models/quantized/*.onnx
    python -m benchmarks run quantized_truth [--models rec,minilm17,whisper17]

Prints, per model: the verdict and assessment, the share the findings' cures explain (jointly),
the joint cause's size and the causes found by unmasking, ``fix``'s outcome (passed, FP32
nodes, score) and wall times; writes ``results/quantized_truth_<date>_<machine>.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import common

REPO = Path(__file__).resolve().parents[1]


def _cases(names: list[str], folder: Path) -> list:
    sys.path.insert(0, str(REPO / "tests"))
    import real_quantized

    out = []
    for name in names:
        make = {"rec": real_quantized.quantized_rec, "minilm17": real_quantized.quantized_minilm,
                "whisper17": real_quantized.quantized_whisper}[name]
        try:
            out.append(make(folder))
        except BaseException as exc:  # pytest.skip: the model is not prepared here
            print(f"{name}: skipped ({exc})")
    return out


def measure(case) -> dict:
    import precision_doctor as pd

    t0 = time.perf_counter()
    d = pd.diagnose(str(case.path), case.samples, target="fp16", noise=False, quiet=True)
    diag_s = time.perf_counter() - t0
    joint = d.joint_cause or {}
    row = {"model": case.name, "verdict": d.verdict,
           "assessment": d.assessment.kind if d.assessment else None,
           "explained_share": d.explained_share,
           "joint_members": len(joint.get("members", ())),
           "unmasked": sum(1 for f in d.findings if f.evidence.get("found_by") == "unmasking"),
           "causes": [f"{f.kind} {f.op_type} {f.node}" for f in d.findings if f.group == "main"],
           "diagnose_s": round(diag_s, 1)}
    t0 = time.perf_counter()
    try:
        f = pd.fix(str(case.path), case.samples, target="fp16", quiet=True)
        row.update(fix_passed=f.passed, fp32_nodes=len(f.fp32_nodes),
                   compute_nodes=f.report["fp32_share"]["compute_nodes"],
                   score_after=f.report["score_after"]["value"])
    except pd.PrecisionDoctorError as exc:
        row.update(fix_passed=False, fix_error=str(exc).splitlines()[0])
    row["fix_s"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="rec,minilm17,whisper17")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    common.ensure_src_on_path()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in _cases(args.models.split(","), Path(tmp)):
            row = measure(case)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "causes"}, flush=True)
    path = common.write_results(args.out or common.results_path("quantized_truth"),
                                {"command": " ".join(sys.argv), "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
