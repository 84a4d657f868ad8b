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
from onnx import helper, numpy_helper

from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED, SEPARATE, split_conv_bias
from precision_doctor.precision.emulate import EmulationInfo, build_emulation
from precision_doctor.precision.emulate_pass import Emulator
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


class _SwitchEmulator(Emulator):
    """``Emulator`` whose every rounding of a node is guarded by that node's switch."""

    def __init__(self, model: onnx.ModelProto, plan: PrecisionPlan, dtypes: dict[str, int],
                 types: dict[str, onnx.TypeProto], owner: dict[str, str]) -> None:
        super().__init__(model, plan, dtypes, types)
        self.owner = owner  # node name -> the source node whose switch it follows
        self.keys: list[str] = []
        self.keep: dict[str, str] = {}
        self.guarded: dict[tuple[str, str], str] = {}
        # (v, p) -> a tensor equal to round_p(v) whatever the switches: for an output v of a
        # switched node, its rounding round_p(raw) (round_p(v) = round_p(raw) both ways)
        self.low_of: dict[tuple[str, Precision], str] = {}

    def run(self) -> None:
        super().run()
        self.graph.input.append(helper.make_tensor_value_info(
            SWITCH_INPUT, onnx.TensorProto.BOOL, [len(self.keys)]))

    def _keep(self, node: onnx.NodeProto) -> str:
        """The bool scalar ``keep_n`` of ``node``'s switch, computed once before its first
        user."""
        key = self.owner.get(node.name, node.name)
        if key not in self.keep:
            index, keep = f"pd_switch/{key}/index", f"pd_switch/{key}/keep"
            self.emitted += [
                helper.make_node("Constant", [], [index], name=index,
                                 value=numpy_helper.from_array(np.array(len(self.keys),
                                                                        np.int64))),
                helper.make_node("Gather", [SWITCH_INPUT, index], [keep], name=keep, axis=0)]
            self.dtypes[keep] = onnx.TensorProto.BOOL
            self.types[keep] = helper.make_tensor_type_proto(onnx.TensorProto.BOOL, [])
            self.keys.append(key)
            self.keep[key] = keep
        return self.keep[key]

    def _where(self, keep: str, fp32: str, low: str, name: str, out: str) -> onnx.NodeProto:
        self._typed(out, fp32)
        return helper.make_node("Where", [keep, fp32, low], [out], name=name)

    def switched_input(self, x: str, p: Precision, node: onnx.NodeProto) -> str:
        keep = self._keep(node)
        key = (x, keep)
        if key not in self.guarded:
            low = self.low_of.get((x, p)) or super().rounded_input(x, p)
            out = f"{x}__pd_sw{len(self.guarded)}"
            self.emitted.append(self._where(keep, x, low, f"pd_switch/in/{x}/{keep}", out))
            self.guarded[key] = out
        return self.guarded[key]

    def _tf32_node(self, node: onnx.NodeProto, p: Precision) -> None:
        for i in range(min(2, len(node.input))):
            if self.is_float(node.input[i]):
                node.input[i] = self.switched_input(node.input[i], p, node)

    def _low_precision_node(self, node: onnx.NodeProto, p: Precision) -> None:
        if node.op_type not in CAST_OPS:  # reads its input as stored (``precision.emulate``)
            for i, v in enumerate(node.input):  # rounding is idempotent: always guard
                if self.is_float(v):
                    node.input[i] = self.switched_input(v, p, node)
        if self._exact(node):
            self._keep(node)  # switchable like any node, though nothing is rounded after it
            return
        for i, out in enumerate(node.output):
            if self.is_float(out):
                self._switched_output(node, i, p)

    def _switched_output(self, node: onnx.NodeProto, index: int, p: Precision) -> None:
        keep = self._keep(node)
        original = node.output[index]
        raw = f"{original}__pd_raw"
        node.output[index] = raw
        self._typed(raw, original)
        nodes, rounded = self._round_nodes(raw, p, f"out/{original}")
        where = self._where(keep, raw, rounded, f"pd_switch/out/{original}", original)
        self.low_of[(original, p)] = rounded
        self.after += [*nodes, where]
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
    out, info, emulator = build_emulation(
        model, lambda m, d, t: _SwitchEmulator(m, plan, d, t, owner))
    return SwitchableEmulation(out, tuple(emulator.keys), default, conv_bias, info)
