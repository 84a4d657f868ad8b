"""Turn the public API's flexible arguments into the library's types.

A ``model`` is a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``; ``data`` is what the CLI's
``--data`` takes, or samples held in memory; a tolerance is text, a number, a ``Tolerance`` or a
mapping per output; progress goes to a callback, a rich bar on a terminal, or nowhere.
"""

from __future__ import annotations

import itertools
import os
import shlex
import sys
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

import numpy as np
import onnx
import onnx_ir as ir

from precision_doctor.compare.tasks.registry import get_metric
from precision_doctor.compare.tolerance import Tolerance, default_tolerance
from precision_doctor.errors import InputError, InputNameError, MetricError, ModelLoadError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import input_metadata, load_model, name_nodes
from precision_doctor.inputs import PreprocessSpec, Sample, check_sample, load_samples
from precision_doctor.precision.plan import PrecisionPlan, select_nodes
from precision_doctor.search.objective import Objective

if TYPE_CHECKING:  # torch is an optional extra: never imported at runtime here
    import torch

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: ``stage`` names the step (``reference``, ``candidate``,
``layerwise``, ``search``), ``done`` of ``total`` units (samples, chunks or evaluations)."""

ModelLike = Union[str, "os.PathLike[str]", onnx.ModelProto, ir.Model]
"""A model path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``."""

ModuleLike = Union[ModelLike, "torch.nn.Module"]
"""What ``diagnose``/``fix`` take: an ONNX model (``ModelLike``) or a ``torch.nn.Module`` (exported
with ``torch.onnx.export(dynamo=True)``, ``api.pytorch``); torch is needed only for the latter."""

DataLike = Union[str, "os.PathLike[str]", np.ndarray, Mapping[str, Any], Iterable[Any]]
"""``--data`` text or path, one feed dict, one array, or an iterable of feed dicts/arrays."""

ToleranceLike = Union[None, float, str, Tolerance, Sequence[str], Mapping[str, Any]]


def invocation() -> str:
    """The command line that produced this run, shell-quoted (for "reproduce" sections)."""
    return shlex.join(["precision-doctor", *sys.argv[1:]])


def parse_precision(text: str | Precision) -> Precision:
    """``Precision.parse`` with an ``InputError`` (``fp16``, ``bf16``, ``tf32``, ``fp32``).

    Raises:
        InputError: Unknown precision name.
    """
    if isinstance(text, Precision):
        return text
    try:
        return Precision.parse(text)
    except ValueError as exc:
        from precision_doctor.quant.qformats import parse_quant_target

        if parse_quant_target(text) is not None:
            raise InputError(f"{text} is a quantized format: use "
                             f"precision_doctor.diagnose_quantized / fix_quantized "
                             f"(target={text!r}; the CLI's --target {text} does)") from None
        raise InputError(f"{exc} (int8 or fp8 for a quantized model)") from None


def as_model(model: ModelLike) -> tuple[onnx.ModelProto, str | None]:
    """The model as a proto with every node named, and its path when it came from a file.

    A given ``onnx.ModelProto`` is copied (node naming never touches the caller's object); an
    ``onnx_ir.Model`` is serialized to a proto.

    Raises:
        ModelLoadError: Unreadable file, a model without nodes, or an unsupported object.
    """
    if isinstance(model, (str, os.PathLike)):
        return load_model(model), os.fspath(model)
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    elif isinstance(model, ir.Model):
        proto = ir.serde.serialize_model(model)
    else:
        raise ModelLoadError(f"model must be a path, an onnx.ModelProto or an onnx_ir.Model; got "
                             f"{type(model).__name__}")
    if not proto.graph.node:
        raise ModelLoadError("the model has no nodes: is it an ONNX model?")
    return name_nodes(proto), None


def as_samples(data: DataLike | None, model: onnx.ModelProto,
               preprocess: PreprocessSpec | str | None = None,
               max_samples: int | None = None) -> list[Sample]:
    """Validated samples from a data source or from samples in memory.

    Args:
        data: A ``--data`` source (image file/folder/glob with ``preprocess``, ``.npy``/``.npz``
            file or folder, Polygraphy inputs JSON, ``random:...``); or in memory: one feed dict
            (input name -> array), one ``np.ndarray`` (single-input models), or an iterable of
            either (one sample each; ``Sample`` objects are accepted too).
        model: The model whose inputs the feeds must fit.
        preprocess: Preprocessing spec, for image sources only.
        max_samples: Keep the first N samples.

    Returns:
        Samples named by file (``img.png``) or, in memory, ``data[i]``; feeds cast to the
        model's input dtypes.

    Raises:
        InputError: No data, an empty iterable, or ``preprocess`` with in-memory data.
        InputNameError: Feed names that do not match the inputs, or a bare array for a model
            with several inputs.
        InputShapeError: Wrong rank, shape or dtype (see ``inputs.check_feeds``).
        DataFormatError: A file that does not decode.
    """
    inputs = input_metadata(model)
    if data is None:
        raise InputError("data is required: an image folder (with preprocess), .npy/.npz, "
                         "Polygraphy inputs JSON, random:... for seeded random inputs, or "
                         "feed dicts / arrays in memory")
    if isinstance(data, (str, os.PathLike)):
        return load_samples(data, inputs, preprocess, max_samples)
    if preprocess is not None:
        raise InputError("preprocess applies to image files only; in-memory samples must be "
                         "ready model tensors")
    if max_samples is not None and max_samples < 1:
        raise InputError(f"max_samples must be >= 1, got {max_samples}")
    items: Iterable[Any] = [data] if isinstance(data, (np.ndarray, Mapping)) else data
    samples = []
    for i, item in enumerate(itertools.islice(items, max_samples)):
        name = getattr(item, "name", None) or f"data[{i}]"
        feeds = getattr(item, "feeds", item)
        if not isinstance(feeds, Mapping):
            if len(inputs) != 1:
                raise InputNameError(
                    f"{name}: a bare array feeds single-input models only; this model has "
                    f"inputs {[m.name for m in inputs]}: pass dicts {{input name: array}}",
                    sample=name)
            feeds = {inputs[0].name: feeds}
        samples.append(check_sample(name, feeds, inputs,
                                    source_size=getattr(item, "source_size", None),
                                    input_size=getattr(item, "input_size", None),
                                    input_box=getattr(item, "input_box", None)))
    if not samples:
        raise InputError("data holds no samples: give at least one feed dict or array")
    return samples


def parse_tolerances(items: ToleranceLike, target: Precision) -> dict[str, Tolerance]:
    """Output name (``*`` = all) -> tolerance.

    Args:
        items: None (the target's default); a number (relative L2 bound); text
            ``rel_l2=1e-2,atol=1e-3,rtol=1e-3,statistic=p99`` or ``OUTPUT:rel_l2=...``; a list
            of such texts; a ``Tolerance``; or a mapping output -> ``Tolerance`` or text.

    Returns:
        An empty dict for None; unspecified keys fall back to the target's default.

    Raises:
        InputError: Unknown key or bad number.
    """
    if items is None:
        return {}
    if isinstance(items, Tolerance):
        return {"*": items}
    if isinstance(items, (int, float)):
        return {"*": Tolerance(float(items))}
    if isinstance(items, Mapping):
        return {name: tol if isinstance(tol, Tolerance)
                else _parse_one(str(tol), default_tolerance(target), name)
                for name, tol in items.items()}
    result: dict[str, Tolerance] = {}
    for item in [items] if isinstance(items, str) else items:
        head, _, _ = item.partition("=")
        name, sep, _ = head.rpartition(":")
        output, spec = (name, item[len(name) + 1:]) if sep else ("*", item)
        result[output] = _parse_one(spec, result.get("*", default_tolerance(target)), item)
    return result


def _parse_one(spec: str, base: Tolerance, shown: str) -> Tolerance:
    try:
        return Tolerance.parse(spec, base)
    except ValueError as exc:
        raise InputError(f"tolerance {shown!r}: {exc}") from None


def build_plan(model: onnx.ModelProto, target: Precision, plan: PrecisionPlan | str |
               os.PathLike | None, keep: Sequence[str]) -> PrecisionPlan:
    """The plan to emulate: a plan (or its JSON file), or everything in ``target``; then
    ``keep`` (exact node names or op types such as ``LayerNormalization``) in FP32.

    Raises:
        PlanError: A ``keep`` entry matches no node or op type, or the plan is invalid.
    """
    if plan is None:
        result = PrecisionPlan(target)
    else:
        result = plan if isinstance(plan, PrecisionPlan) else PrecisionPlan.load(plan)
    names = select_nodes(model, keep, "--keep")
    if names:
        result = result.keep_fp32(names, "user", "--keep")
    result.validate(model)
    return result


def labelled_objective(objective: Objective, model: onnx.ModelProto, samples: Sequence[Sample],
                       labels: str | os.PathLike | None
                       ) -> tuple[Objective, Callable[[Mapping[str, Any]], dict] | None]:
    """The objective with each sample's labels in its context, and the accuracy function
    (``runs -> task_accuracy``) for the side-by-side report; unchanged and None without labels.

    COCO category ids are mapped to the model's classes by name when the model stores class
    names (ultralytics ``names``).

    Raises:
        InputError: The labels file is missing or malformed, or matches no sample.
    """
    from precision_doctor.compare.tasks.accuracy import task_accuracy
    from precision_doctor.compare.tasks.labels import load_labels
    from precision_doctor.compare.tasks.registry import sample_context
    from precision_doctor.diagnosis.detections import class_names

    if labels is None:
        return objective, None
    table = load_labels(labels).with_class_names(class_names(model))
    truths = table.for_samples([s.name for s in samples])
    contexts = tuple({**sample_context(s), **({"ground_truth": t} if t is not None else {})}
                     for s, t in zip(samples, truths))
    options = dict(objective.metric.params) if objective.metric is not None else {}

    def accuracy(runs: Mapping[str, Any]) -> dict:
        return {"labels": str(labels), **task_accuracy(runs, contexts, options)}

    return replace(objective, contexts=contexts), accuracy


def build_objective(tolerance: ToleranceLike, metric: str | None, threshold: float | None,
                    target: Precision) -> Objective:
    """A task-metric objective when ``metric`` is given, else a tolerance objective.

    Raises:
        MetricError: Unknown metric, or one without a default threshold and none given.
        InputError: ``threshold`` without ``metric``, or a bad tolerance.
    """
    if metric:
        m = get_metric(metric)
        if threshold is None and m.default_threshold is None:
            raise MetricError(f"metric {metric!r} has no default threshold: pass --threshold")
        return Objective(metric=m, threshold=threshold)
    if threshold is not None:
        raise InputError("a threshold (--threshold) is the pass mark of a task metric: give "
                         "the metric too (--metric), or drop the threshold")
    return Objective(tolerances=parse_tolerances(tolerance, target)
                     or {"*": default_tolerance(target)})


@contextmanager
def progress_reporter(progress: Progress | None, quiet: bool) -> Iterator[Progress | None]:
    """The callback the library calls: ``progress`` when given; else a rich bar on stderr when
    it is a terminal; nothing when ``quiet`` or not attached to a terminal."""
    if quiet:
        yield None
        return
    if progress is not None:
        yield progress
        return
    from rich.console import Console

    from precision_doctor.report.terminal.progress import progress_bar

    console = Console(stderr=True)
    with progress_bar(console, enabled=console.is_terminal) as bar:
        yield bar
