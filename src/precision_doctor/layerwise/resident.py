"""Layerwise statistics computed where the tensors are: on the GPU, only scalars come back.

On a CUDA device, copying every intermediate tensor of both runs to the host and reducing it there
with numpy is what a layerwise comparison spends its time on (PP-OCRv4 rec, 256 strips: 68 s of
layerwise on an H100, 2026-11-25, ``benchmarks/gpu_pipeline.py``), not the runs. Here the segments
run with ONNX Runtime's I/O binding (``OrtRunner.run_resident``): their outputs stay in GPU memory
as ``OrtValue``s, boundary tensors feed the next segment from there, and each compared (reference,
candidate) pair is reduced on the device by a small ONNX graph (``stats_model``) run in one more
session on the same device. Thirteen float64 numbers per tensor come back.

The graph reduces a tensor in slices of at most ``chunk_elements()`` elements: its
intermediates (masks, differences, float64 copies) take up to 131 bytes per element of what it
is given (counted without buffer reuse), so a whole 500 MB float32 tensor could need 16 GB of
GPU memory beyond the segment budget. Per slice they stay under ``STATS_TEMP_BYTES`` (2M
elements a run); the statistics are sums, counts and maxima, so the slices fold in exactly as
the whole tensor would (up to summation order).

The graph computes exactly the statistics of ``layerwise.stats._Accumulator`` (same element
sets, same definitions): finite means ``|x| < inf`` (NaN compares false), sums are float64
(the numpy path sums float32 within blocks of 2^17 elements and float64 across them, so the two
agree to ~1e-7 relative), counts are float64 sums of 0/1 (exact below 2^53). Tensors that are
not float32 (FP16 or FP64 models) come back to the host and take the numpy path.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from precision_doctor.formats import FloatFormat
from precision_doctor.graph.outputs import TensorSite
from precision_doctor.layerwise.stats import StatsPool
from precision_doctor.runners.ort import OrtRunner

# Order of the graph's output vector (float64[13]).
FIELDS = ("ref_max", "cand_max", "err_max", "err_sum", "err2", "ref2", "nan", "inf",
          "ref_bad", "overflow", "flush", "subnormal", "lost")
_OPSET = 18
# GPU memory of the statistics graph's intermediates in one run (module docstring).
STATS_TEMP_BYTES = 256 << 20
# Ops of the statistics graph whose output is not the size of its input.
_REDUCING = {"ReduceMax", "ReduceSum", "ReduceSumSquare", "Constant", "Reshape", "Concat"}
_BYTES = {TensorProto.FLOAT: 4, TensorProto.DOUBLE: 8, TensorProto.BOOL: 1,
          TensorProto.INT64: 8}


def stats_model(fmt: FloatFormat) -> onnx.ModelProto:
    """The ONNX graph reducing one (reference, candidate) float32 pair to ``FIELDS``.

    Args:
        fmt: The target format: its largest finite value (overflow), smallest subnormal
            (half of it: flush-to-zero, ONNX ``Cast`` rounding) and smallest normal value.

    Returns:
        A model with inputs ``r``, ``c`` (float32, any shape, the same for both), ``lo``,
        ``hi`` (int64[1]: the slice ``[lo, hi)`` of both tensors flattened in C order that is
        reduced) and output ``s`` (float64[13], in ``FIELDS`` order).
    """
    nodes: list[onnx.NodeProto] = []
    flat = helper.make_tensor("flat", TensorProto.INT64, [1], [-1])
    nodes.append(helper.make_node("Constant", [], ["flat_shape"], value=flat))
    for x in ("r", "c"):
        nodes.append(helper.make_node("Reshape", [x, "flat_shape"], [f"{x}_flat"]))
        nodes.append(helper.make_node("Slice", [f"{x}_flat", "lo", "hi"], [f"{x}s"],
                                      name=f"{x}s"))

    def op(kind: str, inputs: Sequence[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(kind, list(inputs), [out], name=out, **attrs))
        return out

    def const(name: str, value: float) -> str:
        return op("Constant", [], name, value=helper.make_tensor(name, TensorProto.FLOAT, [],
                                                                 [value]))

    def count(mask: str) -> str:
        as_f = op("Cast", [mask], f"{mask}_f64", to=TensorProto.DOUBLE)
        return op("ReduceSum", [as_f], f"n_{mask}", keepdims=0)

    def fmax(x: str) -> str:  # ReduceMax of float32, as float64
        m = op("ReduceMax", [x], f"max_{x}", keepdims=0)
        return op("Cast", [m], f"{m}_f64", to=TensorProto.DOUBLE)

    inf, zero = const("inf", float("inf")), const("zero", 0.0)
    top, half_sub = const("fmt_max", fmt.max), const("half_sub", fmt.min_subnormal / 2)
    normal = const("min_normal", fmt.min_normal)
    ar, ac = op("Abs", ["rs"], "ar"), op("Abs", ["cs"], "ac")
    r_ok, c_ok = op("Less", [ar, inf], "r_ok"), op("Less", [ac, inf], "c_ok")
    ok = op("And", [r_ok, c_ok], "ok")
    c_nan = op("Not", [op("Equal", ["cs", "cs"], "c_eq")], "c_nan")
    c_inf = op("Equal", [ac, inf], "c_inf")
    r_bad = op("Not", [r_ok], "r_bad")
    over = op("And", [r_ok, op("Greater", [ar, top], "gt_max")], "over")
    nonzero = op("Greater", [ar, zero], "nonzero")
    below_half = op("Less", [ar, half_sub], "below_half")
    small = op("Less", [ar, normal], "small")
    flush = op("And", [nonzero, below_half], "flush")
    # non-zero too: half a subnormal is 0 in float32 for TF32/FP32
    subnormal = op("And", [op("And", [op("Not", [below_half], "at_least_half"), small],
                              "small_not_flushed"), nonzero], "subnormal")
    lost = op("And", [op("And", [ok, op("And", [small, nonzero], "small_nz")], "ok_small"),
                      op("Equal", ["cs", zero], "c_zero")], "lost")
    d = op("Where", [ok, op("Sub", ["cs", "rs"], "diff"), zero], "d")
    ad = op("Abs", [d], "ad")
    d64 = op("Cast", [d], "d64", to=TensorProto.DOUBLE)
    r64 = op("Cast", [op("Where", [ok, "rs", zero], "r_okv")], "r64", to=TensorProto.DOUBLE)
    ad64 = op("Cast", [ad], "ad64", to=TensorProto.DOUBLE)
    parts = [
        fmax(op("Where", [r_ok, ar, zero], "ar_ok")),
        fmax(op("Where", [ok, ac, zero], "ac_ok")),
        fmax(ad),
        op("ReduceSum", [ad64], "err_sum", keepdims=0),
        op("ReduceSumSquare", [d64], "err2", keepdims=0),
        op("ReduceSumSquare", [r64], "ref2", keepdims=0),
        count(c_nan), count(c_inf), count(r_bad), count(over), count(flush), count(subnormal),
        count(lost),
    ]
    shape = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    nodes.append(helper.make_node("Constant", [], ["shape1"], value=shape))
    vec = [op("Reshape", [p, "shape1"], f"{p}_1") for p in parts]
    op("Concat", vec, "s", axis=0)
    graph = helper.make_graph(
        nodes, "pd_layerwise_stats",
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("lo", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("hi", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("s", TensorProto.DOUBLE, [len(FIELDS)])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)],
                             ir_version=8)


def chunk_elements(model: onnx.ModelProto, temp_bytes: int = STATS_TEMP_BYTES) -> int:
    """Elements per run of the statistics graph ``model`` (``stats_model``) whose
    intermediates fit ``temp_bytes``: ``temp_bytes`` over the bytes per element of every
    intermediate the size of the slice (no buffer reuse assumed, so an upper bound; ONNX
    Runtime's memory planner reuses buffers and needs less). At least 2^16."""
    typed = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in typed.graph.value_info}
    full = {"rs", "cs"}
    per_element = 0
    for node in typed.graph.node:
        if node.op_type in _REDUCING or not full.intersection(node.input):
            continue
        for out in node.output:
            full.add(out)
            per_element += _BYTES.get(types.get(out, TensorProto.DOUBLE), 8)
    return max(1 << 16, temp_bytes // max(per_element, 1))


def is_resident(runner: object) -> bool:
    """Whether ``runner`` can keep its outputs on the device (``run_resident``)."""
    return callable(getattr(runner, "run_resident", None))


class ResidentStats(StatsPool):
    """``StatsPool`` whose ``add`` takes ``OrtValue``s and reduces float32 pairs on their
    device (the current ``runners.device``), others on the host.

    Args:
        sites / fmt / threads / compiled: As for ``StatsPool`` (the threads fold host-side
            tensors).

    Use as a context manager or call ``close``: it holds an ONNX Runtime session.
    """

    def __init__(self, sites: Sequence[TensorSite], fmt: FloatFormat,
                 threads: int | None = None, compiled: bool = False) -> None:
        super().__init__(sites, fmt, threads, compiled)
        model = stats_model(fmt)
        self.chunk = chunk_elements(model)
        self._session = OrtRunner(model, name="layerwise-stats").__enter__()

    def add(self, names: Sequence[str], ref: Mapping[str, object],
            cand: Mapping[str, object]) -> None:
        """Fold the ``names`` present in both into their accumulators (float32 on the device;
        other dtypes copied to the host and folded there)."""
        host_ref: dict[str, np.ndarray] = {}
        host_cand: dict[str, np.ndarray] = {}
        for n in names:
            if n not in ref or n not in cand:
                continue
            r, c = ref[n], cand[n]
            if (_dtype(r) != "tensor(float)" or _dtype(c) != "tensor(float)"
                    or value_shape(r) != value_shape(c)):
                host_ref[n], host_cand[n] = to_host(r), to_host(c)
                continue
            size = int(np.prod(value_shape(r)))
            if size == 0:
                continue
            for lo in range(0, size, self.chunk):
                hi = min(size, lo + self.chunk)
                values = to_host(self._session.run_resident(
                    {"r": r, "c": c, "lo": np.array([lo], np.int64),
                     "hi": np.array([hi], np.int64)})["s"])
                self.accs[n].fold(hi - lo, *values.tolist())  # in FIELDS order
        if host_ref:
            super().add(list(host_ref), host_ref, host_cand)

    def close(self) -> None:
        super().close()
        if self._session is not None:
            self._session.__exit__(None, None, None)
            self._session = None  # type: ignore[assignment]


def _dtype(value: object) -> str:
    data_type = getattr(value, "data_type", None)
    return data_type() if callable(data_type) else f"numpy:{np.asarray(value).dtype}"


def value_shape(value: object) -> tuple[int, ...]:
    """An array's or an ``onnxruntime.OrtValue``'s shape (``OrtValue.shape`` is a method)."""
    shape = getattr(value, "shape", None)
    return tuple(shape() if callable(shape) else np.shape(np.asarray(value)))


def to_host(value: object) -> np.ndarray:
    """``value`` as a host array (an ``OrtValue`` is copied from its device)."""
    numpy = getattr(value, "numpy", None)
    return numpy() if callable(numpy) else np.asarray(value)
