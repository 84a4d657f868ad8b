"""Task metrics: does the candidate model still do the job the reference does?

A task metric is a pure function ``metric(reference, candidate, **params) -> float`` over the
outputs of the two runs on the same inputs (``output name -> array``); higher is better and 1.0
means identical behaviour (PSNR, in dB, is the one exception: ``inf`` when identical).

A metric is named by a spec string:

* a built-in, optionally with options: ``top1``, ``top5``, ``mask-iou:threshold=0.3``,
  ``db-boxes``, ``box-map:boxes=dets,iou=0.5``, ``ctc-string:charset=rec.onnx,ignore_case=true``,
  ``psnr``,
  ``ssim:data_range=1.0``, ``lsd`` (see :func:`list_metrics`);
* a user function ``module:function`` or ``path/to/file.py:function``, optionally followed by
  ``:key=value,...`` options passed to it as keyword arguments.

Option values cannot contain ``,``; ``true``/``false``/``none`` and numbers are converted.
Every built-in takes ``output=NAME`` (default: the first output).

Per-sample context: a metric function with a keyword parameter named in :data:`CONTEXT_KEYS`
also receives that fact about the sample, when known: for image inputs ``source_size`` (the
source image's ``(height, width)``), ``input_size`` (its ``(height, width)`` in the model
input) and ``input_box`` (where the resized image lies in it); ``ground_truth`` (the sample's
labels from ``--labels``). Such parameters are not spec options. Only a function that names
the parameter receives it: a ``**options`` catch-all does not (it would forward the fact to
functions that do not take it).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from precision_doctor.compare.tasks import audio as task_audio
from precision_doctor.compare.tasks import classification as task_classification
from precision_doctor.compare.tasks import coco as task_coco
from precision_doctor.compare.tasks import db as task_db
from precision_doctor.compare.tasks import detection as task_detection
from precision_doctor.compare.tasks import image as task_image
from precision_doctor.compare.tasks import labels as task_labels
from precision_doctor.compare.tasks import ocr as task_ocr
from precision_doctor.compare.tasks.io import parse_param_value
from precision_doctor.errors import MetricError, PrecisionDoctorError

MetricFn = Callable[..., float]
Outputs = Mapping[str, np.ndarray]

# Options that name outputs, files or modes: kept as text even when they look like numbers.
TEXT_OPTIONS = frozenset({"output", "boxes", "scores", "labels", "count", "charset", "layout",
                          "box_format", "head", "activation"})
# Facts about a sample passed to metric functions that declare them (not settable by a spec).
CONTEXT_KEYS = frozenset({"source_size", "input_size", "input_box", "ground_truth"})


@dataclass(frozen=True)
class TaskMetric:
    """A resolved task metric: the function and the options it is called with.

    Attributes:
        name: Built-in name (``mask-iou``) or ``target:function`` of a user function.
        fn: ``fn(reference, candidate, **params) -> float``.
        higher_is_better: Direction of the value (False for the ``*-drop`` built-ins).
        default_threshold: Suggested pass mark (project default, not from literature), or
            ``None`` for user functions.
        description: One line for help and reports.
        params: Options from the spec, sorted by name.
        spec: The spec string this was resolved from (what :meth:`from_dict` re-resolves).
    """

    name: str
    fn: MetricFn = field(repr=False, compare=False)
    higher_is_better: bool = True
    default_threshold: float | None = None
    description: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    spec: str = ""

    def __call__(self, reference: Outputs, candidate: Outputs,
                 context: Mapping[str, Any] | None = None) -> float:
        """Same as :func:`evaluate_metric`."""
        return evaluate_metric(self, reference, candidate, context)

    def meets(self, value: float, threshold: float | None = None) -> bool:
        """Whether ``value`` passes ``threshold`` (default :attr:`default_threshold`).

        Raises:
            MetricError: No threshold given and the metric has no default.
        """
        limit = self.default_threshold if threshold is None else threshold
        if limit is None:
            raise MetricError(f"task metric {self.name} has no default threshold; pass one")
        return value >= limit if self.higher_is_better else value <= limit

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the function itself is recorded by its spec)."""
        return {"name": self.name, "spec": self.spec, "higher_is_better": self.higher_is_better,
                "default_threshold": self.default_threshold, "description": self.description,
                "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskMetric:
        """Re-resolve the metric from its recorded spec (imports user functions again).

        Raises:
            MetricError: As :func:`get_metric`.
        """
        return get_metric(str(data["spec"]))


@dataclass(frozen=True)
class _Builtin:
    fn: MetricFn
    default_threshold: float
    description: str
    options: Mapping[str, Any]  # option -> default
    higher_is_better: bool = True


def _options(fn: MetricFn) -> dict[str, Any]:
    sig = inspect.signature(fn)
    return {n: p.default for n, p in sig.parameters.items()
            if p.kind is p.KEYWORD_ONLY and n not in CONTEXT_KEYS}


def sample_context(sample: Any) -> dict[str, Any]:
    """The facts of ``sample`` (its attributes named in :data:`CONTEXT_KEYS`) that are known."""
    return {k: getattr(sample, k) for k in sorted(CONTEXT_KEYS)
            if getattr(sample, k, None) is not None}


def _context_for(fn: MetricFn, context: Mapping[str, Any] | None) -> dict[str, Any]:
    """The facts of ``context`` that ``fn`` names as keyword parameters (a ``**options``
    catch-all receives none: it forwards its options to functions that may not take them)."""
    if not context:
        return {}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    named = {n for n, p in params.items()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in context.items()
            if k in CONTEXT_KEYS and v is not None and k in named}


BUILTINS: dict[str, _Builtin] = {
    "top1": _Builtin(task_classification.top1_agreement, 0.99,
                     "share of positions with the same argmax class (class axis: axis=-1)",
                     _options(task_classification.top1_agreement)),
    "top5": _Builtin(task_classification.top5_agreement, 0.99,
                     "share of positions whose reference top-1 class is in the candidate top-5",
                     _options(task_classification.top5_agreement)),
    "mask-iou": _Builtin(task_image.mask_iou, 0.95,
                         "mean IoU of the maps binarized at threshold (PP-OCR det: 0.3)",
                         _options(task_image.mask_iou)),
    "db-boxes": _Builtin(task_db.db_boxes, 1.0,
                         "share of DB text boxes (PP-OCR det) reproduced exactly, client's "
                         "DBPostProcess (needs rapidocr_onnxruntime)",
                         _options(task_db.db_boxes)),
    "box-match": _Builtin(task_detection.box_match, 0.95,
                          "F1 of candidate boxes matched to reference boxes at IoU >= 0.5 "
                          "(detection heads read as exported: YOLO, DETR, NMS outputs)",
                          _options(task_detection.box_match)),
    "box-map": _Builtin(task_detection.box_map, 0.95,
                        "mAP@0.5 (VOC all-point) of candidate boxes, reference boxes as truth",
                        _options(task_detection.box_map)),
    "coco-map-drop": _Builtin(task_coco.coco_map_drop, 0.01,
                              "COCO mAP@[.5:.95] against --labels lost by the candidate "
                              "(reference minus candidate, per image; needs pycocotools)",
                              _options(task_coco.coco_map_drop), higher_is_better=False),
    "accuracy-drop": _Builtin(task_labels.accuracy_drop, 0.0,
                              "top-1 accuracy against --labels lost by the candidate "
                              "(1 where only the reference is right, per sample)",
                              _options(task_labels.accuracy_drop), higher_is_better=False),
    "ctc-string": _Builtin(task_ocr.ctc_string_agreement, 0.95,
                           "share of CTC-decoded strings equal to the reference's",
                           _options(task_ocr.ctc_string_agreement)),
    "ctc-char": _Builtin(task_ocr.ctc_char_agreement, 0.99,
                         "1 - character error rate of CTC decodings against the reference's",
                         _options(task_ocr.ctc_char_agreement)),
    "psnr": _Builtin(task_image.psnr, 40.0, "PSNR in dB (data_range default: reference range)",
                     _options(task_image.psnr)),
    "ssim": _Builtin(task_image.ssim, 0.99, "mean SSIM (Wang et al. 2004, 11x11 Gaussian 1.5)",
                     _options(task_image.ssim)),
    "lsd": _Builtin(task_audio.lsd, 1.0, "log-spectral distance in dB after DTW alignment "
                    "(audio of any length, e.g. a TTS voice); lower is better",
                    _options(task_audio.lsd), higher_is_better=False),
}

_OPTIONS_START = re.compile(r":(?=[A-Za-z_]\w*=)")


def _parse_params(text: str, spec: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise MetricError(f"metric spec {spec!r}: option {item!r} is not key=value")
        if key in params:
            raise MetricError(f"metric spec {spec!r}: option {key!r} given twice")
        params[key] = value.strip() if key in TEXT_OPTIONS else parse_param_value(value.strip())
    return params


def _check_builtin_params(name: str, entry: _Builtin, params: dict[str, Any]) -> None:
    for key, value in params.items():
        if key not in entry.options:
            raise MetricError(f"metric {name!r} has no option {key!r}; its options are: "
                              f"{', '.join(sorted(entry.options))}")
        default = entry.options[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, (int, float)):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and isinstance(default, int) and not isinstance(value, int):
                ok = False
        else:
            ok = True
        if not ok:
            kind = {bool: "true or false", int: "an integer"}.get(type(default), "a number")
            raise MetricError(f"metric {name!r}: option {key}={value!r} should be {kind}, "
                              f"like the default {key}={default!r}")


def get_metric(spec: str) -> TaskMetric:
    """Resolve a metric spec (see the module docstring) to a :class:`TaskMetric`.

    Args:
        spec: ``name[:key=value,...]`` for a built-in, ``module:function[:key=value,...]`` or
            ``path/to/file.py:function[:key=value,...]`` for a user function.

    Returns:
        The metric, with its options bound.

    Raises:
        MetricError: Unknown name, bad option, or a user function that cannot be imported or
            found (the message says which and what to do).
    """
    text = spec.strip()
    if not text:
        raise MetricError(f"empty metric spec; built-ins are: {', '.join(BUILTINS)}")
    head, _, rest = text.partition(":")
    if head in BUILTINS:
        entry = BUILTINS[head]
        params = _parse_params(rest, text)
        _check_builtin_params(head, entry, params)
        return TaskMetric(name=head, fn=entry.fn, higher_is_better=entry.higher_is_better,
                          default_threshold=entry.default_threshold,
                          description=entry.description,
                          params=tuple(sorted(params.items())), spec=text)
    match = _OPTIONS_START.search(text)
    target_fn = text[:match.start()] if match else text
    params = _parse_params(text[match.end():], text) if match else {}
    target, sep, fn_name = target_fn.rpartition(":")
    if not sep or not target or not fn_name:
        close = difflib.get_close_matches(target_fn, BUILTINS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise MetricError(
            f"unknown task metric {spec!r}: not a built-in ({', '.join(BUILTINS)}) and not "
            f"a user function written module:function or path/to/file.py:function.{hint}")
    fn = _load_user_function(target, fn_name)
    doc = (inspect.getdoc(fn) or "user task metric").splitlines()[0]
    return TaskMetric(name=target_fn, fn=fn, higher_is_better=True, default_threshold=None,
                      description=doc, params=tuple(sorted(params.items())), spec=text)


def _load_user_function(target: str, fn_name: str) -> MetricFn:
    where = f"{target}:{fn_name}"
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise MetricError(f"task metric {where}: file {path} does not exist", file=str(path))
        module_name = "precision_doctor_user_metric_" + re.sub(r"\W", "_", str(path.resolve()))
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise MetricError(f"task metric {where}: {path} cannot be imported as Python",
                              file=str(path))
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise MetricError(f"task metric {where}: importing {path} failed with "
                              f"{type(exc).__name__}: {exc}", file=str(path)) from exc
    else:
        cwd = os.getcwd()
        added = cwd not in sys.path
        if added:
            sys.path.insert(0, cwd)  # `module:function` resolves modules in the working directory
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise MetricError(f"task metric {where}: cannot import module {target!r} "
                              f"({type(exc).__name__}: {exc}); check the name and that it is "
                              "importable (installed, or in the working directory)") from exc
        finally:
            if added:
                sys.path.remove(cwd)
    fn = getattr(module, fn_name, None)
    if fn is None:
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and not inspect.isclass(v))
        raise MetricError(f"task metric {where}: {target} has no function {fn_name!r}; "
                          f"functions there: {', '.join(found) or 'none'}")
    if not callable(fn):
        raise MetricError(f"task metric {where}: {fn_name!r} is a {type(fn).__name__}, "
                          "not a function")
    return fn


def evaluate_metric(metric: TaskMetric, reference: Outputs, candidate: Outputs,
                    context: Mapping[str, Any] | None = None) -> float:
    """Call a metric and check its result.

    Args:
        metric: The resolved metric.
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        context: Facts about the sample (keys in :data:`CONTEXT_KEYS`); each is passed only
            to a function that declares a keyword parameter of that name.

    Returns:
        The value as a Python float (may be +-inf, e.g. PSNR of identical images).

    Raises:
        MetricError: The metric raised, or returned NaN or something that is not a real number;
            the message names the metric. Errors of precision-doctor's own hierarchy raised by
            built-ins (bad output name, unreadable charset file) keep their type.
    """
    try:
        value = metric.fn(reference, candidate, **dict(metric.params),
                          **_context_for(metric.fn, context))
    except PrecisionDoctorError as exc:
        if isinstance(exc, MetricError) and not exc.message.startswith(f"{metric.name}: "):
            raise MetricError(f"{metric.name}: {exc.message}",
                              **{**exc.context, "metric": metric.name}) from exc
        raise
    except Exception as exc:
        raise MetricError(f"task metric {metric.name} raised {type(exc).__name__}: {exc}",
                          metric=metric.name) from exc
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise MetricError(f"task metric {metric.name} returned {type(value).__name__} "
                          f"({value!r:.60}); it must return one real number (float)",
                          metric=metric.name)
    result = float(value)
    if math.isnan(result):
        raise MetricError(f"task metric {metric.name} returned NaN; make it return a number "
                          "(e.g. the worst score when the candidate output has NaN)",
                          metric=metric.name)
    return result


def list_metrics() -> list[TaskMetric]:
    """Every built-in metric with its defaults, in registry order."""
    return [get_metric(name) for name in BUILTINS]
