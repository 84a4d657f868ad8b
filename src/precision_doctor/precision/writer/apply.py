"""Phase 2 of the writer: rewrite the model from the ``Decisions`` (an ``onnx_ir`` pass).

* An activation whose storage differs from what a consumer needs gets one ``Cast`` per
  (tensor, format), placed before its first such consumer and shared by the others: Casts
  appear only at precision boundaries. A tensor made by one of the model's own Casts is not cast
  again: the new Cast reads that Cast's input (or the input is used as is), so no Cast pairs.
* A float constant is converted, never cast at run time: in place when every consumer wants the
  same low format (names kept), else a low-precision copy is added next to the original
  (``<name>_fp16``) for the consumers that want it. ``Constant`` nodes stay ``Constant`` nodes.
* Original ``Cast(to=FLOAT)`` / float ``ConstantOfShape`` nodes decided FP16/BF16 are retargeted.
* With ``keep_io_types``, a graph output stored in FP16/BF16 is renamed ``<name>/fp16`` and a
  Cast to FP32 produces the original name; graph inputs stay FP32 and are cast once.
* Values read inside If/Loop bodies are cast back to FP32 before the node.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx_ir as ir

from precision_doctor.errors import UnsupportedModelError
from precision_doctor.formats import FORMATS
from precision_doctor.graph.constants import attr_tensor, ir_tensor
from precision_doctor.graph.weight_store import ir_external_key, stored_copy
from precision_doctor.precision.writer.decide import FLOAT, PRECISION_OF, Decisions
from precision_doctor.precision.writer.schema import has_subgraph, subgraph_nodes

# Warnings of conversions whose result the weight store already holds (same key).
_CONVERT_WARNINGS: dict[tuple, str] = {}

NUMPY_DTYPES = {ir.DataType.FLOAT16: np.dtype(np.float16),
                ir.DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16)}


@dataclasses.dataclass
class WriteCounts:
    """What the pass changed (report material)."""

    casts: int = 0
    casts_at_inputs: int = 0
    casts_at_outputs: int = 0
    retargeted: list[str] = dataclasses.field(default_factory=list)
    initializers_converted: int = 0
    initializers_duplicated: int = 0
    constants_converted: int = 0
    constants_duplicated: int = 0
    flushed: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class WritePassResult(ir.passes.PassResult):
    """``onnx_ir`` pass result plus the counts of what was changed."""

    counts: WriteCounts = dataclasses.field(default_factory=WriteCounts)


CONVERT_CHUNK = 1 << 20  # elements checked at a time (8 MiB of float64 temporaries)


def convert_array(array: np.ndarray, dtype: ir.DataType, name: str) -> tuple[np.ndarray, str]:
    """``array`` in FP16/BF16 (round to nearest even), and a warning when values flush to 0.

    Checked in chunks of ``CONVERT_CHUNK`` elements, so that the float64 temporaries stay
    small whatever the weight's size (whole-tensor temporaries took 8x a 64 MiB weight).

    Raises:
        UnsupportedModelError: A finite value would become inf (never clamp silently; the
            decision phase keeps such nodes FP32, so this means a bug or an unchecked path).
    """
    source = np.asarray(array)
    flat = source.reshape(-1)
    low = np.empty(flat.shape, NUMPY_DTYPES[dtype])
    new_inf = flushed = 0
    lost = top = 0.0
    for start in range(0, flat.size, CONVERT_CHUNK):
        part = flat[start:start + CONVERT_CHUNK]
        with np.errstate(over="ignore", under="ignore"):
            low[start:start + part.size] = part.astype(low.dtype)
        back = low[start:start + part.size].astype(np.float64)
        exact = part.astype(np.float64)
        finite = np.isfinite(exact)
        new_inf += int(np.isinf(back).sum()) - int(np.count_nonzero(np.isinf(exact)))
        gone = (back == 0) & (exact != 0) & finite
        if gone.any():
            flushed += int(gone.sum())
            lost = max(lost, float(np.abs(exact[gone]).max()))
        if finite.any():
            top = max(top, float(np.abs(exact[finite]).max()))
    if new_inf > 0:
        raise UnsupportedModelError(
            f"converting constant '{name}' to {PRECISION_OF[dtype].value} would overflow to inf; "
            "keep its consumers in FP32 (plan override)", tensor=name)
    warning = ""
    # Flushing matters only beyond rounding: when a flushed value exceeds the unit roundoff of
    # the tensor's largest value (e.g. an epsilon 1e-12 -> 0), not for 1e-40 FP32 denormals
    # next to weights of magnitude 1.
    if flushed and lost > FORMATS[PRECISION_OF[dtype]].unit_roundoff * top:
        warning = (f"constant '{name}': {flushed} of {source.size} non-zero values flush to 0 "
                   f"in {PRECISION_OF[dtype].value} (largest flushed |x| {lost:.3g}, largest "
                   f"|x| {top:.3g})")
    return low.reshape(source.shape), warning


class _Writer:
    def __init__(self, model: ir.Model, decisions: Decisions, keep_io_types: bool) -> None:
        self.graph = model.graph
        self.d = decisions
        self.keep_io = keep_io_types
        self.counts = WriteCounts()
        self.casts: dict[tuple[ir.Value, ir.DataType], ir.Value] = {}
        self.copies: dict[tuple[ir.Value, ir.DataType], ir.Value] = {}
        self.in_place: dict[ir.Value, ir.DataType] = {}
        self.taken = {v.name for v in self.graph.inputs if v.name}
        self.taken.update(self.graph.initializers.keys())
        for node in self.graph.all_nodes():
            self.taken.update(v.name for v in node.outputs if v.name)
            if node.name:
                self.taken.add(node.name)

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def run(self) -> None:
        self._plan_constants()
        for v in self.graph.inputs:
            dtype = self.d.storage.get(v, FLOAT)
            if dtype != FLOAT:
                v.dtype = dtype
        self._graph_outputs()
        for node in list(self.graph):
            self._node(node)

    # -- constants -----------------------------------------------------------------------
    def _float_constant(self, v: ir.Value | None) -> bool:
        if v is None or not self.d.constants.is_constant(v):
            return False
        array = self.d.constants.array(v)
        return array is not None and array.dtype == np.float32

    def _plan_constants(self) -> None:
        """Convert a constant in place when its original FP32 value is no longer needed."""
        wanted: dict[ir.Value, set[ir.DataType]] = {}
        for node, typing in self.d.typings.items():
            for idx, dtype in typing.inputs.items():
                v = node.inputs[idx]
                if v is not None and self._float_constant(v):
                    wanted.setdefault(v, set()).add(dtype)
        for v, dtypes in wanted.items():
            keeps_fp32 = FLOAT in dtypes or v.is_graph_output() or any(
                use.idx not in getattr(self.d.typings.get(use.node), "inputs", {})
                for use in v.uses())
            low = sorted(d for d in dtypes if d != FLOAT)
            if low and not keeps_fp32:
                self.in_place[v] = low[0]

    def _converted(self, v: ir.Value, dtype: ir.DataType) -> tuple[np.ndarray, str]:
        """``convert_array`` of constant ``v``, or what an earlier write of the same model
        converted (``checks.ConstantMemo``)."""
        memo, key = self.d.constants.memo, (v.name or "", int(dtype))
        if memo is not None and key[0] and key in memo.converted:
            return memo.converted[key]
        array = self.d.constants.array(v)
        assert array is not None
        made = convert_array(array, dtype, v.name or "")
        if memo is not None and key[0]:
            memo.converted[key] = made
        return made

    def _constant_as(self, v: ir.Value, dtype: ir.DataType) -> ir.Value:
        if dtype == FLOAT:
            return v
        if (v, dtype) in self.copies:
            return self.copies[(v, dtype)]
        tensor_name = v.name if self.in_place.get(v) == dtype else \
            self.unique(f"{v.name}_{PRECISION_OF[dtype].value}")
        producer = v.producer()
        const = v.const_value if producer is None else None
        stored = ir_external_key(const, f"writer/{dtype.name}")
        tensor: ir.TensorProtocol
        if isinstance(const, ir.ExternalTensor) and stored is not None:
            # A weight kept in an external data file: its copy goes to the weight store (once
            # per process: a search with --runner writes a model per evaluation), so the
            # written model stays a small proto (``graph.external``; saved with external data).
            store_key = stored

            def converted() -> np.ndarray:
                array = self.d.constants.array(v)
                assert array is not None
                low, _CONVERT_WARNINGS[store_key] = convert_array(array, dtype, v.name or "")
                return low

            tensor = stored_copy(const, store_key, dtype, tensor_name or "", converted)[0]
            warning = _CONVERT_WARNINGS.get(stored) or ""
        else:
            low, warning = self._converted(v, dtype)
            tensor = ir_tensor(low, name=tensor_name)
        if warning:
            self.counts.flushed.append(warning)
        if self.in_place.get(v) == dtype:
            new = v
            if producer is None:
                v.const_value = tensor
                self.counts.initializers_converted += 1
            else:
                for key in [k for k in producer.attributes if k.startswith("value")]:
                    del producer.attributes[key]
                producer.attributes["value"] = ir.AttrTensor("value", tensor)
                self.counts.constants_converted += 1
            v.dtype = dtype
        elif producer is None:
            new = ir.Value(name=tensor_name, type=ir.TensorType(dtype), shape=v.shape,
                           const_value=tensor)
            self.graph.register_initializer(new)
            self.counts.initializers_duplicated += 1
        else:
            copy = ir.node("Constant", [], {"value": tensor},
                           name=self.unique(f"{producer.name or 'Constant'}_"
                                            f"{PRECISION_OF[dtype].value}"))
            new = copy.outputs[0]
            new.name, new.dtype, new.shape = tensor_name, dtype, v.shape
            self.graph.insert_after(producer, copy)
            self.counts.constants_duplicated += 1
        self.copies[(v, dtype)] = new
        return new

    # -- activations ---------------------------------------------------------------------
    def _cast(self, v: ir.Value, dtype: ir.DataType, before: ir.Node | None = None,
              after: ir.Node | None = None, out_name: str | None = None) -> ir.Value:
        if (v, dtype) in self.casts:
            return self.casts[(v, dtype)]
        short = PRECISION_OF[dtype].value
        base = out_name or v.name
        source = v
        producer = v.producer()
        if after is None and producer is not None and producer.op_type == "Cast" and \
                producer.domain in ("", "ai.onnx") and producer.inputs[0] is not None:
            # v = Cast(src) of the model: cast src itself (or use it) instead of a Cast pair.
            source = producer.inputs[0]
            if self.d.dtype_of(source) == dtype:
                self.casts[(v, dtype)] = source
                return source
        node = ir.node("Cast", [source], {"to": dtype},
                       name=self.unique(f"pd_cast/{short}/{base}"))
        out = node.outputs[0]
        out.name = out_name or self.unique(f"{v.name}/{short}")
        out.dtype, out.shape = dtype, v.shape
        if after is not None:
            self.graph.insert_after(after, node)
        else:
            assert before is not None
            self.graph.insert_before(before, node)
        self.counts.casts += 1
        self.counts.casts_at_inputs += int(source.is_graph_input())
        self.casts[(v, dtype)] = out
        return out

    def _graph_outputs(self) -> None:
        for i, v in enumerate(list(self.graph.outputs)):
            dtype = self.d.storage.get(v, FLOAT)
            if dtype == FLOAT or v.producer() is None:
                continue
            if not self.keep_io:
                v.dtype = dtype
                continue
            if (v, FLOAT) not in self.casts:
                original = v.name or ""
                v.name = self.unique(f"{original}/{PRECISION_OF[dtype].value}")
                out = self._cast(v, FLOAT, after=v.producer(), out_name=original)
                out.doc_string, v.doc_string = v.doc_string, None
                self.counts.casts_at_outputs += 1
            self.graph.outputs[i] = self.casts[(v, FLOAT)]
            v.dtype = dtype

    # -- nodes ---------------------------------------------------------------------------
    def _node(self, node: ir.Node) -> None:
        typing = self.d.typings.get(node)
        if typing is None:
            return
        for idx, dtype in sorted(typing.inputs.items()):
            v = node.inputs[idx]
            if v is None:
                continue
            if self._float_constant(v):
                new = self._constant_as(v, dtype)
            else:
                new = v if self.d.storage.get(v, FLOAT) == dtype else self._cast(v, dtype, node)
            if new is not v:
                node.replace_input_with(idx, new)
        if typing.retarget is not None:
            self._retarget(node, typing.retarget)
        for idx, dtype in typing.outputs.items():
            out = node.outputs[idx]
            if dtype != FLOAT and (out.type is not None or out.is_graph_output()):
                out.dtype = dtype
        if has_subgraph(node):
            for inner in subgraph_nodes(node):
                for idx, v in enumerate(inner.inputs):
                    if v is not None and self.d.storage.get(v, FLOAT) != FLOAT:
                        inner.replace_input_with(idx, self._cast(v, FLOAT, node))

    def _retarget(self, node: ir.Node, dtype: ir.DataType) -> None:
        if node.op_type == "Cast":
            node.attributes["to"] = ir.AttrInt64("to", int(dtype))
            self.counts.retargeted.append(node.name or "")
            return
        attr = node.attributes.get("value")  # ConstantOfShape: the default value is float 0
        array = np.asarray(attr_tensor(attr).numpy()) if attr is not None else \
            np.zeros(1, np.float32)
        low, warning = convert_array(array, dtype, f"{node.name}.value")
        if warning:
            self.counts.flushed.append(warning)
        node.attributes["value"] = ir.AttrTensor("value", ir_tensor(low))
        self.counts.constants_converted += 1


class WritePrecisionPass(ir.passes.InPlacePass):
    """Make precision explicit in a model according to ``Decisions`` (from ``decide``).

    Args:
        decisions: Phase 1 result for this very ``ir.Model``.
        keep_io_types: Keep float graph inputs/outputs FP32.
    """

    def __init__(self, decisions: Decisions, keep_io_types: bool) -> None:
        super().__init__()
        self.decisions = decisions
        self.keep_io_types = keep_io_types

    def call(self, model: ir.Model) -> WritePassResult:
        writer = _Writer(model, self.decisions, self.keep_io_types)
        writer.run()
        c = writer.counts
        modified = bool(c.casts or c.retargeted or c.initializers_converted or
                        c.initializers_duplicated or c.constants_converted or
                        c.constants_duplicated)
        return WritePassResult(model, modified, c)
