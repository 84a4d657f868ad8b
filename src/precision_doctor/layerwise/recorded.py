"""Layerwise comparison from recorded tensors, and the emulator cross-check beside it.

A recording made with ``--trt-outputs mark all`` (or ``--onnx-outputs mark all``) holds the
engine's intermediate tensors. Those whose names are ONNX tensors of the diagnosed model are
compared with the FP32 reference computed here (ONNX Runtime CPU, same inputs), streamed in
chunks of marked outputs as in ``layerwise.compare``. In the same pass the emulator runs the
cross-check plan on the same tensors, so every row shows recorded and emulated error side by
side: where the engine is much worse than a faithful emulation of the requested precision, it
did not compute what was asked (e.g. a fused region that ran in lower precision).

ONNX tensors the recording lacks are named with a reason: ``not marked`` (the recording holds
only the graph outputs), ``renamed`` (a recorded name contains the ONNX name, as converters'
and engines' Cast/reformat tensors do), ``fused away`` (the engine exposed no such tensor:
folded by the parser or fused by the builder), or ``shape differs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from precision_doctor.formats import FORMATS, Precision
from precision_doctor.graph.outputs import (
    chunk_sites,
    float_activations,
    mark_outputs,
    producer_inputs,
)
from precision_doctor.jsonable import json_float
from precision_doctor.layerwise import fused
from precision_doctor.layerwise.compare import (
    LayerRecord,
    LayerwiseResult,
    _Accumulator,
    compared_pairs,
)
from precision_doctor.layerwise.gain import nonfinite_birth
from precision_doctor.runners.base import Runner

RunnerFactory = Callable[[onnx.ModelProto], Runner]
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RecordedLayerwise:
    """Reference vs recording (and vs the emulator) on the recorded ONNX tensors.

    Attributes:
        recorded: Reference vs recording, one record per matched tensor, topological order.
        emulated: Reference vs emulator on the same tensors (None without a cross-check plan).
        missing: ONNX tensor -> why the recording has no comparable value.
        unmatched: Recorded names that are no ONNX tensor of the model (engine/converter names).
    """

    recorded: LayerwiseResult
    emulated: LayerwiseResult | None
    missing: Mapping[str, str]
    unmatched: tuple[str, ...]


def compare_recorded(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]],
                     iterations: Sequence[Mapping[str, np.ndarray]],
                     make_reference: RunnerFactory, make_emulator: RunnerFactory | None,
                     target: Precision, threshold: float, budget_bytes: int = 1 << 30,
                     tensors: Sequence[str] | None = None, progress: Progress | None = None
                     ) -> RecordedLayerwise:
    """Compare every recorded ONNX tensor with the reference (and the emulator).

    Args:
        model: The FP32 model the reference runs (tensor names as in the recording).
        samples: Feed dicts, sample i matching ``iterations[i]``.
        iterations: Recorded tensors per sample (any float dtype; compared in float32 when
            it holds both, e.g. an FP16 recording, else in float64).
        make_reference / make_emulator: Runner for a model with marked outputs.
        target: Format whose range is checked (FP16 max 65504).
        threshold: rel_l2 above which a tensor counts as diverged.
        budget_bytes: Bytes of marked outputs per chunk (both runners, one sample).
        tensors: Restrict to these names (e.g. the graph outputs only).
        progress: ``progress(done_runs, total_runs)``.

    Returns:
        ``RecordedLayerwise``.

    Raises:
        BackendError: A runner fails.
    """
    shapes = {k: v.shape for k, v in samples[0].items()} if samples else {}
    sites = float_activations(model, shapes)
    if tensors is not None:
        wanted = set(tensors)
        sites = [s for s in sites if s.name in wanted]
    recorded_names = dict.fromkeys(n for it in iterations for n in it)
    site_names = {s.name for s in sites}
    all_onnx = {o for n in model.graph.node for o in n.output} | {
        i.name for i in model.graph.input}
    unmatched = tuple(n for n in recorded_names if n not in all_onnx)
    outputs = {o.name for o in model.graph.output}
    marked = any(n in site_names and n not in outputs for n in recorded_names)
    missing = {s.name: _why_missing(s.name, marked, unmatched) for s in sites
               if s.name not in recorded_names}
    sites = [s for s in sites if s.name in recorded_names]
    fmt = FORMATS[target]
    rec_acc = {s.name: _Accumulator(s) for s in sites}
    emu_acc = {s.name: _Accumulator(s) for s in sites}
    chunks = chunk_sites(sites, budget_bytes // 2)
    total, done = len(chunks) * max(len(samples), 1), 0
    # ``_Accumulator.add``'s format limits, scratch and kernel choice (two comparisons of
    # every pair: recorded and emulated)
    fold_args = (fmt.max, fmt.min_subnormal, fmt.min_normal, None,
                 fused.worth_loading(2 * compared_pairs(sites, len(samples))))
    for chunk in chunks:
        names = [s.name for s in chunk]
        marked_model = mark_outputs(model, names)
        emulator = make_emulator(marked_model) if make_emulator else None
        with make_reference(marked_model) as ref_runner:
            if emulator is not None:
                emulator.__enter__()
            try:
                for feeds, it in zip(samples, iterations):
                    ref_out = ref_runner.run(feeds)
                    emu_out = emulator.run(feeds) if emulator is not None else {}
                    for n in names:
                        if n not in ref_out or n in missing:
                            continue
                        got = _as_shape(np.asarray(it[n]), ref_out[n].shape)
                        if got is None:
                            missing[n] = (f"shape differs (recorded {list(it[n].shape)}, "
                                          f"reference {list(ref_out[n].shape)})")
                            continue
                        rec_acc[n].add(ref_out[n], got, *fold_args)
                        if n in emu_out:
                            emu_acc[n].add(ref_out[n], emu_out[n], *fold_args)
                    done += 1
                    if progress:
                        progress(done, total)
            finally:
                if emulator is not None:
                    emulator.__exit__(None, None, None)
    kept = [s for s in sites if s.name not in missing]
    rec = _result(model, [rec_acc[s.name].record(fmt.max) for s in kept], target, threshold,
                  len(chunks), missing)
    emu = _result(model, [emu_acc[s.name].record(fmt.max) for s in kept], target, threshold,
                  len(chunks), missing) if make_emulator else None
    return RecordedLayerwise(rec, emu, dict(sorted(missing.items())), unmatched)


def _why_missing(name: str, marked: bool, unmatched: Sequence[str]) -> str:
    if not marked:
        return ("not marked (the recording holds the graph outputs only: record with "
                "--trt-outputs mark all / --onnx-outputs mark all)")
    renamed = [u for u in unmatched if name in u]
    if renamed:
        return f"renamed (recorded as {renamed[0]!r})"
    return "fused away (the engine exposed no tensor of this name)"


def _as_shape(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``arr`` in the reference's shape (same elements, e.g. squeezed dims), else None."""
    if arr.shape == tuple(shape):
        return arr
    return arr.reshape(shape) if arr.size == math.prod(shape) else None


def _result(model: onnx.ModelProto, records: list[LayerRecord], target: Precision,
            threshold: float, chunks: int, missing: Mapping[str, str]) -> LayerwiseResult:
    first = next((r.tensor for r in records if r.rel_l2 > threshold), None)
    born = nonfinite_birth(records, producer_inputs(model))
    birth = born.tensor if born is not None else None
    return LayerwiseResult(target.value, threshold, tuple(records), first, birth, chunks,
                           tuple(sorted(missing)))


def cross_check_table(result: RecordedLayerwise, output_errors: Mapping[str, float],
                      limit: int = 400) -> dict:
    """The emulated-vs-recorded side-by-side, JSON-ready.

    Args:
        result: From ``compare_recorded`` (with an emulator).
        output_errors: Recorded relative L2 error per graph output (from the output metrics).
        limit: At most this many layer rows (topological order), to bound the report.

    Returns:
        ``{"outputs": [{"name", "recorded_rel_l2", "emulated_rel_l2", "ratio"}], "layers":
        [{"tensor", "node", "op_type", "recorded_rel_l2", "emulated_rel_l2", "ratio"}],
        "worse_than_emulated": [tensor, ...]}``; ratio = recorded / emulated (None when the
        emulated error is 0). ``worse_than_emulated`` lists tensors whose recorded error
        exceeds 4x the emulated one and the divergence threshold (4x = two extra bits lost,
        more than rounding-order differences between two faithful FP16 computations).
    """
    emu = {r.tensor: r for r in result.emulated.records} if result.emulated else {}

    def row(rec: float, em: float | None) -> dict:
        ratio = rec / em if em else None
        return {"recorded_rel_l2": _num(rec), "emulated_rel_l2": _num(em),
                "ratio": _num(ratio)}

    outputs = [{"name": n, **row(e, emu[n].rel_l2 if n in emu else None)}
               for n, e in output_errors.items()]
    layers: list[dict] = []
    worse: list[str] = []
    for r in result.recorded.records:
        e = emu.get(r.tensor)
        entry = {"tensor": r.tensor, "node": r.node, "op_type": r.op_type,
                 **row(r.rel_l2, e.rel_l2 if e else None)}
        if e is not None and r.rel_l2 > result.recorded.threshold and (
                e.rel_l2 == 0 or r.rel_l2 > 4 * e.rel_l2):
            worse.append(r.tensor)
        if len(layers) < limit:
            layers.append(entry)
    return {"outputs": outputs, "layers": layers, "worse_than_emulated": worse}


def _num(x: float | None) -> float | str | None:
    return None if x is None else json_float(x)
