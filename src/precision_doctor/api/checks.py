"""``audit`` (what precision a built TensorRT engine ran in) and ``compare_inputs`` (what
differs between two inputs meant to be the same sample)."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from precision_doctor.api.options import ModelLike, as_model, parse_precision
from precision_doctor.api.results import Audit, InputComparison, convert
from precision_doctor.audit import audit_engine
from precision_doctor.audit.buildlog import link_to_audit, read_build_log
from precision_doctor.audit.profile import Profile
from precision_doctor.forensics import compare_inputs as compare_tensors
from precision_doctor.inputs import PreprocessSpec
from precision_doctor.jsonable import dumps
from precision_doctor.precision.plan import PrecisionPlan


def audit(layer_info: str | os.PathLike | Mapping | list, *,
          onnx: ModelLike | None = None,
          profile: str | os.PathLike | Sequence[Any] | Profile | None = None,
          log: str | os.PathLike | None = None,
          plan: PrecisionPlan | str | os.PathLike | None = None,
          expect_fp32: Iterable[str] = ()) -> Audit:
    """Audit a built TensorRT engine: the precision each layer actually ran in, mapped back to
    the ONNX nodes, and the FP32 requests the engine did not honor.

    Precision is not a field of TensorRT's layer information: it is inferred from each layer's
    tensor formats (``Half``, ``Float``, ``Channel major FP16 ...``) and tactic names, with the
    evidence recorded per layer.

    Args:
        layer_info: ``trtexec --exportLayerInfo`` / IEngineInspector JSON (path or parsed
            JSON), TensorRT 8.x, 8.6 (Myelin ``{ForeignNode[...]}``) or 10.x (kgen). Build with
            ``--profilingVerbosity=detailed``, or only layer names are available.
        onnx: The ONNX model the engine was built from (path, ``onnx.ModelProto`` or
            ``onnx_ir.Model``): resolves the nodes inside fused regions and their op types.
        profile: ``trtexec --exportProfile`` JSON for per-layer times (ms per inference).
        log: The engine's trtexec/Polygraphy ``--verbose`` build log: its precision lines
            (TensorRT version, GPU, FP16/TF32/strongly typed, "Detected layernorm nodes in
            FP16", layers forced to FP32, Myelin regions) tied to ONNX nodes and to these
            layers, in ``Audit.build_log``.
        plan: A ``PrecisionPlan`` (e.g. ``Fix.plan``) or its JSON file: its FP32 nodes are
            checked.
        expect_fp32: Node names or glob patterns (``"*LayerNorm*"``) meant to run in FP32.

    Returns:
        :class:`Audit`: ``layers`` (precision and evidence), ``regions``, ``findings``
        (``fp32-not-honored``, ``tf32-tactic``, ``sensitive-op``, ``reformat``),
        ``fp32_checks``, ``precision_summary``; ``passed`` is False when an FP32 request was
        not honored.

    Raises:
        DataFormatError: The layer information or profile is not readable JSON of that kind.
        ModelLoadError: ``onnx`` cannot be read.
        PlanError: ``plan`` cannot be read.
    """
    model = as_model(onnx)[0] if onnx is not None else None
    report = audit_engine(layer_info, profile, model, plan, tuple(expect_fp32))
    build = None
    if log is not None:
        parsed = read_build_log(log, model)
        # JSON-normalized, so that Audit.from_dict(to_dict()) gives an equal record
        build = json.loads(dumps({**parsed.to_dict(), "links": link_to_audit(parsed, report)}))
    return convert(Audit, report, build_log=build)


def compare_inputs(a: str | os.PathLike | np.ndarray, b: str | os.PathLike | np.ndarray, *,
                   preprocess_a: PreprocessSpec | str | None = None,
                   preprocess_b: PreprocessSpec | str | None = None,
                   model: ModelLike | None = None, target: str = "fp16") -> InputComparison:
    """Name what differs between two inputs meant to be the same sample (preprocessing
    forensics): channel order, NCHW vs NHWC, scale (x255), mean/std normalization, resize and
    interpolation, crop offset, padding, dtype.

    Args:
        a: Side A: an image file (with ``preprocess_a``), ``.npy``, ``file.npz[:KEY]``,
            Polygraphy ``inputs.json[:KEY][@ITERATION]``, or an array (e.g. float32
            ``[1, 3, H, W]``).
        b: Side B, same forms.
        preprocess_a: Preprocessing of an image A (preset name, ``key=value`` text or spec).
        preprocess_b: Preprocessing of an image B.
        model: Optional model with one image input (path, ``onnx.ModelProto`` or
            ``onnx_ir.Model``): also measure how far B moves its outputs (relative L2)
            next to the ``target`` precision's effect.
        target: Precision whose effect is the yardstick (``fp16``, ``bf16``, ``tf32``).

    Returns:
        :class:`InputComparison`: ``findings`` (most important first), ``transform`` (the
        estimated map from A to B), ``residual_rel_l2``, ``output_effect``; ``passed`` when
        the inputs match.

    Raises:
        InputError: Missing files, an image without a spec, a spec for a tensor.
        InputNameError: The array to compare cannot be chosen from a .npz/JSON file.
        DataFormatError: A file does not decode.
        InputShapeError: A tensor is empty or not numeric; A does not fit the model.
        ModelLoadError, BackendError: The model cannot be read or run.
    """
    proto = None
    if model is not None and not isinstance(model, (str, os.PathLike)):
        proto = as_model(model)[0]
    result = compare_tensors(_side(a), _side(b), preprocess_a=preprocess_a,
                             preprocess_b=preprocess_b,
                             model=proto if proto is not None else _path(model),
                             target=parse_precision(target))
    return convert(InputComparison, result)


def _side(value: str | os.PathLike | np.ndarray) -> str | np.ndarray:
    return value if isinstance(value, np.ndarray) else os.fspath(value)


def _path(value: Any) -> str | None:
    return None if value is None else os.fspath(value)
