"""A PyTorch module as the model: ``export_module``, ``sources`` and the routing that lets
``diagnose``/``fix`` take ``(module, samples)``.

The module is exported once with ``torch.onnx.export(..., dynamo=True)``
(``graph.torch_export``); its samples become the ONNX feeds, and everything after that is the
ONNX path, unchanged. The exporter's per-node metadata maps a node back to the Python line and
module (``graph.source``).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from precision_doctor.api.options import DataLike, ModelLike, ModuleLike, as_model
from precision_doctor.errors import InputError
from precision_doctor.graph.source import Source
from precision_doctor.graph.source import sources as node_sources
from precision_doctor.graph.torch_export import (
    ExportedModule,
    import_torch,
    is_torch_module,
)
from precision_doctor.graph.torch_export import export_module as export_torch

if TYPE_CHECKING:  # torch is an optional extra: not imported at runtime
    import torch


def export_module(module: torch.nn.Module, samples: Any, *, max_samples: int | None = None
                  ) -> ExportedModule:
    """Export a ``torch.nn.Module`` to ONNX as ``diagnose``/``fix`` do, and its samples to
    feeds: the model to keep, diagnose again or read :func:`sources` from.

    Args:
        module: A ``torch.nn.Module`` computing in float32 (exported in eval mode; its mode is
            restored).
        samples: Each item one call's inputs: a tuple of positional arguments, a dict of
            keyword arguments, or one tensor; a list, or any iterable such as a
            ``DataLoader`` yielding only the inputs. Axes whose sizes differ between the
            samples are exported as dynamic.
        max_samples: Use the first N items.

    Returns:
        :class:`~precision_doctor.graph.torch_export.ExportedModule`: ``model``
        (``onnx.ModelProto`` with the exporter's per-node metadata), ``feeds`` (one
        ``{input name: np.ndarray}`` per sample), ``dynamic`` (input -> dynamic axes),
        ``seconds`` (the export's wall time).

    Raises:
        InputError: torch is not installed (``pip install "precision-doctor[torch]"``), no
            samples, samples that do not fit ``forward``, or the export fails (the message
            names the first operator without an ONNX translation).
    """
    if not is_torch_module(module):
        raise InputError(f"export_module takes a torch.nn.Module; got {type(module).__name__}")
    return export_torch(module, samples, max_samples)


def sources(model: ModelLike) -> dict[str, Source]:
    """Node name -> where it came from in the PyTorch source (file, line, code, module path).

    Read from the dynamo exporter's per-node metadata (``pkg.torch.onnx.stack_trace``: the
    innermost frame outside torch; ``pkg.torch.onnx.name_scopes``: the module path), or, for
    a TorchScript export, from the node names (``/encoder/layer.3/attention/MatMul`` ->
    module ``encoder.layer.3.attention``). Needs no torch.

    Args:
        model: An ONNX model (path, ``onnx.ModelProto`` or ``onnx_ir.Model``), e.g.
            ``export_module(...).model``.

    Returns:
        ``{node name: Source}`` for the nodes whose origin is known (nodes are named as
        ``diagnose`` names them).

    Raises:
        ModelLoadError: The model cannot be read.
    """
    return node_sources(as_model(model)[0])


def module_input(model: ModuleLike, data: Any, max_samples: int | None
                 ) -> tuple[ModelLike, DataLike, dict[str, Any] | None]:
    """``(model, data)`` unchanged, or, for a ``torch.nn.Module``, its export: the ONNX model,
    one feed dict per sample, and what the report says about the export.

    Raises:
        InputError: As for :func:`export_module`.
    """
    if not is_torch_module(model):
        return cast(ModelLike, model), data, None
    exported = export_torch(model, data, max_samples)
    return exported.model, list(exported.feeds), exported.info(type(model).__name__)


def load_module(spec: str) -> Any:
    """The module named by ``package.module:factory`` (the CLI's MODEL): ``factory`` is a
    ``torch.nn.Module`` or a callable returning one (called without arguments). The current
    folder is searched too, as ``python -m`` does.

    Raises:
        InputError: torch missing, the module cannot be imported, no such attribute, or it
            is not (and does not make) a ``torch.nn.Module``.
    """
    import_torch()
    name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the folder it runs in
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise InputError(f"{spec}: cannot import {name} ({exc}); run from the folder that "
                         "holds it, or install it or add its folder to PYTHONPATH") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InputError(f"{spec}: {name} has no attribute {attr}")
        target = getattr(target, part)
    made = target if is_torch_module(target) else target() if callable(target) else target
    if not is_torch_module(made):
        raise InputError(f"{spec} is not a torch.nn.Module nor a function returning one "
                         f"(got {type(made).__name__})")
    return made


def load_sample_file(path: str | os.PathLike) -> Any:
    """Samples saved with ``torch.save``: a list of argument tuples or keyword dicts of
    tensors (read with ``weights_only=True``: tensors and containers, no code).

    Raises:
        InputError: torch missing, the file is missing, or it is not such a file.
    """
    torch = import_torch()
    p = Path(path)
    if not p.is_file():
        raise InputError(f"samples file not found: {p} (save a list of argument tuples with "
                         "torch.save(samples, path))")
    try:
        return torch.load(p, weights_only=True)
    except Exception as exc:  # pickle/zip errors of many types
        raise InputError(f"{p} is not a torch.save file of tensors ({exc})") from None


def cli_model(model: str | os.PathLike, data: str | None) -> tuple[Any, Any]:
    """The CLI's MODEL and ``--data``: unchanged for a model file; for
    ``package.module:factory``, the module and the samples of the ``torch.save`` file
    ``--data`` names.

    Raises:
        InputError: As for :func:`load_module` and :func:`load_sample_file`, or no ``--data``.
    """
    if not is_module_spec(model):
        return model, data
    if data is None:
        raise InputError(f"{model} is a PyTorch module: --data must name its samples, a "
                         "torch.save file of a list of argument tuples or keyword dicts")
    return load_module(os.fspath(model)), load_sample_file(data)


def is_module_spec(text: str | os.PathLike) -> bool:
    """Whether the CLI's MODEL is ``package.module:factory`` rather than a file."""
    text = os.fspath(text)
    name, sep, attr = text.partition(":")
    return bool(sep) and not Path(text).exists() and all(
        p.isidentifier() for p in (*name.split("."), *attr.split(".")))
