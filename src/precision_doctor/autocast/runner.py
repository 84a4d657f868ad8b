"""``AutocastRunner``: a ``torch.nn.Module`` run under ``torch.autocast`` (float16 or
bfloat16, on CUDA or the CPU), optionally with chosen submodules kept in float32
(``autocast.hooks``), or in float32 without autocast (the reference).

It implements the ``Runner`` protocol over the exported ONNX model's feeds: a feed dict's
arrays replace, in order, the tensors of an example call ``(args, kwargs)`` (the order in
which the dynamo exporter names its inputs: the call flattened with ``torch.utils._pytree``);
the outputs are the tensors of the module's output flattened the same way, named as the ONNX
model names its outputs. ``call(args, kwargs)`` runs one call directly.

Construction is cheap; ``__enter__`` imports torch, copies the module to the device when it
is not there (the caller's module is never moved) and puts it in eval mode (restored on
``__exit__``).
"""

from __future__ import annotations

import copy
from contextlib import ExitStack
from typing import Any, Sequence

import numpy as np

from precision_doctor.autocast.hooks import import_torch, keep_fp32
from precision_doctor.errors import BackendError, BackendUnavailable, InputError
from precision_doctor.runners.base import Feeds, TensorMeta

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def autocast_device(device: str = "auto") -> str:
    """``"cuda"``/``"cuda:N"``/``"cpu"`` as given; ``"auto"``: ``"cuda"`` when torch sees a GPU,
    else ``"cpu"``.

    Raises:
        BackendUnavailable: torch is missing, or CUDA is asked for and torch sees no GPU.
        InputError: Another device name.
    """
    torch = import_torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise InputError(f"device must be cpu, cuda, cuda:N or auto, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailable(f"device {device}: torch sees no CUDA GPU (torch "
                                 f"{torch.__version__}); use device='cpu'")
    return device


class AutocastRunner:
    """A module run under ``torch.autocast`` (or in float32 when ``dtype`` is None).

    Args:
        module: A ``torch.nn.Module`` computing in float32.
        example: One call ``(args, kwargs)``: the structure every ``run`` fills with its feeds.
        input_names: The names of the example's tensors, in flattened order (the exported
            model's inputs); default ``input_0``, ``input_1`` ...
        output_names: The names of the output tensors, in flattened order (the exported
            model's outputs); default ``output_0`` ...
        dtype: ``"fp16"``, ``"bf16"`` or None (float32, no autocast).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (see :func:`autocast_device`).
        fp32_modules: Module path patterns kept in float32 under autocast.
    """

    def __init__(self, module: Any, example: tuple[tuple, dict], *,
                 input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None, dtype: str | None = "bf16",
                 device: str = "cpu", fp32_modules: Sequence[str] = ()) -> None:
        if dtype is not None and dtype not in DTYPES:
            raise InputError(f"autocast dtype must be fp16 or bf16, got {dtype!r}")
        self._module, self._example = module, example
        self._inputs, self._outputs = input_names, output_names
        self.dtype, self.device, self.fp32_modules = dtype, device, tuple(fp32_modules)
        kept = f"-fp32[{','.join(self.fp32_modules)}]" if self.fp32_modules else ""
        self.name = f"torch-autocast-{dtype}-{device}{kept}" if dtype else f"torch-fp32-{device}"
        self._stack: ExitStack | None = None
        self._torch: Any = None
        self._run_module: Any = None

    def __enter__(self) -> AutocastRunner:
        torch = self._torch = import_torch()
        module = self._module
        where = torch.device(self.device)
        if any(p.device != where for p in module.parameters()):
            module = copy.deepcopy(module).to(where)
        stack = ExitStack()
        was_training = module.training
        stack.callback(module.train, was_training)
        module.eval()
        if self.dtype is not None:
            stack.enter_context(keep_fp32(module, self.fp32_modules))
        self._run_module, self._stack = module, stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack = self._run_module = None

    def input_metadata(self) -> list[TensorMeta]:
        torch = import_torch()
        leaves, _ = torch.utils._pytree.tree_flatten(self._example)
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        names = self._inputs or [f"input_{i}" for i in range(len(tensors))]
        return [TensorMeta(n, np.dtype(str(t.dtype).removeprefix("torch.").replace(
            "bfloat16", "float32")), tuple(t.shape)) for n, t in zip(names, tensors)]

    def output_names(self) -> list[str]:
        if self._outputs is None:
            raise InputError("this AutocastRunner was made without output names: run it "
                             "once with call() to see its outputs")
        return list(self._outputs)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run one call whose tensors are ``feeds`` (by the input names, in order).

        Raises:
            InputError: A feed is missing.
            BackendError: The module failed.
        """
        torch = self._require()
        names = [m.name for m in self.input_metadata()]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise InputError(f"feeds lack inputs {missing} of {self.name}")
        leaves, spec = torch.utils._pytree.tree_flatten(self._example)
        given = iter(names)
        filled = [torch.from_numpy(np.ascontiguousarray(feeds[next(given)]))
                  if isinstance(v, torch.Tensor) else v for v in leaves]
        args, kwargs = torch.utils._pytree.tree_unflatten(filled, spec)
        return self.call(args, kwargs)

    def call(self, args: tuple, kwargs: dict) -> dict[str, np.ndarray]:
        """Run one call; its tensors go to the device.

        Returns:
            Output name -> float32 array (float64 outputs stay float64; integer and boolean
            outputs keep their dtype), in flattened output order.

        Raises:
            BackendError: The module failed (the message names the runner).
        """
        torch = self._require()
        to = torch.utils._pytree.tree_map(
            lambda v: v.to(self.device) if isinstance(v, torch.Tensor) else v, (args, kwargs))
        try:
            with torch.no_grad(), ExitStack() as scope:
                if self.dtype is not None:
                    scope.enter_context(torch.autocast(
                        self.device.split(":")[0], dtype=getattr(torch, DTYPES[self.dtype])))
                out = self._run_module(*to[0], **to[1])
        except InputError:
            raise
        except Exception as exc:  # torch raises many types; one BackendError names the runner
            raise BackendError(f"{self.name} failed: {type(exc).__name__}: {exc}") from exc
        tensors = [v for v in torch.utils._pytree.tree_flatten(out)[0]
                   if isinstance(v, torch.Tensor)]
        names = self._outputs or [f"output_{i}" for i in range(len(tensors))]
        if len(names) != len(tensors):
            raise BackendError(f"{self.name}: the module returned {len(tensors)} tensors, "
                               f"expected {len(names)} ({list(names)})")
        return {n: _numpy(torch, t) for n, t in zip(names, tensors)}

    def _require(self) -> Any:
        if self._run_module is None:
            raise BackendError(f"{self.name} is not open: use it in a with block")
        return self._torch


def _numpy(torch: Any, tensor: Any) -> np.ndarray:
    t = tensor.detach().cpu()
    if t.is_floating_point() and t.dtype != torch.float64:
        t = t.float()
    return t.numpy()
