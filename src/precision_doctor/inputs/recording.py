"""Engine results recorded elsewhere (e.g. on a TensorRT machine), loaded as a candidate.

Three formats, one sample per iteration, matched to the ``--data`` samples in order:

- Polygraphy ``run --save-outputs`` JSON (``RunResults``: ``{"lst": [[runner, [IterationResult,
  ...]], ...]}``), or a folder of per-iteration files (Polygraphy >= 0.50 streams there). Read
  with Polygraphy's own loader (``polygraphy.comparator.RunResults.load`` /
  ``load_streaming``) when Polygraphy is installed, else with
  ``precision_doctor.inputs.polygraphy.load_polygraphy_outputs`` (same format, no import). A file
  made with ``--trt-outputs mark all`` / ``--onnx-outputs mark all`` also holds the intermediate
  tensors; ``file.json:RUNNER`` picks one runner (exact name or unique prefix) when it holds
  several.
- trtexec ``--exportOutput`` JSON: ``[{"name", "dimensions": "1x3x4", "values": [...]}, ...]``
  (format of ``trtexec``'s ``dumpOutputs``/``exportJSONOutput`` in TensorRT's
  ``samples/common/sampleInference.cpp``); one file per run, so a folder or glob of them is
  one sample per file, in sorted name order.
- ``.npz`` per sample (output name -> array): one file, a folder, or a glob.

None of these formats stores the TensorRT version; it is taken from a build log when one is
given (``audit.buildlog``), else reported as unknown.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from precision_doctor.errors import DataFormatError, InputError
from precision_doctor.inputs.polygraphy import load_polygraphy_outputs

Arrays = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Recording:
    """Outputs an engine computed elsewhere, one dict per iteration (= per sample).

    Attributes:
        source: The file/folder/glob read.
        format: ``polygraphy``, ``trtexec`` or ``npz``.
        runner: Runner name (Polygraphy's, e.g. ``trt-runner-N0-08/24/23-07:55:24``; else the
            format).
        iterations: Tensor name -> array (dtype as recorded), one dict per iteration.
        iteration_names: File name of each iteration (trtexec/npz), for matching; else empty.
        runners_in_file: Every runner the file holds (Polygraphy).
        tensorrt_version: TensorRT version when known (from a build log), else None.
        settings: Build settings from the engine's log (``gpu``, ``fp16``, ``tf32``,
            ``strongly_typed``; ``audit.buildlog``), empty when no log was given.
        notes: What the loader decided (runner chosen, iterations dropped), for the report.
    """

    source: str
    format: str
    runner: str
    iterations: tuple[Arrays, ...]
    iteration_names: tuple[str, ...] = ()
    runners_in_file: tuple[str, ...] = ()
    tensorrt_version: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def engine(self) -> str:
        """``TensorRT``, ``ONNX Runtime``, ``PyTorch torch.autocast`` or ``unknown``, from
        Polygraphy's runner-name prefix (``trt-runner``/``onnxrt-runner``:
        ``polygraphy/backend/*/runner.py``) or the format."""
        if self.format == "trtexec" or self.runner.startswith("trt-runner"):
            return "TensorRT"
        if self.runner.startswith("onnxrt-runner"):
            return "ONNX Runtime"
        if self.format == "autocast":  # api.autocast.autocast_recording
            return "PyTorch torch.autocast"
        return "unknown"

    def tensor_names(self) -> list[str]:
        """Every recorded tensor name, in first-seen order."""
        seen: dict[str, None] = {}
        for it in self.iterations:
            seen.update(dict.fromkeys(it))
        return list(seen)

    def describe(self) -> dict:
        """JSON-ready summary: source, runner, version, and dtype/shape of every tensor of the
        first iteration."""
        first = self.iterations[0] if self.iterations else {}
        return {"source": self.source, "format": self.format, "runner": self.runner,
                "engine": self.engine, "runners_in_file": list(self.runners_in_file),
                "tensorrt_version": self.tensorrt_version, "settings": dict(self.settings),
                "iterations": len(self.iterations),
                "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape)}
                            for k, v in first.items()},
                "notes": list(self.notes)}


def split_runner(spec: str | os.PathLike) -> tuple[str, str | None]:
    """``file.json:RUNNER`` -> (``file.json``, ``RUNNER``). Runner names may hold ``:`` and
    ``/`` (Polygraphy puts a timestamp in them), so the split is at the first ``:`` whose left
    part is an existing path."""
    text = os.fspath(spec)
    if Path(text).exists() or set("*?[") & set(text):
        return text, None
    for i, ch in enumerate(text):
        if ch == ":" and i > 0 and Path(text[:i]).exists():
            return text[:i], text[i + 1:] or None
    return text, None


def load_recording(spec: str | os.PathLike, tensorrt_version: str | None = None,
                   settings: Mapping[str, Any] | None = None) -> Recording:
    """Load recorded engine results (see the module docstring for the formats).

    Args:
        spec: A file, folder or glob; ``file.json:RUNNER`` picks a Polygraphy runner.
        tensorrt_version: Version to record (e.g. from the build log).
        settings: Build settings to record (from the build log).

    Returns:
        The ``Recording``.

    Raises:
        InputError: Nothing at ``spec``.
        DataFormatError: Unknown format, unreadable file, runner not found or ambiguous.
    """
    path_text, runner = split_runner(spec)
    files = _files(path_text)
    suffixes = {f.suffix.lower() for f in files}
    if len(files) == 1 and suffixes - {".npz"}:
        suffixes = {".json"}  # any name (e.g. Polygraphy's own samples save to *.log): sniffed
    if suffixes == {".npz"}:
        rec = _from_npz(path_text, files)
    elif suffixes == {".json"}:
        first = _read_json(files[0])
        if isinstance(first, Mapping) and "lst" in first:
            rec = _from_polygraphy(path_text, runner)
        elif isinstance(first, list) and all(isinstance(e, Mapping) and "dimensions" in e
                                             for e in first):
            rec = _from_trtexec(path_text, files)
        else:
            raise DataFormatError(
                f"{files[0]}: neither Polygraphy --save-outputs JSON ({{\"lst\": ...}}) nor "
                "trtexec --exportOutput JSON ([{\"name\", \"dimensions\", \"values\"}])",
                file=str(files[0]))
    else:
        raise DataFormatError(f"{path_text}: recorded results must be .json (Polygraphy or "
                              f"trtexec) or .npz files, found {sorted(suffixes)}", file=path_text)
    if runner is not None and rec.format != "polygraphy":
        raise DataFormatError(f"{spec}: ':RUNNER' selects a runner of a Polygraphy file only",
                              file=path_text)
    if not rec.iterations:
        raise DataFormatError(f"{path_text}: the recording holds no iterations", file=path_text)
    if tensorrt_version or settings:
        rec = replace(rec, tensorrt_version=tensorrt_version, settings=dict(settings or {}))
    return rec


def _files(text: str) -> list[Path]:
    path = Path(text)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in (".json",
                                                                                     ".npz")]
    elif set("*?[") & set(text):
        found = [Path(p) for p in glob.glob(text) if Path(p).is_file()]
    else:
        raise InputError(f"recorded results not found: {text}", file=text)
    if not found:
        raise DataFormatError(f"{text}: no .json or .npz files", file=text)
    return sorted(found, key=lambda p: p.name)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: not valid JSON ({exc})", file=str(path)) from exc


def _polygraphy_runs(path: str) -> list[tuple[str, list[dict[str, np.ndarray]]]]:
    """Runner name -> iterations, through Polygraphy's ``RunResults`` when it is installed."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its import-time logger notices
            from polygraphy.comparator import RunResults
            from polygraphy.exception import PolygraphyException
            from polygraphy.logger import G_LOGGER
    except ImportError:
        return list(load_polygraphy_outputs(path).items()) if Path(path).is_file() else \
            _own_dir(path)
    try:
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL), contextlib.redirect_stdout(io.StringIO()):
            if Path(path).is_dir():
                results = RunResults.concat(RunResults.load_streaming(path))
            else:
                results = RunResults.load(path)
            runs = [(str(name), [{k: np.asarray(it[k]) for k in it.keys()} for it in iters])
                    for name, iters in results.items()]
    except (PolygraphyException, KeyError, TypeError, ValueError) as exc:
        raise DataFormatError(f"{path}: Polygraphy could not read it as RunResults ({exc})",
                              file=path) from exc
    return runs


def _own_dir(path: str) -> list[tuple[str, list[dict[str, np.ndarray]]]]:
    merged: dict[str, list[dict[str, np.ndarray]]] = {}
    for f in _files(path):
        for name, iters in load_polygraphy_outputs(f).items():
            merged.setdefault(name, []).extend(iters)
    return list(merged.items())


def _from_polygraphy(path: str, runner: str | None) -> Recording:
    runs = _polygraphy_runs(path)
    names = tuple(name for name, _ in runs)
    if not runs:
        raise DataFormatError(f"{path}: the RunResults hold no runner", file=path)
    notes: list[str] = []
    if runner is None:
        if len(runs) > 1:
            raise DataFormatError(
                f"{path} holds {len(runs)} runners ({', '.join(names)}); pick one with "
                f"'{path}:RUNNER' (a name or unique prefix, e.g. '{path}:trt-runner')", file=path)
        chosen = runs[0]
    else:
        exact = [r for r in runs if r[0] == runner]
        prefixed = [r for r in runs if r[0].startswith(runner)]
        matches = exact or prefixed
        if len(matches) != 1:
            what = "matches no runner" if not matches else "matches several runners"
            raise DataFormatError(f"{path}: {runner!r} {what}; runners in the file: "
                                  f"{', '.join(names)}", file=path)
        chosen = matches[0]
        if len(runs) > 1:
            notes.append(f"runner {chosen[0]!r} chosen of {len(runs)}")
    return Recording(path, "polygraphy", chosen[0], tuple(chosen[1]), (), names,
                     notes=tuple(notes))


def _from_trtexec(path: str, files: Sequence[Path]) -> Recording:
    iterations = []
    for f in files:
        data = _read_json(f)
        if not isinstance(data, list):
            raise DataFormatError(f"{f}: expected trtexec --exportOutput JSON (a list)",
                                  file=str(f))
        arrays = {}
        for i, entry in enumerate(data):
            try:
                dims_text = str(entry["dimensions"]).strip()
                dims = [int(d) for d in dims_text.split("x")] if dims_text else []
                values = np.asarray(entry["values"], dtype=np.float64)
                arrays[str(entry["name"])] = values.reshape(dims).astype(np.float32)
            except (KeyError, ValueError, TypeError) as exc:
                raise DataFormatError(f"{f}: entry {i} is not {{name, dimensions, values}} "
                                      f"with values matching the dimensions ({exc})",
                                      file=str(f)) from exc
        iterations.append(arrays)
    return Recording(path, "trtexec", "trtexec", tuple(iterations),
                     tuple(f.name for f in files))


def _from_npz(path: str, files: Sequence[Path]) -> Recording:
    from precision_doctor.inputs.arrays import read_npz

    return Recording(path, "npz", "npz", tuple(read_npz(f) for f in files),
                     tuple(f.name for f in files))


def match_samples(recording: Recording, sample_names: Sequence[str]) -> Recording:
    """The recording with one iteration per sample, in sample order.

    Files of a folder (trtexec, npz) are matched by stem when every sample has a file of the
    same stem (``img1.npz`` <-> ``img1.json``); otherwise iterations are taken in order. Extra
    iterations are dropped, with a note.

    Raises:
        InputError: Fewer iterations than samples.
    """
    n_it, n_s = len(recording.iterations), len(sample_names)
    stems = {Path(n).stem: i for i, n in enumerate(recording.iteration_names)}
    wanted = [Path(s).stem for s in sample_names]
    notes = list(recording.notes)
    if recording.iteration_names and all(w in stems for w in wanted) and n_s > 1:
        iterations = tuple(recording.iterations[stems[w]] for w in wanted)
        notes.append("iterations matched to samples by file name")
    else:
        if n_it < n_s:
            raise InputError(
                f"{recording.source} holds {n_it} iteration(s) but --data gives {n_s} "
                "sample(s): record on exactly these inputs (polygraphy run ... --load-inputs "
                "INPUTS.json --save-outputs ...) or pass --max-samples", file=recording.source)
        iterations = recording.iterations[:n_s]
        if n_it > n_s:
            notes.append(f"used the first {n_s} of {n_it} recorded iterations")
    return replace(recording, iterations=iterations, notes=tuple(notes))
