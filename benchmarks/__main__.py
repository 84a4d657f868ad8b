"""One entry point for the benchmark scripts that back ``BENCHMARKS.md``.

Usage (repository root)::

    python -m benchmarks list                 # the benchmarks, their section, CPU or GPU
    python -m benchmarks run NAME [args...]   # run benchmarks/NAME.py with these arguments
    python -m benchmarks run probes/NAME ...  # a one-off probe (benchmarks/probes/README.md)

``run`` executes the script as ``__main__`` with this checkout's ``src`` and ``benchmarks``
folders first on ``sys.path`` (so the package measured is this checkout's and a script finds
its sibling modules); the script's own ``--help`` lists its arguments. Exit status: the
script's; 2 for an unknown name.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (BENCHMARKS.md section, where it runs, what it measures)
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "layerwise": ("Layerwise comparison vs Polygraphy", "CPU",
                  "diagnose's layerwise pass vs its plain runs and Polygraphy mark-all"),
    "search": ("fix vs ModelOpt AutoCast", "CPU",
               "fix vs onnxconverter-common and ModelOpt AutoCast on det, rec, Whisper"),
    "search_regions": ("fix vs ModelOpt AutoCast", "CPU",
                       "region-first vs node-first search vs AutoCast on the diffusion UNet"),
    "ocr_end_to_end": ("fix vs ModelOpt AutoCast", "CPU",
                       "the RapidOCR client with a det model fix wrote"),
    "zoo": ("Real-model zoo", "CPU", "the zoo's models and real inputs, into .models/zoo"),
    "zoo_baseline": ("Real-model zoo", "CPU", "diagnose FP16/BF16 and fix on the zoo (CLI)"),
    "real_fp16": ("Real-model zoo", "GPU", "the zoo on real FP16 kernels (ONNX Runtime CUDA)"),
    "transformer_headroom": ("Real-model zoo", "CPU",
                             "FP16 headroom and stress factor of transformers"),
    "gpu_fidelity": ("Emulator vs real engines", "GPU",
                     "emulated vs ONNX Runtime CUDA error, FP16/BF16/TF32, per layer"),
    "gpu_transformers": ("Emulator vs real engines", "GPU",
                         "the same on Whisper and rec, with Whisper's latency"),
    "speed": ("Emulator vs real engines", "GPU", "latency of FP32/TF32/FP16/mixed models"),
    "fp16_verifiers": ("Emulator vs real engines", "CPU",
                       "ONNX Runtime CPU vs exact emulation of a written FP16 model"),
    "gpu_pipeline": ("GPU vs CPU", "GPU", "diagnose and fix with --device cuda vs cpu"),
    "bigmodel_gpu": ("GPU vs CPU", "GPU",
                     "diagnose and fix on BERT-large (335M, external data), cuda vs cpu"),
    "bf16_gpu": ("BF16", "CPU+GPU", "fix --target bf16 written models on ONNX Runtime CUDA"),
    "ort_cuda_bf16": ("BF16", "GPU", "which op types ONNX Runtime CUDA lacks BF16 kernels for"),
    "detectors": ("Detectors", "CPU", "fix with box/COCO mAP targets vs ModelOpt AutoCast"),
    "bigmodel": ("Models over 2 GiB", "CPU", "diagnose and fix on a 2.25 GiB external-data model"),
    "search_cost": ("Search and diagnosis cost", "CPU",
                    "fix vs one plain FP32 pass, incremental evaluation off and on"),
    "diagnose_cost": ("Search and diagnosis cost", "CPU",
                      "diagnose wall time, this tree vs another, alternating"),
    "quantize_zoo": ("Real-model zoo", "CPU",
                     "quantize_dynamic on MiniLM, Whisper and rec, into .models/quantized"),
    "quantized_truth": ("Real-model zoo", "CPU",
                        "diagnose and fix in FP16 on the dynamically quantized encoders"),
    "quantized_fp16_gpu": ("Real-model zoo", "GPU",
                           "the quantized encoders converted to FP16 on ONNX Runtime CUDA"),
    "fp8_gemm_gpu": ("Emulator vs real engines", "CPU+GPU",
                     "FP8 Q/DQ emulation vs real H100 FP8 GEMMs (torch._scaled_mm), per layer"),
    "quant_zoo": ("INT8/FP8 quantization", "CPU",
                  "diagnose --target int8|fp8 on the zoo: verdict, SQNR, causes and cures"),
    "quant_anchors": ("INT8/FP8 quantization", "CPU",
                      "fix --target int8|fp8 vs ORT quantize_static and ModelOpt ONNX PTQ"),
    "calibration_memory": ("INT8/FP8 quantization", "CPU",
                           "peak RSS of INT8 calibration on 64 vs 1024 images (streamed)"),
    "fuzz": ("(tests)", "CPU", "tests/fuzz's graph invariants on many random graphs (--seed)"),
    "export_minilm": ("(setup)", "CPU", "export all-MiniLM-L6-v2 to .models/"),
    "export_whisper": ("(setup)", "CPU", "export the Whisper tiny.en encoder to .models/"),
}
# modules the scripts import, not run on their own
HELPERS = ("common", "gpu_common", "ort_ledger", "transformer_metrics", "zoo_metrics",
           "quant_anchors_protocol", "quant_anchors_runners", "quant_anchors_eval",
           "quant_anchors_table", "quant_anchors_macs", "search_table", "zoo_sources",
           "zoo_inputs", "fp8_gemm_cpu", "ort_cuda_bf16_probes", "bf16_gpu_pack",
           "bigmodel_gpu_build", "gpu_memory", "gpu_pipeline_pack")


def _list() -> int:
    width = max(map(len, BENCHMARKS))
    for name, (section, where, what) in BENCHMARKS.items():
        print(f"{name:<{width}}  {where:<7}  {section}: {what}")
    others = sorted(p.stem for p in HERE.glob("*.py")
                    if p.stem not in BENCHMARKS and p.stem not in HELPERS and p.stem[0] != "_")
    if others:
        print(f"\nother scripts (no BENCHMARKS.md table yet): {', '.join(others)}")
    probes = sorted(p.stem for p in (HERE / "probes").glob("*.py"))
    print(f"\nprobes (benchmarks/probes/README.md): {', '.join('probes/' + p for p in probes)}")
    return 0


def _run(name: str, args: list[str]) -> int:
    script = HERE / f"{name}.py"
    if not script.is_file() or name.startswith(("_", "probes/_")) or ".." in name:
        print(f"unknown benchmark {name!r}: `python -m benchmarks list` names them",
              file=sys.stderr)
        return 2
    for folder in (script.parent, HERE, HERE.parent / "src"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["list"]:
        return _list()
    if argv[:1] == ["run"] and len(argv) >= 2:
        return _run(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
