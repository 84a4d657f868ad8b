"""precision-doctor: does an ONNX model survive FP16/BF16/TF32, where and why does it break, and
which mixed-precision model keeps it within the accuracy target.

    import precision_doctor as pd

    d = pd.diagnose("model.onnx", "images/", preprocess="imagenet", target="fp16")
    print(d.verdict, d.findings[0].summary if d.findings else "")
    f = pd.fix("model.onnx", "images/", preprocess="imagenet", metric="top1", threshold=1)
    f.save("model_fp16.onnx")

Functions: :func:`diagnose`, :func:`fix`, :func:`audit`, :func:`compare_inputs`; for a
``torch.nn.Module``, :func:`compare_autocast` and :func:`torch_recipe`. Results:
:class:`Diagnosis`, :class:`Fix`, :class:`Audit`, :class:`InputComparison` (frozen, with
``to_dict``/``to_json``/``from_dict``/``to_html``). Errors: :class:`PrecisionDoctorError` and
its subclasses (see ``precision_doctor.errors``). ``import precision_doctor`` stays light: the
API (onnxruntime, onnx-ir ...) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from precision_doctor.errors import (
    BackendError,
    BackendUnavailable,
    DataFormatError,
    InputError,
    InputNameError,
    InputShapeError,
    InvariantError,
    MetricError,
    ModelError,
    ModelLoadError,
    OutputError,
    OutputExistsError,
    OutputPathError,
    PlanError,
    PrecisionDoctorError,
    ReferenceError_,
    TargetNotMetError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from precision_doctor.api import (
        Audit,
        Diagnosis,
        Fix,
        InputComparison,
        audit,
        compare_autocast,
        compare_inputs,
        diagnose,
        diagnose_quantized,
        fix,
        fix_quantized,
        torch_recipe,
    )

_API = ("Audit", "Diagnosis", "Fix", "InputComparison", "audit", "compare_autocast",
        "compare_inputs", "diagnose", "diagnose_quantized", "fix", "fix_quantized", "torch_recipe")

__all__ = [
    "Audit", "BackendError", "BackendUnavailable", "DataFormatError", "Diagnosis", "Fix",
    "InputComparison", "InputError", "InputNameError", "InputShapeError", "InvariantError",
    "MetricError",
    "ModelError", "ModelLoadError", "OutputError", "OutputExistsError", "OutputPathError",
    "PlanError", "PrecisionDoctorError", "ReferenceError_", "TargetNotMetError",
    "UnsupportedModelError", "__version__", "audit", "compare_autocast", "compare_inputs",
    "diagnose", "diagnose_quantized", "fix", "fix_quantized", "torch_recipe",
]


def __getattr__(name: str) -> Any:
    """Import the API on first use (PEP 562), so ``import precision_doctor`` stays light."""
    if name in _API:
        from precision_doctor import api

        # Bind every API name at once: importing the API loads the ``precision_doctor.audit``
        # subpackage, which the import system binds as ``audit`` on this package; the public
        # function must win (``api/__init__.py`` binds it again for direct API imports).
        globals().update({n: getattr(api, n) for n in _API})
        return globals()[name]
    raise AttributeError(f"module 'precision_doctor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
