"""Layerwise statistics computed where the tensors are: on the GPU, only scalars come back.

On a CUDA device, copying every intermediate tensor of both runs to the host and reducing it
there with numpy is what a layerwise comparison spends its time on (PP-OCRv4 rec, 256 strips:
68 s of layerwise on an H100, BENCHMARKS.md, issue 21), not the runs. Here the segments run
with ONNX Runtime's I/O binding (``OrtRunner.run_resident``): their outputs stay in GPU memory
as ``OrtValue``s, boundary tensors feed the next segment from there, and each compared
(reference, candidate) pair is reduced on the device by a small ONNX graph
(``stats_model``) run in one more session on the same device. Thirteen float64 numbers per
tensor come back.

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


def stats_model(fmt: FloatFormat) -> onnx.ModelProto:
    """The ONNX graph reducing one (reference, candidate) float32 pair to ``FIELDS``.

    Args:
        fmt: The target format: its largest finite value (overflow), smallest subnormal
            (half of it: flush-to-zero, ONNX ``Cast`` rounding) and smallest normal value.

    Returns:
        A model with inputs ``r``, ``c`` (float32, any shape, the same for both) and output
        ``s`` (float64[13], in ``FIELDS`` order).
    """
    nodes: list[onnx.NodeProto] = []

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
    ar, ac = op("Abs", ["r"], "ar"), op("Abs", ["c"], "ac")
    r_ok, c_ok = op("Less", [ar, inf], "r_ok"), op("Less", [ac, inf], "c_ok")
    ok = op("And", [r_ok, c_ok], "ok")
    c_nan = op("Not", [op("Equal", ["c", "c"], "c_eq")], "c_nan")
    c_inf = op("Equal", [ac, inf], "c_inf")
    r_bad = op("Not", [r_ok], "r_bad")
    over = op("And", [r_ok, op("Greater", [ar, top], "gt_max")], "over")
    nonzero = op("Greater", [ar, zero], "nonzero")
    below_half = op("Less", [ar, half_sub], "below_half")
    small = op("Less", [ar, normal], "small")
    flush = op("And", [nonzero, below_half], "flush")
    subnormal = op("And", [op("Not", [below_half], "at_least_half"), small], "subnormal")
    lost = op("And", [op("And", [ok, op("And", [small, nonzero], "small_nz")], "ok_small"),
                      op("Equal", ["c", zero], "c_zero")], "lost")
    d = op("Where", [ok, op("Sub", ["c", "r"], "diff"), zero], "d")
    ad = op("Abs", [d], "ad")
    d64 = op("Cast", [d], "d64", to=TensorProto.DOUBLE)
    r64 = op("Cast", [op("Where", [ok, "r", zero], "r_okv")], "r64", to=TensorProto.DOUBLE)
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
         helper.make_tensor_value_info("c", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("s", TensorProto.DOUBLE, [len(FIELDS)])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)],
                             ir_version=8)


def is_resident(runner: object) -> bool:
    """Whether ``runner`` can keep its outputs on the device (``run_resident``)."""
    return callable(getattr(runner, "run_resident", None))


class ResidentStats(StatsPool):
    """``StatsPool`` whose ``add`` takes ``OrtValue``s and reduces float32 pairs on their
    device (the current ``runners.device``), others on the host.

    Args:
        sites / fmt / threads: As for ``StatsPool`` (the threads fold host-side tensors).

    Use as a context manager or call ``close``: it holds an ONNX Runtime session.
    """

    def __init__(self, sites: Sequence[TensorSite], fmt: FloatFormat,
                 threads: int | None = None) -> None:
        super().__init__(sites, fmt, threads)
        self._session = OrtRunner(stats_model(fmt), name="layerwise-stats").__enter__()

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
                    or _shape(r) != _shape(c)):
                host_ref[n], host_cand[n] = to_host(r), to_host(c)
                continue
            size = int(np.prod(_shape(r)))
            if size == 0:
                continue
            values = to_host(self._session.run_resident({"r": r, "c": c})["s"])
            self.accs[n].fold(size, dict(zip(FIELDS, values.tolist())))
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


def _shape(value: object) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    return tuple(shape() if callable(shape) else np.shape(np.asarray(value)))


def to_host(value: object) -> np.ndarray:
    """``value`` as a host array (an ``OrtValue`` is copied from its device)."""
    numpy = getattr(value, "numpy", None)
    return numpy() if callable(numpy) else np.asarray(value)
