"""The ``emulate`` runners: reduced precision emulated with ONNX Runtime (CPU, or the GPU of
``runners.device.use``: the emulation graph's Cast round trips are exact on either).

``EmulatorRunner`` emulates an FP32 model under a ``PrecisionPlan``
(``precision_doctor.precision.emulate`` says exactly what is rounded where);
``WrittenEmulatorRunner`` emulates a strongly typed model as written
(``precision_doctor.precision.emulate_written``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

from precision_doctor.graph.segments import is_segment
from precision_doctor.precision.conv_bias import FUSED
from precision_doctor.precision.emulate import EmulationInfo, emulate
from precision_doctor.precision.emulate_switch import SWITCH_INPUT
from precision_doctor.precision.emulate_written import WrittenEmulationInfo, emulate_written
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.runners.base import Feeds, TensorMeta
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.sessions import switched


class _OnOrt:
    """What both emulators share: an ONNX Runtime session of their emulation model, opened by
    their ``__enter__`` into ``self._ort``; or a shared switched session
    (``runners.sessions.switched``)
    with this runner's flags added to every feed (``self._switch``)."""

    _ort: OrtRunner | None = None
    _switch: np.ndarray | None = None

    def __exit__(self, *exc: object) -> None:
        if self._ort is not None and self._switch is None:  # a switched session is shared
            self._ort.__exit__(*exc)
        self._ort = None
        self._switch = None

    def _feeds(self, feeds: Feeds) -> Feeds:
        if self._switch is None:
            return feeds
        return {**feeds, SWITCH_INPUT: self._switch}

    def input_metadata(self) -> list[TensorMeta]:
        assert self._ort is not None, "use the runner inside a `with` block"
        return [m for m in self._ort.input_metadata() if m.name != SWITCH_INPUT]

    def output_names(self) -> list[str]:
        assert self._ort is not None, "use the runner inside a `with` block"
        return self._ort.output_names()

    def run(self, feeds: Feeds, output_names: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        assert self._ort is not None, "use the runner inside a `with` block"
        return self._ort.run(self._feeds(feeds), output_names)

    def run_resident(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> dict:
        """``OrtRunner.run_resident`` of the emulation model (outputs stay on the device)."""
        assert self._ort is not None, "use the runner inside a `with` block"
        return self._ort.run_resident(self._feeds(feeds), output_names)


class EmulatorRunner(_OnOrt):
    """Runs ``model`` as an engine executing ``plan`` would, on ONNX Runtime (the current
    device: ``runners.device``).

    Args:
        model: The FP32 model.
        plan: Precision of every node.
        name: Label for reports (default ``emulate-<default precision>``).
        intra_op_threads: ONNX Runtime threads (0 = default).
        emulation: ``precision.emulate.emulate(model, plan)`` when the caller has it already
            (it is then not built again).

    A segment of the planned model (``graph.segments.segment_model``) is emulated with the
    plan's decisions for its own nodes.

    Raises:
        PlanError: (on ``__enter__``) the plan names nodes not in the model.
        BackendError: (on ``__enter__``) ONNX Runtime rejects the emulation model.
    """

    def __init__(self, model: onnx.ModelProto, plan: PrecisionPlan, name: str | None = None,
                 intra_op_threads: int = 0, cpu_mem_arena: bool = False,
                 emulation: tuple[onnx.ModelProto, EmulationInfo] | None = None,
                 conv_bias: str = FUSED) -> None:
        self.model = model
        self.conv_bias = conv_bias
        self.emulation = emulation
        self.cpu_mem_arena = cpu_mem_arena
        self.plan = plan
        self.name = name or f"emulate-{plan.default.value}"
        self.intra_op_threads = intra_op_threads
        self.info: EmulationInfo | None = None
        self._ort: OrtRunner | None = None

    def __enter__(self) -> EmulatorRunner:
        plan = self.plan
        if is_segment(self.model):  # a segment of the planned model: its own nodes' decisions
            names = {n.name for n in self.model.graph.node}
            plan = PrecisionPlan(plan.default, {k: v for k, v in plan.overrides.items()
                                                if k in names})
        elif self.emulation is None:
            shared = switched.lookup(self.model, plan.default, self.conv_bias)
            flags = shared[0].flags(plan) if shared is not None else None
            if shared is not None and flags is not None:
                self.info, self._ort, self._switch = shared[0].info, shared[1], flags
                return self
        emulated, self.info = self.emulation or emulate(self.model, plan, self.conv_bias)
        self._ort = OrtRunner(emulated, name=self.name,
                              intra_op_threads=self.intra_op_threads,
                              cpu_mem_arena=self.cpu_mem_arena).__enter__()
        return self



class WrittenEmulatorRunner(_OnOrt):
    """Runs a strongly typed model as written, BF16/FP16 tensors emulated, on ONNX Runtime CPU.

    ``precision.emulate_written``: every tensor the model types BF16 (FP16) holds the BF16
    (FP16) value an engine stores, the model's own Casts decide where, arithmetic inside a
    node is FP32. For models ONNX Runtime CPU has no kernels for (BF16 Conv, MatMul, ...).

    Args:
        model: The strongly typed model (e.g. written by ``fix``); graph inputs and outputs
            are float32 in the emulation whatever their declared low-precision type.
        name: Label for reports (default ``emulate-written-<formats>``, e.g.
            ``emulate-written-bf16``).
        intra_op_threads: ONNX Runtime threads (0 = default).
        conv_bias: Where the deployment engine adds a low-precision convolution's bias:
            ``fused`` or ``separate`` (ONNX Runtime CUDA; ``precision.conv_bias``).
        graph_optimization: ONNX Runtime's optimization level (``OrtRunner``); Q/DQ models
            run at ``basic`` (``quant.emulation.EMULATION_OPTIMIZATION`` says why).

    Raises:
        UnsupportedModelError: (on ``__enter__``) shape inference cannot type the model.
        BackendError: (on ``__enter__``) ONNX Runtime rejects the emulation model.
    """

    def __init__(self, model: onnx.ModelProto, name: str | None = None,
                 intra_op_threads: int = 0, conv_bias: str = FUSED,
                 graph_optimization: str = "all") -> None:
        self.model = model
        self.graph_optimization = graph_optimization
        self.conv_bias = conv_bias
        self.name = name or "emulate-written"
        self._named = name is not None
        self.intra_op_threads = intra_op_threads
        self.info: WrittenEmulationInfo | None = None
        self._ort: OrtRunner | None = None

    def __enter__(self) -> WrittenEmulatorRunner:
        emulated, self.info = emulate_written(self.model, self.conv_bias)
        if not self._named and self.info.formats:
            self.name = "emulate-written-" + "+".join(self.info.formats)
        self._ort = OrtRunner(emulated, ("cpu",), name=self.name,
                              graph_optimization=self.graph_optimization,
                              intra_op_threads=self.intra_op_threads).__enter__()
        return self

