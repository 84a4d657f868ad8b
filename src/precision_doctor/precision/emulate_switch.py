"""One emulation graph for every plan of a search: each node's FP32 fallback switched by an
input, so one ONNX Runtime session evaluates any plan without rebuilding anything.

``precision.emulate`` builds one graph per ``PrecisionPlan``: a Python pass over the model, then
a new session, which on a GPU also pays its device setup (measured on an H100 with 16 cores,
PP-OCRv4 det: about 0.35 s to build the emulation graph and 0.8 s to open its CUDA session,
against 0.03 s to run it on 3 images at 640x640; ``benchmarks/probes/cuda_start.py``). A search or
an impact trial changes only which nodes fall back to FP32, so this module builds the
emulation of the all-low-precision plan once, with every rounding of a node ``n`` guarded by a
``Where``::

    keep_n = Gather(pd_keep_fp32, index_n)        # bool scalar, True = node n runs in FP32
    x_n    = Where(keep_n, x, round(x))            # each floating input of n
    y      = Where(keep_n, y_raw, round(y_raw))    # each floating output of n (original name)

``pd_keep_fp32`` is an extra graph input, ``bool[K]``, one entry per switchable node
(``SwitchableEmulation.nodes`` gives the order). A plan whose nodes are each either in the
default low precision or FP32 is then one feed of ``flags(plan)``. The rounding is
idempotent (``round(round(x)) = round(x)``), so inputs are rounded whether or not their
producer already rounded them; the ``round(x)`` of an output of a switched node is its
``round(y_raw)``, computed once, so a consumer's guard is one ``Where``. With the flags of a
plan, every tensor holds the value ``precision.emulate.emulate(model, plan)`` computes: the
same bits on a tiny model and on PP-OCRv4 cls at ONNX Runtime's basic optimization level
(tests); at the default level ONNX Runtime fuses FP32 nodes around the switches differently
from the per-plan graph, which moves the FP32 arithmetic by rounding-level amounts that the
FP16/BF16 roundings after them may amplify (PP-OCRv4 det in BF16 on the CPU: 1e-2 relative L2
between the two emulations, against 3e-2 of each from FP32). Rounded weights are stored
beside the FP32 ones (two copies of the weights in the session).

Not switchable (``emulate_switchable`` returns None; callers build one graph per plan as
before): a default of FP32, and a ``LayerNormalization`` with ``stash_type`` != 1 that the
plan puts in FP16/BF16 (its statistics chain replaces the node, ``emulate_layernorm``). With
``conv_bias=separate`` every low-precision convolution is split into Conv + Add; a switched
convolution then adds its bias in a second FP32 operation, a difference of at most one FP32
rounding from the fused FP32 convolution (2^-24 relative).

One case is emulated differently from ``precision.emulate``: a constant that meets a rounded
tensor in a data-movement node (``Where(m, scores, Expand(-FLT_MAX))``) is rounded there by the
per-plan graph, as the writer stores it; the switched graph leaves it to the node that reads the
result, which rounds it anyway unless that node is switched to FP32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED, SEPARATE, split_conv_bias
from precision_doctor.precision.emulate import (
    EXACT_OPS,
    EmulationInfo,
    _Emulator,
    build_emulation,
)
from precision_doctor.precision.plan import CAST_OPS, NodeDecision, PrecisionPlan

SWITCH_INPUT = "pd_keep_fp32"
_LOW = (Precision.FP16, Precision.BF16, Precision.TF32)


@dataclass(frozen=True)
class SwitchableEmulation:
    """An emulation model whose FP32 fallbacks are chosen at run time.

    Attributes:
        model: The emulation model: the source model's inputs plus ``SWITCH_INPUT``
            (``bool[len(nodes)]``), the same outputs and tensor names.
        nodes: Switchable node names (source model names), in ``SWITCH_INPUT`` order.
        default: The low precision every switchable node runs in unless switched to FP32.
        conv_bias: The convolution bias model it was built with (``precision.conv_bias``).
        info: What the emulation rounds (``precision.emulate.EmulationInfo``).
    """

    model: onnx.ModelProto
    nodes: tuple[str, ...]
    default: Precision
    conv_bias: str
    info: EmulationInfo

    def flags(self, plan: PrecisionPlan) -> np.ndarray | None:
        """The ``SWITCH_INPUT`` feed of ``plan`` (``bool[len(nodes)]``, True = FP32), or None
        when the plan is not one of this graph's (another default, or a node in a low
        precision other than ``default``)."""
        if plan.default is not self.default:
            return None
        if any(d.precision not in (self.default, Precision.FP32)
               for d in plan.overrides.values()):
            return None
        return np.array([plan.precision_of(n) is Precision.FP32 for n in self.nodes],
                        dtype=bool)


class _SwitchEmulator(_Emulator):
    """``_Emulator`` whose every rounding of a node is guarded by that node's switch."""

    def __init__(self, model: ir.Model, plan: PrecisionPlan, owner: dict[str, str]) -> None:
        super().__init__(model, plan)
        self.owner = owner  # node name -> the source node whose switch it follows
        self.keys: list[str] = []
        self.keep: dict[str, ir.Value] = {}
        self.guarded: dict[tuple[int, int], ir.Value] = {}
        # (id(v), p) -> a value equal to round_p(v) whatever the switches: for an output v of a
        # switched node, its rounding round_p(raw) (round_p(v) = round_p(raw) both ways)
        self.low_of: dict[tuple[int, Precision], ir.Value] = {}
        self.switch = ir.Value(name=SWITCH_INPUT, type=ir.TensorType(ir.DataType.BOOL),
                               shape=ir.Shape([None]))

    def run(self) -> None:
        super().run()
        self.graph.inputs.append(self.switch)
        self.switch.shape = ir.Shape([len(self.keys)])

    def _keep(self, node: ir.Node) -> ir.Value:
        """The bool scalar ``keep_n`` of ``node``'s switch, computed once before its first
        user."""
        key = self.owner.get(node.name or "", node.name or "")
        if key not in self.keep:
            index = ir.node("Constant", [], {"value": ir.tensor(np.int64(len(self.keys)))},
                            name=f"pd_switch/{key}/index")
            gather = ir.node("Gather", [self.switch, index.outputs[0]], {"axis": 0},
                             name=f"pd_switch/{key}/keep")
            index.outputs[0].name = f"pd_switch/{key}/index"
            gather.outputs[0].name = f"pd_switch/{key}/keep"
            gather.outputs[0].dtype = ir.DataType.BOOL
            gather.outputs[0].shape = ir.Shape([])
            self.graph.insert_before(node, [index, gather])
            self.keys.append(key)
            self.keep[key] = gather.outputs[0]
        return self.keep[key]

    def _where(self, keep: ir.Value, fp32: ir.Value, low: ir.Value, name: str) -> ir.Node:
        where = ir.node("Where", [keep, fp32, low], name=name)
        if fp32.dtype is not None:
            where.outputs[0].dtype = fp32.dtype
        where.outputs[0].shape = fp32.shape
        return where

    def switched_input(self, x: ir.Value, p: Precision, node: ir.Node) -> ir.Value:
        keep = self._keep(node)
        key = (id(x), id(keep))
        if key not in self.guarded:
            low = self.low_of.get((id(x), p)) or super().rounded_input(x, p, node)
            where = self._where(keep, x, low, f"pd_switch/in/{x.name}/{keep.name}")
            where.outputs[0].name = f"{x.name}__pd_sw{len(self.guarded)}"
            self.graph.insert_before(node, [where])
            self.guarded[key] = where.outputs[0]
        return self.guarded[key]

    def _tf32_node(self, node: ir.Node, p: Precision) -> None:
        for i in (0, 1):
            v = node.inputs[i] if i < len(node.inputs) else None
            if v is not None and self.is_float(v):
                node.replace_input_with(i, self.switched_input(v, p, node))

    def _low_precision_node(self, node: ir.Node, p: Precision) -> None:
        cast = node.op_type in CAST_OPS  # reads its input as stored (``precision.emulate``)
        for i, v in enumerate(node.inputs):  # rounding is idempotent: always guard
            if not cast and v is not None and self.is_float(v):
                node.replace_input_with(i, self.switched_input(v, p, node))
        exact = (node.op_type in EXACT_OPS and node.domain in ("", "ai.onnx")
                 and not ("min" in node.attributes or "max" in node.attributes))  # Clip < 11
        if exact:
            self._keep(node)  # switchable like any node, though nothing is rounded after it
            return
        for out in node.outputs:
            if self.is_float(out):
                self._switched_output(node, out, p)

    def _switched_output(self, node: ir.Node, out: ir.Value, p: Precision) -> None:
        keep = self._keep(node)
        uses = list(out.uses())
        original = out.name
        out.name = f"{original}__pd_raw"
        nodes, rounded = self._round_nodes(out, p, f"out/{original}")
        where = self._where(keep, out, rounded, f"pd_switch/out/{original}")
        where.outputs[0].name = original
        self.low_of[(id(where.outputs[0]), p)] = rounded
        self.graph.insert_after(node, [*nodes, where])
        for use in uses:
            use.node.replace_input_with(use.idx, where.outputs[0])
        for i, g_out in enumerate(self.graph.outputs):
            if g_out is out:
                self.graph.outputs[i] = where.outputs[0]
        self.n_act += 1


def switchable(model: onnx.ModelProto, default: Precision) -> bool:
    """Whether ``emulate_switchable`` can build the switched graph of ``model`` for plans of
    ``default`` (see the module docstring)."""
    if default not in _LOW:
        return False
    return not any(n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx")
                   and any(a.name == "stash_type" and a.i != 1 for a in n.attribute)
                   for n in model.graph.node)


def emulate_switchable(model: onnx.ModelProto, default: Precision, conv_bias: str = FUSED
                       ) -> SwitchableEmulation | None:
    """Build the switched emulation of ``model`` for plans of ``default`` precision.

    Args:
        model: FP32 (or FP64) ONNX model (not modified).
        default: FP16, BF16 or TF32: the precision of every node not switched to FP32.
        conv_bias: ``fused`` or ``separate`` (``precision.conv_bias``).

    Returns:
        The switched emulation, or None when the model is not switchable (``switchable``).

    Raises:
        UnsupportedModelError: Shape/type inference of the model failed.
    """
    if not switchable(model, default):
        return None
    plan = PrecisionPlan(default)
    owner: dict[str, str] = {}
    if conv_bias == SEPARATE and default is not Precision.TF32:
        model, added = split_conv_bias(model, lambda n: True)
        owner = {add: conv for conv, add in added.items()}
        plan = plan.with_overrides({add: NodeDecision(default, "engine") for add in owner})
    out, info, emulator = build_emulation(model, lambda m: _SwitchEmulator(m, plan, owner))
    return SwitchableEmulation(out, tuple(emulator.keys), default, conv_bias, info)
