"""Which runner verifies a model that ``fix`` wrote, and why.

``fix`` runs the written strongly typed model against the FP32 reference before it reports a
verdict. The runner, in this order:

1. The runner the search evaluated with (``--runner ort:cuda,tf32=0``): the engine the user
   deploys on ran this very model.
2. A model with BF16 or FP16 tensors: ONNX Runtime CUDA (``use_tf32=0``, so FP32 nodes stay
   FP32) when this onnxruntime has the CUDA execution provider; ONNX Runtime CPU when it has a
   kernel in that format for every such node (``runners.kernels.registry``; the x86 wheels have
   none for Conv, MatMul, Add, ... in either); otherwise the exact emulation of the written
   model (``WrittenEmulatorRunner``: its Casts, every BF16/FP16 tensor rounded to its format,
   round-to-nearest-even). ONNX Runtime CPU opens an FP16 model whatever its kernels, but runs
   an FP16 node it has no kernel for in FP32, and the FP16 rounding of its outputs is lost
   (seen in its results; the Cast pairs it inserts around such a node are presumably removed
   as redundant): PP-OCRv4 cls written all-FP16 came out 1.1e-6
   from FP32 on it, 6.1e-5 in its exact emulation; det 4.6e-3 against 7.8e-3, rec 3.4e-4
   against 6.8e-4 (``benchmarks/fp16_verifiers.py``). Such a run is
   not an FP16 verification.
3. An FP32 model: ONNX Runtime CPU.

A runner that cannot open the model because it has no kernel for a node, or whose provider
cannot start, is skipped and the reason kept (``VerifiedBy.skipped``); any other failure is
raised: it is a real problem of the written model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from precision_doctor.errors import BackendError
from precision_doctor.formats import Precision
from precision_doctor.precision.conv_bias import FUSED, SEPARATE
from precision_doctor.precision.emulate_written import low_precision_formats
from precision_doctor.runners.base import Feeds, Runner, TensorMeta
from precision_doctor.runners.emulator import WrittenEmulatorRunner
from precision_doctor.runners.kernels.registry import (
    describe_missing,
    is_missing_kernel,
    missing_kernels,
)
from precision_doctor.runners.ort import OrtRunner
from precision_doctor.runners.ort_options import CPU, CUDA, TENSORRT, ort_providers, parse_ort_spec

EMULATE_WRITTEN = "emulate-written"
CUDA_SPEC = "ort:cuda,tf32=0"
_PROVIDER_WORDS = {CPU: "CPU", CUDA: "CUDA", TENSORRT: "TensorRT EP"}


@dataclass(frozen=True)
class VerifiedBy:
    """The runner that verified a written model, and why (``fix``'s JSON ``verification``).

    Attributes:
        runner: Its label in reports (``ort-cpu-fixed``, ``ort-cuda-fixed``,
            ``emulate-written-bf16``, or the ``--runner`` spec of the search).
        spec: How to build it again: an ONNX Runtime spec (``ort:cpu``, ``ort:cuda,tf32=0``,
            the search's ``--runner``) or ``emulate-written``.
        reason: Why this runner.
        skipped: ``(runner, why not)`` for the runners tried or ruled out before it.
        engine: The deployment engine the model was written for and what that kept FP32
            (``fix --engine ort-cuda``: "written for ONNX Runtime CUDA: 13 nodes kept FP32
            (no BF16 kernel there for GlobalAveragePool x10, MaxPool x3)"); "" without one.
    """

    runner: str
    spec: str
    reason: str
    skipped: tuple[tuple[str, str], ...] = ()
    engine: str = ""

    @property
    def title(self) -> str:
        """The runner in words: ``ONNX Runtime CPU``, ``ONNX Runtime CUDA``, ``its exact
        emulation on ONNX Runtime CPU``; the label itself for other runners."""
        if self.spec == EMULATE_WRITTEN:
            return "its exact emulation on ONNX Runtime CPU"
        if self.spec.startswith("ort"):
            try:
                provider = parse_ort_spec(self.spec).provider
            except BackendError:
                return self.runner
            return "ONNX Runtime " + _PROVIDER_WORDS.get(provider, provider)
        return self.runner

    def describe(self) -> str:
        """One line: the runner, why, and why not the others; the engine written for."""
        text = f"{self.runner}: {self.reason}"
        text += "".join(f"; not {r}: {why}" for r, why in self.skipped)
        return text + (f"; the model was {self.engine}" if self.engine else "")

    def to_dict(self) -> dict[str, Any]:
        return {"runner": self.runner, "spec": self.spec, "reason": self.reason,
                "skipped": [{"runner": r, "reason": why} for r, why in self.skipped],
                "engine": self.engine}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VerifiedBy:
        """Inverse of ``to_dict``."""
        return cls(str(data["runner"]), str(data["spec"]), str(data["reason"]),
                   tuple((str(s["runner"]), str(s["reason"])) for s in data.get("skipped", ())),
                   str(data.get("engine", "")))


@dataclass(frozen=True)
class _Option:
    runner: Runner
    spec: str
    reason: str
    skip: Callable[[BackendError], bool]
    hint: str = ""  # added to the reason it was skipped for a missing kernel


def _never(exc: BackendError) -> bool:
    return False


def _always(exc: BackendError) -> bool:
    return True


def _no_kernel(exc: BackendError) -> bool:
    return is_missing_kernel(str(exc))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class VerifyingRunner:
    """A runner over the written model that opens the first option able to run it.

    After ``__enter__``, ``name`` is the chosen runner's and ``verified_by`` says which and
    why (it stays after ``__exit__``). Build it with :func:`verifying_runner`.

    Raises:
        BackendError: (on ``__enter__``) an option failed for another reason than a missing
            kernel or provider, or every option was skipped.
    """

    def __init__(self, options: Sequence[_Option], ruled_out: Sequence[tuple[str, str]] = (),
                 engine: str = "") -> None:
        self.options = list(options)
        self.ruled_out = list(ruled_out)
        self.engine = engine
        self.name = self.options[0].runner.name if self.options else "verify"
        self.verified_by: VerifiedBy | None = None
        self._open: Runner | None = None

    def __enter__(self) -> VerifyingRunner:
        skipped = list(self.ruled_out)
        for option in self.options:
            try:
                option.runner.__enter__()
            except BackendError as exc:
                if not option.skip(exc):
                    raise
                hint = option.hint if option.hint and _no_kernel(exc) else ""
                skipped.append((option.runner.name, _first_line(exc) + hint))
                continue
            self._open = option.runner
            self.name = option.runner.name
            self.verified_by = VerifiedBy(option.runner.name, option.spec, option.reason,
                                          tuple(skipped), self.engine)
            return self
        raise BackendError("no runner could verify the written model: " + "; ".join(
            f"{r}: {why}" for r, why in skipped))

    def __exit__(self, *exc: object) -> None:
        if self._open is not None:
            self._open.__exit__(*exc)
            self._open = None

    def _runner(self) -> Runner:
        if self._open is None:
            raise BackendError(f"{self.name}: use the runner inside a `with` block")
        return self._open

    def input_metadata(self) -> Sequence[TensorMeta]:
        return self._runner().input_metadata()

    def output_names(self) -> Sequence[str]:
        return self._runner().output_names()

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        return self._runner().run(feeds)


def requested_verification(requested: Runner, spec: str | None = None,
                           reused: bool = False, engine: str = "") -> VerifiedBy:
    """``VerifiedBy`` of the runner the search evaluated with (``spec``: its ``--runner``,
    default its name); ``reused``: its final evaluation's outputs are the verification;
    ``engine``: the deployment engine note (``VerifiedBy.engine``)."""
    spec = spec or requested.name
    reason = f"the runner the search evaluated with (--runner {spec}), on this very model"
    return VerifiedBy(requested.name, spec, reason + (
        ": the search's final evaluation ran it, its outputs are reused" if reused else ""),
        engine=engine)


def verifying_runner(written: onnx.ModelProto, requested: Runner | None = None,
                     requested_spec: str | None = None, engine: str = "",
                     conv_bias: str = FUSED) -> VerifyingRunner:
    """The runner that verifies ``written`` (see the module docstring for the order).

    Args:
        written: The strongly typed model ``fix`` wrote.
        requested: A runner on ``written`` the user asked for (the search's ``--runner``);
            it is the only option then.
        requested_spec: Its spec for ``VerifiedBy.spec`` (default its name).
        engine: The deployment engine note for ``VerifiedBy.engine`` ("" without one).
        conv_bias: The engine's convolution bias model for the exact emulation
            (``precision.conv_bias``).

    Raises:
        UnsupportedModelError: Shape inference cannot type ``written``.
    """
    if requested is not None:
        asked = requested_verification(requested, requested_spec)
        return VerifyingRunner([_Option(requested, asked.spec, asked.reason, _never)],
                               engine=engine)
    cpu = OrtRunner(written, ("cpu",), name="ort-cpu-fixed")
    formats = low_precision_formats(written)
    if not formats:
        return VerifyingRunner([_Option(cpu, "ort:cpu", "the default verifier: ONNX Runtime "
                                        "CPU runs the written model as it is", _never)],
                               engine=engine)
    words = "/".join(f.value.upper() for f in sorted(formats, key=lambda f: f.value))
    options: list[_Option] = []
    ruled_out: list[tuple[str, str]] = []
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        cuda = OrtRunner(written, *ort_providers(CUDA_SPEC), name="ort-cuda-fixed")
        options.append(_Option(cuda, CUDA_SPEC, f"a GPU is present: ONNX Runtime CUDA runs the "
                               f"{words} model as written (use_tf32=0: FP32 nodes in FP32)",
                               _always, hint="" if engine else " (fix --engine ort-cuda writes "
                               "those nodes FP32)"))
    else:
        ruled_out.append(("ort-cuda-fixed", "this onnxruntime has no CUDA execution provider (on a "
                          "GPU machine with onnxruntime-gpu, fix verifies with it)"))
    why_not_cpu = _cpu_gaps(written, formats)
    if why_not_cpu:
        ruled_out.append(("ort-cpu-fixed", why_not_cpu))
    else:
        options.append(_Option(cpu, "ort:cpu", f"ONNX Runtime CPU has a {words} kernel for "
                               "every node of the written model", _no_kernel))
    options.append(_Option(WrittenEmulatorRunner(written, conv_bias=conv_bias), EMULATE_WRITTEN,
                           f"no engine here runs this {words} model in {words}, so the written "
                           "model is emulated exactly on ONNX Runtime CPU: its own Casts, every "
                           f"{words} tensor rounded to its format (round-to-nearest-even), FP32 "
                           "arithmetic inside each node" + ("; a convolution's bias added after "
                           "its output is rounded, as ONNX Runtime CUDA does"
                           if conv_bias == SEPARATE else ""), _never))
    return VerifyingRunner(options, ruled_out, engine)


def _cpu_gaps(written: onnx.ModelProto, formats: set[Precision]) -> str:
    """Why ONNX Runtime CPU cannot verify ``written`` ("" when it can): a BF16 node without a
    kernel stops it from opening the model; an FP16 node without one runs in FP32 with its
    FP16 rounding dropped (``runners.kernels.registry.missing_kernels``), so the run would not
    be FP16 arithmetic. When the kernel registry cannot be read, FP16 is refused (no way to
    tell), BF16 is tried (a missing kernel then fails loudly)."""
    parts = []
    for fmt in sorted(formats, key=lambda f: f.value):
        missing = missing_kernels(written, precision=fmt)
        name = fmt.value.upper()
        if missing:
            parts.append(f"ONNX Runtime CPU has no {name} kernel for " + describe_missing(missing)
                         + ("" if fmt is Precision.BF16 else ": it would run those nodes in "
                            "FP32 and drop their FP16 rounding"))
        elif missing is None and fmt is Precision.FP16:
            parts.append("this onnxruntime does not expose its kernel registry, so which FP16 "
                         "nodes ONNX Runtime CPU would run in FP32 cannot be told")
    return "; ".join(parts)


def verified_again(verified_by: VerifiedBy, model: onnx.ModelProto, conv_bias: str = FUSED
                   ) -> Runner:
    """A runner like the one that verified ``model`` (e.g. for an output-marked copy;
    ``conv_bias`` as for ``verifying_runner``).

    Raises:
        BackendError: ``verified_by.spec`` is not a runner spec this function knows.
    """
    if verified_by.spec == EMULATE_WRITTEN:
        return WrittenEmulatorRunner(model, name=verified_by.runner, conv_bias=conv_bias)
    providers, options = ort_providers(verified_by.spec)
    return OrtRunner(model, providers, options, name=verified_by.runner)
