"""What the report's two plots cost with plain-text log-axis labels (``report.plots``) against
matplotlib's default scientific labels, which are mathtext.

PP-OCRv4 rec is diagnosed in FP16 on 2 crops of ``rec_crops/paddleocr`` (its layerwise
comparison compares 403 tensors) and its layerwise result pickled. Then, alternating
``--repeat`` times, a fresh process renders ``error_vs_depth_svg`` and ``range_svg`` once, as
they are or with the y axis given back matplotlib's default formatters
(``LogFormatterSciNotation``), after one unrelated figure has loaded matplotlib and its fonts.
A fresh process is what a CLI run is: matplotlib caches parsed mathtext within a process, so
plots drawn again in one process pay the parsing once. Printed: median seconds per plot.

Usage (repo root, ``../shared`` present)::

    python -m benchmarks run probes/plots_speed [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"

CHILD = r"""
import json, pickle, sys, time
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatterSciNotation
from precision_doctor.report import plots
layerwise = pickle.load(open(sys.argv[1], "rb"))
fig = Figure(); fig.add_subplot().plot([0, 1]); plots.to_svg(fig, "warm")  # fonts, backend
if sys.argv[2] == "mathtext":
    figure = plots._figure
    def mathtext():
        fig, ax = figure()
        ax.yaxis.set_major_formatter(LogFormatterSciNotation())
        ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False))
        return fig, ax
    plots._figure = mathtext
out = {}
for plot in (plots.error_vs_depth_svg, plots.range_svg):
    t = time.perf_counter()
    plot(layerwise)
    out[plot.__name__] = time.perf_counter() - t
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    import precision_doctor as pd

    d = pd.diagnose(str(SHARED / "models/ppocrv4/rec.onnx"),
                    str(SHARED / "data/ocr/rec_crops/paddleocr"), preprocess="ppocr-rec",
                    max_samples=2, noise=False, quiet=True)
    print(f"{len(d.layerwise.records)} tensors")
    seconds: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "layerwise.pkl"
        path.write_bytes(pickle.dumps(d.layerwise))
        for _ in range(args.repeat):
            for labels in ("plain", "mathtext"):
                out = subprocess.run([sys.executable, "-c", CHILD, str(path), labels],
                                     env={"PYTHONPATH": str(REPO / "src")}, check=True,
                                     capture_output=True, text=True).stdout
                for name, s in json.loads(out.strip().splitlines()[-1]).items():
                    seconds.setdefault((labels, name), []).append(s)
    for (labels, name), values in seconds.items():
        print(f"{name}, {labels} labels: median {statistics.median(values):.3f} s "
              f"({', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
