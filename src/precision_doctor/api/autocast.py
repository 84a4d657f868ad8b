"""``compare_autocast``: what PyTorch's own mixed precision (``torch.autocast``) does to a
module, per output, next to the strongly typed plan; and which of a diagnosis' causes autocast
already avoids, measured with the cause's module kept in float32 (``autocast.hooks``).

Autocast runs a fixed list of ops in low precision (matmul, linear, conv, bmm ...) and keeps
another list in float32 (on CUDA: softmax, layer_norm, group_norm, pow, exp, log, sum ...; the
CPU's bfloat16 lists differ); everything else runs in the dtype of its inputs. A sum of squares
written as ``(h * h).mean()`` after a Linear, a residual stream or ``sin``/``cos`` of a large
argument are not protected: whether a cause matters under autocast is measured, not looked up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from precision_doctor.autocast.runner import DTYPES, AutocastRunner, autocast_device
from precision_doctor.compare.metrics import relative_l2
from precision_doctor.compare.tolerance import default_tolerance
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.torch_export import call_items, is_torch_module
from precision_doctor.inputs.recording import Recording

if TYPE_CHECKING:  # torch is an optional extra: not imported at runtime
    import torch

# a cause is avoided by autocast unless keeping its module in float32 removes this share of
# autocast's error (the same bar as a main finding's measured cure)
CURE_SHARE = 0.5


def run_calls(runner: AutocastRunner, items: Sequence[tuple[tuple, dict]]
              ) -> dict[str, list[np.ndarray]]:
    """Output name -> one array per call, from ``runner`` (opened here)."""
    outputs: dict[str, list[np.ndarray]] = {}
    with runner:
        for args, kwargs in items:
            for name, value in runner.call(args, kwargs).items():
                outputs.setdefault(name, []).append(value)
    return outputs


def errors_against(reference: dict[str, list[np.ndarray]],
                   candidate: dict[str, list[np.ndarray]]) -> dict[str, float]:
    """Output name -> relative L2 error over all calls (inf when not finite)."""
    return {name: float(relative_l2(ref, candidate[name])) for name, ref in reference.items()}


def measure(module: Any, items: Sequence[tuple[tuple, dict]], dtype: str, device: str,
            fp32_modules: Sequence[str] = (), *, output_names: Sequence[str] | None = None,
            reference: dict[str, list[np.ndarray]] | None = None) -> dict[str, float]:
    """Relative L2 error per output of ``module`` under autocast (``fp32_modules`` kept in
    float32) against its float32 outputs (``reference``, computed when not given).

    Raises:
        BackendUnavailable: torch missing; CUDA asked for without a GPU.
        BackendError: The module failed.
        InputError: A pattern of ``fp32_modules`` matches no submodule.
    """
    example = items[0]
    if output_names is None and reference is not None:
        output_names = list(reference)
    if reference is None:
        reference = run_calls(AutocastRunner(module, example, output_names=output_names,
                                             dtype=None, device=device), items)
    low = run_calls(AutocastRunner(module, example, output_names=output_names, dtype=dtype,
                                   device=device, fp32_modules=fp32_modules), items)
    return errors_against(reference, low)


@dataclass(frozen=True)
class AutocastComparison:
    """What ``torch.autocast`` does to a module's outputs (relative L2 vs its float32 outputs).

    Attributes:
        dtype: ``"fp16"`` or ``"bf16"``.
        device: Where it ran (``"cpu"``, ``"cuda"``).
        tolerance: The relative L2 bound each output is judged by.
        rel_l2: Output name -> error of the module under autocast.
        fp32_modules: Module patterns kept in float32 for ``kept_rel_l2``.
        kept_rel_l2: Output name -> error with ``fp32_modules`` in float32; None without any.
        causes: Per finding of the diagnosis given, with a module: ``{"node", "kind",
            "module", "rel_l2_kept" (output -> error with that module in float32),
            "removed" (share of autocast's worst error it removes), "avoided" (autocast
            already avoids it: it meets the tolerance, or keeping the module in float32
            removes less than half of its error)}``. A finding of the top-level module
            (``""``) is not measured (``rel_l2_kept`` and ``removed`` None): all of it in
            float32 is no autocast.
        onnx_rel_l2: Output -> the diagnosis' error of the whole exported model in its
            target precision (every node low, emulated): the strongly typed side; None
            without a diagnosis.
        onnx_target: That target (``"fp16"``, ``"bf16"``), or None.
        seconds: Wall time of the comparison.
    """

    dtype: str
    device: str
    tolerance: float
    rel_l2: dict[str, float]
    fp32_modules: tuple[str, ...] = ()
    kept_rel_l2: dict[str, float] | None = None
    causes: tuple[dict[str, Any], ...] = field(default=())
    onnx_rel_l2: dict[str, float] | None = None
    onnx_target: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Whether autocast alone meets the tolerance on every output."""
        return all(v <= self.tolerance for v in self.rel_l2.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (errors as floats; inf stays inf for ``jsonable.dumps``)."""
        return {"dtype": self.dtype, "device": self.device, "tolerance": self.tolerance,
                "passed": self.passed, "rel_l2": dict(self.rel_l2),
                "fp32_modules": list(self.fp32_modules), "kept_rel_l2": self.kept_rel_l2,
                "causes": [dict(c) for c in self.causes], "onnx_rel_l2": self.onnx_rel_l2,
                "onnx_target": self.onnx_target, "seconds": round(self.seconds, 3)}


def compare_autocast(module: torch.nn.Module, samples: Any, *, dtype: str = "bf16",
                     device: str = "auto", fp32_modules: Sequence[str] = (), diagnosis: Any = None,
                     tolerance: float | None = None,
                     max_samples: int | None = None) -> AutocastComparison:
    """Run a ``torch.nn.Module`` under ``torch.autocast`` on its samples and measure each
    output's error against its float32 outputs.

    Args:
        module: A ``torch.nn.Module`` computing in float32 (run in eval mode, restored; copied
            when it must move to ``device``).
        samples: As for :func:`~precision_doctor.api.pytorch.export_module`: one item per call
            (a tuple of positional arguments, a dict of keyword arguments, or one tensor).
        dtype: ``"fp16"`` (``torch.float16``) or ``"bf16"`` (``torch.bfloat16``).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when torch sees a GPU).
        fp32_modules: Module path patterns to keep in float32 as well (``*``: one path
            component), e.g. a fix's ``report["torch"]["fp32_modules"]``.
        diagnosis: A :class:`~precision_doctor.api.results.Diagnosis` of the module: each
            finding whose node has a module is measured with that module kept in float32.
        tolerance: The relative L2 bound per output; default ``dtype``'s (1e-2 FP16, 8e-2
            BF16).
        max_samples: Use the first N samples.

    Returns:
        :class:`AutocastComparison`; outputs are named as the diagnosis names them (the
        exported model's outputs), else ``output_0``, ``output_1`` ..., in the order of the
        module's output tensors flattened.

    Raises:
        InputError: Not a module; no samples; a pattern that matches no submodule; a dtype
            other than fp16/bf16.
        BackendUnavailable: torch is missing (with the install hint), or CUDA is asked for and
            torch sees no GPU.
        BackendError: The module failed under autocast.
    """
    if not is_torch_module(module):
        raise InputError(f"compare_autocast takes a torch.nn.Module; got {type(module).__name__}")
    if dtype not in ("fp16", "bf16"):
        raise InputError(f"autocast dtype must be fp16 or bf16, got {dtype!r}")
    start = time.perf_counter()
    where = autocast_device(device)
    bound = tolerance if tolerance is not None else \
        default_tolerance(Precision.parse(dtype)).rel_l2
    assert bound is not None
    items = call_items(samples, max_samples)
    outputs = list(diagnosis.outputs) if diagnosis is not None else []
    names = [o.name for o in outputs] or None  # the exported model's output names
    reference = run_calls(AutocastRunner(module, items[0], output_names=names, dtype=None,
                                         device=where), items)
    alone = measure(module, items, dtype, where, reference=reference)
    kept = measure(module, items, dtype, where, fp32_modules, reference=reference) \
        if fp32_modules else None
    causes = tuple(_causes(module, items, dtype, where, reference, alone, bound, diagnosis))
    onnx = {o.name: float(o.metrics.rel_l2) for o in outputs} or None
    return AutocastComparison(dtype, where, bound, alone, tuple(fp32_modules), kept, causes,
                              onnx, diagnosis.target if diagnosis is not None else None,
                              time.perf_counter() - start)


def _causes(module: Any, items: Sequence[tuple[tuple, dict]], dtype: str, device: str,
            reference: dict[str, list[np.ndarray]], alone: dict[str, float], bound: float,
            diagnosis: Any) -> list[dict[str, Any]]:
    """One entry per finding with a module: its error under autocast with that module in
    float32, and whether autocast already avoids it."""
    if diagnosis is None:
        return []
    names = {n for n, _ in module.named_modules()}
    worst = max(alone.values(), default=0.0)
    measured: dict[str, dict[str, float]] = {}
    found = []
    for finding in diagnosis.findings:
        path = finding.source.module if finding.source is not None else None
        if path is None or path not in names:
            continue
        if path == "":  # the top-level module in float32 is no autocast at all: not a cure
            found.append({"node": finding.node, "kind": finding.kind, "module": path,
                          "rel_l2_kept": None, "removed": None, "avoided": worst <= bound})
            continue
        if path not in measured:
            measured[path] = measure(module, items, dtype, device, [path], reference=reference)
        kept = measured[path]
        removed = 0.0 if not np.isfinite(worst) or worst == 0 else \
            1.0 - max(kept.values(), default=0.0) / worst
        if not np.isfinite(worst):
            removed = 1.0 if all(np.isfinite(v) for v in kept.values()) else 0.0
        found.append({"node": finding.node, "kind": finding.kind, "module": path,
                      "rel_l2_kept": kept, "removed": round(float(removed), 4),
                      "avoided": worst <= bound or removed < CURE_SHARE})
    return found


def parse_autocast_runner(spec: str) -> tuple[str, str] | None:
    """``(dtype, device)`` of ``--runner autocast[:fp16|bf16][,device=cpu|cuda|auto]``, or None
    when ``spec`` names another runner. The dtype defaults to the diagnosed target's (given
    as ``""``), the device to ``auto``.

    Raises:
        InputError: An unknown option or dtype.
    """
    name, _, options = spec.strip().partition(":")
    if name != "autocast":
        return None
    dtype, device = "", "auto"
    for part in filter(None, (p.strip() for p in options.split(","))):
        key, eq, value = part.partition("=")
        if not eq and key in ("fp16", "bf16"):
            dtype = key
        elif key == "device" and eq:
            device = value
        else:
            raise InputError(f"--runner {spec}: expected autocast[:fp16|bf16][,device=cpu|"
                             f"cuda|auto], got {part!r}")
    return dtype, device


def autocast_recording(module: torch.nn.Module, samples: Any, spec: str, target: str,
                       input_names: Sequence[str], output_names: Sequence[str],
                       max_samples: int | None = None) -> Recording:
    """The module's outputs under ``torch.autocast`` as a recorded candidate: what
    ``diagnose(module, samples, runner="autocast:fp16")`` compares against its FP32 reference,
    with the emulated strongly typed model of ``target`` as the cross-check.

    Args:
        module: The ``torch.nn.Module`` (run in eval mode; copied to the device if needed).
        samples: Its samples, as given to ``diagnose``.
        spec: ``autocast[:fp16|bf16][,device=...]`` (:func:`parse_autocast_runner`).
        target: The diagnosed precision (``"fp16"``/``"bf16"``): the dtype when the spec
            names none.
        input_names / output_names: The exported model's inputs and outputs, in order.
        max_samples: Use the first N samples.

    Returns:
        A :class:`~precision_doctor.inputs.recording.Recording`, one iteration per sample,
        format ``autocast``, runner ``torch-autocast-<dtype>-<device>``.

    Raises:
        InputError: A bad spec, or a target autocast has no dtype for (TF32, FP32).
        BackendUnavailable: torch missing; CUDA asked for without a GPU.
        BackendError: The module failed under autocast.
    """
    parsed = parse_autocast_runner(spec)
    if parsed is None:
        raise InputError(f"not an autocast runner: {spec!r}")
    dtype = parsed[0] or target
    if dtype not in ("fp16", "bf16"):
        raise InputError(f"--runner {spec} runs torch.autocast in fp16 or bf16, not {dtype}: "
                         "name the dtype (autocast:fp16) or diagnose --target fp16|bf16")
    items = call_items(samples, max_samples)
    runner = AutocastRunner(module, items[0], input_names=input_names,
                            output_names=output_names, dtype=dtype,
                            device=autocast_device(parsed[1]))
    with runner:
        iterations = tuple(runner.call(args, kwargs) for args, kwargs in items)
    return Recording(source="torch.autocast", format="autocast", runner=runner.name,
                     iterations=iterations,
                     notes=(f"the module run under torch.autocast({runner.device!r}, "
                            f"dtype=torch.{DTYPES[dtype]}) on the same samples",))


def with_autocast_causes(report: Any, module: torch.nn.Module, samples: Any, spec: str,
                         max_samples: int | None = None) -> Any:
    """``report`` (the diagnosis of an autocast candidate) with ``recording["autocast"]``:
    :func:`compare_autocast` of its findings, which of them autocast already avoids (its
    float32 op lists: softmax, layer_norm, group_norm ...) and which it does not (a sum of
    squares written by hand, a sin/cos of a large argument), each measured by keeping the
    finding's module in float32 under autocast.

    Raises:
        BackendError: The module failed under autocast.
    """
    from dataclasses import replace

    parsed = parse_autocast_runner(spec)
    assert parsed is not None and report.recording is not None
    dtype = parsed[0] or report.target
    comparison = compare_autocast(module, samples, dtype=dtype, device=parsed[1],
                                  diagnosis=report, max_samples=max_samples)
    return replace(report, recording={**report.recording, "autocast": comparison.to_dict()})
