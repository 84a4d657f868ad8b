"""A PyTorch module and its samples as an ONNX model and its feeds.

``export_module(module, samples)`` exports with ``torch.onnx.export(..., dynamo=True)``: the
first sample is the example input; every dimension whose size differs between the samples is
exported as dynamic (``torch.export.Dim.AUTO``), the others stay static. The dynamo
exporter records, per ONNX node, where it came from (``metadata_props``: the Python stack, the
module path, the module classes), which ``graph.source`` reads back. Each sample becomes a feed
dict ``{ONNX input name: np.ndarray}`` in the exporter's own order: the sample's arguments and
keyword arguments flattened (``torch.utils._pytree``), ``None`` left out.

torch is imported only here, and only when a module is exported: the package imports without it.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import re
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import onnx

from precision_doctor.errors import InputError

TORCH_HINT = 'pip install "precision-doctor[torch]"'

_OPERATOR = re.compile(r"op='([\w.:]+)'|torch\.ops\.([\w.]+)|(aten::\w+)")


@dataclass(frozen=True)
class ExportedModule:
    """An exported ``torch.nn.Module`` and its samples as ONNX feeds.

    Attributes:
        model: The ONNX model (opset of the exporter, per-node ``metadata_props``).
        feeds: One feed dict per sample, ``{input name: np.ndarray}`` (float32 for float32
            tensors; bfloat16 tensors are widened to float32).
        dynamic: Input name -> the axes exported as dynamic (sizes differ between samples).
        seconds: Wall time of ``torch.onnx.export``, in seconds.
        torch_version: ``torch.__version__`` of the export.
    """

    model: onnx.ModelProto = field(repr=False)
    feeds: tuple[dict[str, np.ndarray], ...] = field(repr=False)
    dynamic: dict[str, tuple[int, ...]]
    seconds: float
    torch_version: str

    def info(self, module_name: str) -> dict[str, Any]:
        """What a report says about the export (JSON-ready)."""
        return {"exported_from": module_name,
                "exporter": f"torch.onnx.export(dynamo=True), torch {self.torch_version}",
                "export_s": round(self.seconds, 3),
                "dynamic_axes": {k: list(v) for k, v in self.dynamic.items()}}


def is_torch_module(obj: object) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` (without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def import_torch(needs: str = "a PyTorch module", error: type[Exception] = InputError) -> Any:
    """``torch``, or ``error`` with the install hint.

    Args:
        needs: What needs torch, for the message (``"<needs> needs torch: pip install ..."``).
        error: The exception raised without torch (``BackendUnavailable`` for a runner).

    Raises:
        InputError: torch is not installed (or ``error``).
    """
    try:
        import torch
    except ImportError:
        raise error(f"{needs} needs torch: {TORCH_HINT}") from None
    return torch


def export_module(module: Any, samples: Any, max_samples: int | None = None) -> ExportedModule:
    """Export ``module`` to ONNX with the dynamo exporter and turn ``samples`` into feeds.

    The module is exported in eval mode (dropout off, batch-norm running statistics); its
    training mode is restored afterwards. Nothing else of it changes.

    Args:
        module: A ``torch.nn.Module`` computing in float32.
        samples: The inputs of ``module.forward``: a list (or any iterable, such as a
            ``DataLoader``) whose items are each one call's arguments: a tuple or list of
            positional arguments, a dict of keyword arguments, or a single tensor. Tensors of
            any shape, e.g. float32 ``[batch, seq, hidden]``; every item must have the same
            structure. One item that is a tuple, dict or tensor of tensors alone is one sample.
        max_samples: Use the first N items.

    Returns:
        :class:`ExportedModule`: the model, one feed dict per sample, the dynamic axes.

    Raises:
        InputError: torch is missing (with the install hint); no samples; a sample whose
            structure or number of arguments does not fit ``forward`` or the first sample; or
            the export fails (the message names the first operator without an ONNX
            translation when that is the cause, and what to do).
    """
    torch = import_torch()
    items = _items(samples, max_samples, torch)
    name = type(module).__name__
    args, kwargs = items[0]
    signature = _check_signature(module, args, kwargs, name)
    shapes = _dynamic_shapes(items, signature, torch)
    was_training = module.training
    start = time.perf_counter()
    try:
        module.eval()
        with torch.no_grad(), _exporter_quiet():
            program = torch.onnx.export(module, args, kwargs=kwargs or None, dynamo=True,
                                        dynamic_shapes=shapes, verbose=False, report=False)
    except Exception as exc:  # the exporter raises many types; one InputError names the cause
        raise export_error(exc, name) from exc
    finally:
        module.train(was_training)
    seconds = time.perf_counter() - start
    model = program.model_proto
    names = [i.name for i in model.graph.input
             if i.name not in {t.name for t in model.graph.initializer}]
    feeds = tuple(_feeds(a, k, names, torch, i) for i, (a, k) in enumerate(items))
    dynamic = {n: tuple(ax for ax in range(feeds[0][n].ndim)
                        if len({f[n].shape[ax] for f in feeds}) > 1) for n in names}
    return ExportedModule(model, feeds, {k: v for k, v in dynamic.items() if v}, seconds,
                          str(torch.__version__))


def call_items(samples: Any, max_samples: int | None = None) -> list[tuple[tuple, dict]]:
    """The samples as one ``(args, kwargs)`` pair per call, as :func:`export_module` reads them.

    Raises:
        InputError: torch is missing, no samples, or samples of different structures.
    """
    return _items(samples, max_samples, import_torch())


@contextmanager
def _exporter_quiet() -> Iterator[None]:
    """The exporter's notes about itself off (torchvision ops it skips, torch's own
    deprecations inside it); its errors still raise."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def export_error(exc: BaseException, module_name: str) -> InputError:
    """One ``InputError`` for a failed export: the first operator without an ONNX translation
    when the exporter names one, else the exporter's first line."""
    texts: list[str] = []
    cause: BaseException | None = exc
    while cause is not None and len(texts) < 8:
        texts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    for text in reversed(texts):  # the innermost cause names the operator
        match = _OPERATOR.search(text)
        if match and ("No ONNX function" in text or "translat" in text.lower()
                      or "not supported" in text.lower()):
            op = next(g for g in match.groups() if g)
            op = op.removesuffix(".default")
            return InputError(
                f"cannot export {module_name} to ONNX: operator {op} has no ONNX translation "
                "in torch.onnx.export(dynamo=True). Rewrite that call with supported "
                "operators, register a translation (custom_translation_table=...), or export "
                "the model yourself and pass the .onnx file", operator=op)
    first = next((line.strip() for line in texts[-1].splitlines() if line.strip()), type(exc)
                 .__name__)
    return InputError(
        f"cannot export {module_name} to ONNX with torch.onnx.export(dynamo=True): {first} "
        "(export it yourself, e.g. with report=True to see why, and pass the .onnx file)")


def _items(samples: Any, max_samples: int | None, torch: Any) -> list[tuple[tuple, dict]]:
    """The samples as ``(args, kwargs)`` pairs."""
    if max_samples is not None and max_samples < 1:
        raise InputError(f"max_samples must be >= 1, got {max_samples}")
    if samples is None:
        raise InputError("samples are required with a PyTorch module: a list of argument "
                         "tuples or keyword dicts of tensors (or a DataLoader)")
    single = isinstance(samples, (torch.Tensor, Mapping)) or (
        isinstance(samples, tuple) and all(isinstance(t, torch.Tensor) for t in samples))
    source: Iterable[Any] = [samples] if single else samples
    items: list[tuple[tuple, dict]] = []
    for item in itertools.islice(source, max_samples):
        if isinstance(item, Mapping):
            items.append(((), dict(item)))
        elif isinstance(item, (tuple, list)):
            items.append((tuple(item), {}))
        else:
            items.append(((item,), {}))
    if not items:
        raise InputError("samples hold no sample: give at least one argument tuple or dict")
    first: tuple[list[type], list[str]] = [type(v) for v in items[0][0]], list(items[0][1])
    for i, (args, kwargs) in enumerate(items[1:], 1):
        if ([type(a) for a in args], sorted(kwargs)) != (first[0], sorted(first[1])):
            raise InputError(f"sample {i} does not have the structure of sample 0 "
                             f"({len(args)} arguments {sorted(kwargs)} against "
                             f"{len(first[0])} {sorted(first[1])}): every sample must pass "
                             "the same arguments", sample=f"samples[{i}]")
        items[i] = (args, {k: kwargs[k] for k in first[1]})  # the first sample's order
    return items


def _check_signature(module: Any, args: tuple, kwargs: dict,
                     name: str) -> inspect.Signature | None:
    """``forward``'s signature; a sample it cannot take (a DataLoader's ``(x, label)`` pairs)
    is refused."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        params = ", ".join(signature.parameters)
        raise InputError(
            f"a sample of {len(args)} arguments {sorted(kwargs) or ''} does not fit "
            f"{name}.forward({params}): {exc}. Pass each call's inputs only, e.g. "
            "[(x,) for x, label in loader]") from None
    return signature


def _dynamic_shapes(items: list[tuple[tuple, dict]], signature: inspect.Signature | None,
                    torch: Any) -> dict[str, Any] | None:
    """``dynamic_shapes`` by ``forward``'s parameter names: ``Dim.AUTO`` on every axis whose
    size differs between the samples, the other axes static; None when no size differs."""
    if len(items) < 2 or signature is None:
        return None
    pytree = torch.utils._pytree
    bound = [signature.bind(*a, **k).arguments for a, k in items]
    shapes: dict[str, Any] = {}
    varies = False
    for param, value in bound[0].items():
        leaves, spec = pytree.tree_flatten(value)
        others = [pytree.tree_flatten(b[param])[0] for b in bound[1:]]
        specs: list[dict[int, Any] | None] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                specs.append(None)
                continue
            sizes = [leaf.shape] + [o[i].shape if i < len(o) and isinstance(o[i], torch.Tensor)
                                    else leaf.shape for o in others]
            axes = {ax: torch.export.Dim.AUTO for ax in range(leaf.ndim)
                    if len({tuple(s)[ax] if len(s) == leaf.ndim else -1 for s in sizes}) > 1}
            varies = varies or bool(axes)
            specs.append(axes)
        shapes[param] = pytree.tree_unflatten(specs, spec)
    return shapes if varies else None


def _feeds(args: tuple, kwargs: dict, names: list[str], torch: Any,
           index: int) -> dict[str, np.ndarray]:
    """One sample's tensors in the exporter's input order, as numpy arrays."""
    leaves, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    if len(tensors) != len(names):
        raise InputError(f"sample {index} has {len(tensors)} tensors; the exported model takes "
                         f"{len(names)} inputs {names}: pass tensors for exactly the inputs "
                         "(other values are fixed at export)", sample=f"samples[{index}]")
    feeds = {}
    for name, tensor in zip(names, tensors):
        t = tensor.detach().cpu()
        feeds[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return feeds
