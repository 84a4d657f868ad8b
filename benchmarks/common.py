"""What every benchmark script shares: the machine and versions a figure was measured with,
a child process's wall/CPU time and peak RSS, and the results file that records them.

A results file is ``benchmarks/results/<name>_<YYYY-MM-DD>_<machine>.json``, where ``machine``
is a short tag (``cpu2`` for a 2-core CPU machine, ``h100``, ``2xh200``...): the date and the
hardware of a table are in the name of the file it cites. The file holds ``{"date", "machine",
"versions", "load_average", ...}`` followed by the script's own fields.

Usage inside a script (run directly or through ``python -m benchmarks run NAME``)::

    from common import measure_process, results_path, write_results  # noqa: E402

    info = measure_process([sys.executable, "-c", "..."])  # {"wall_s", "cpu_s", "peak_rss_mb"}
    write_results(results_path("layerwise"), {"rows": rows})
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

# the packages whose versions change a figure; absent ones are left out of the record
PACKAGES = ("precision-doctor", "onnx", "onnxruntime", "onnxruntime-gpu", "numpy", "onnx-ir",
            "polygraphy", "onnxconverter-common", "nvidia-modelopt", "torch")


def ensure_src_on_path() -> None:
    """Put the repository's ``src`` and ``benchmarks`` folders first on ``sys.path``, so a
    script measures this checkout's package and finds its sibling modules."""
    for folder in (REPO / "benchmarks", REPO / "src"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``packages`` (and Python), skipping those not installed.

    Returns:
        ``{"python": "3.11.7", "onnx": "1.23.2", ...}``.
    """
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs ``nvidia-smi`` lists (empty without one or without the tool)."""
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine_tag() -> str:
    """A short name of this machine for results file names: ``h100``, ``2xh200``, ``cpu2``."""
    gpus = gpu_names()
    if gpus:
        kinds = ("h200", "h100", "a100", "l4", "t4")
        model = next((m for m in kinds if m in gpus[0].lower()), "gpu")
        return model if len(gpus) == 1 else f"{len(gpus)}x{model}"
    return f"cpu{os.cpu_count()}"


def machine() -> dict[str, object]:
    """What a figure was measured on: CPU model and count, memory, GPUs, load average.

    Returns:
        ``{"tag", "cpu", "cpus", "memory_gib", "gpus", "load_average"}``; ``cpu`` is read from
        ``/proc/cpuinfo`` where ``platform.processor()`` is empty (Linux).
    """
    cpu = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if not cpu and cpuinfo.exists():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                    if line.startswith("model name")), "")
    memory = None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split("MemTotal:", 1)[1].split()[0])
        memory = round(kib / 2**20, 1)
    return {"tag": machine_tag(), "cpu": cpu or platform.machine(), "cpus": os.cpu_count(),
            "memory_gib": memory, "gpus": gpu_names(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}


def measure_process(cmd: Sequence[str], env: Mapping[str, str] | None = None,
                    timeout: float | None = None, log: Path | None = None) -> dict[str, Any]:
    """Run ``cmd`` as a fresh process and measure it (``os.wait4``: that process alone).

    Args:
        cmd: the command line.
        env: its environment (default: this one's).
        timeout: seconds after which its process group is killed (``None``: no limit).
        log: a file for its stdout and stderr (default: this process's).

    Returns:
        ``{"returncode", "wall_s", "cpu_s", "peak_rss_mb", "timed_out"}``; ``cpu_s`` is user +
        system time, ``peak_rss_mb`` the process's ``ru_maxrss`` in MB (interpreter start and
        imports included); ``returncode`` is negative for a signal.
    """
    out = open(log, "w") if log is not None else None  # noqa: SIM115 - closed below
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), env=dict(env) if env is not None else None,
                                stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=timeout is not None)
        timed_out = False
        while True:  # os.wait4, not proc.wait: the rusage of this child alone
            pid, status, usage = os.wait4(proc.pid, 0 if timeout is None else os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:  # type: ignore[operator]
                os.killpg(proc.pid, signal.SIGKILL)
                timed_out = True
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.1)
        wall = time.perf_counter() - start
    finally:
        if out is not None:
            out.close()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4
    return {"returncode": proc.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "timed_out": timed_out}


def results_path(name: str, folder: Path = RESULTS, suffix: str = "") -> Path:
    """``folder/<name>_<today>_<machine tag><suffix>.json``: date and hardware in the name."""
    return folder / f"{name}_{datetime.date.today()}_{machine_tag()}{suffix}.json"


def _plain(value: object) -> object:
    """numpy scalars and arrays as Python numbers and lists; anything else as its text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def write_results(path: Path, payload: Mapping[str, object]) -> Path:
    """Write ``payload`` to ``path`` as JSON, after the date, the machine and the versions.

    Returns:
        ``path`` (its folder is created if missing).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "versions": versions(), **payload}
    path.write_text(json.dumps(record, indent=1, default=_plain) + "\n")
    return path


def save_probe(name: str, argv: Sequence[str] | None, results: object) -> Path:
    """A probe's ``--save``: ``results`` with the command that made them (``argv``, or the
    process's arguments) to ``results_path("name")``; prints and returns the path."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = " ".join([f"python -m benchmarks run probes/{name}", *args])
    path = write_results(results_path(name), {"command": command, "results": results})
    print("wrote", path)
    return path
