"""The one exception hierarchy of precision-doctor.

Every error carries the context that caused it (which file, node, tensor or input) and its
message says what to do about it. The CLI maps ``PrecisionDoctorError`` to exit code 2 and prints
the message without a traceback.

    PrecisionDoctorError
    ├── ModelError                 the ONNX model cannot be read or used
    │   ├── ModelLoadError         corrupt, truncated, missing external data, > 2 GB without data
    │   └── UnsupportedModelError  an op/opset/dtype we or the runtime cannot handle
    ├── InputError                 the data fed to the model is wrong
    │   ├── InputNameError         missing or extra input names
    │   ├── InputShapeError        wrong rank/shape/dtype for an input
    │   └── DataFormatError        an image that does not decode, a bad .npy/.npz/JSON file
    ├── PlanError                  a precision plan names nodes that do not exist or bad dtypes
    ├── ReferenceError_            the FP32 reference itself is unusable (NaN/Inf in its outputs)
    ├── BackendError               a runner failed to build or run
    │   └── BackendUnavailable     an optional backend (CUDA, TensorRT) is not installed/usable
    ├── MetricError                a user metric raised, returned NaN, or cannot be imported
    ├── TargetNotMetError          the accuracy target cannot be met even with everything in FP32
    ├── InvariantError             a tool defect: an invariant does not hold on this model (the
    │                              plan with every candidate in FP32 is not the FP32 model)
    └── OutputError                an output file cannot be written
        ├── OutputExistsError      refusing to overwrite an existing file without --force
        └── OutputPathError        its folder is missing or not writable, it is a folder, or it
                                   is one of the inputs
"""

from __future__ import annotations


class PrecisionDoctorError(Exception):
    """Base class of every error precision-doctor raises on purpose.

    Args:
        message: What went wrong and what to do about it.
        context: Names that locate the problem (e.g. ``{"node": "Conv_3", "file": "m.onnx"}``).
    """

    def __init__(self, message: str, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = {k: v for k, v in context.items() if v is not None}

    def __str__(self) -> str:
        return self.message


class ModelError(PrecisionDoctorError):
    """The ONNX model cannot be read or used."""


class ModelLoadError(ModelError):
    """The model file is corrupt, truncated, missing external data, or not ONNX."""


class UnsupportedModelError(ModelError):
    """An op, opset or dtype the tool or the runtime cannot handle."""


class InputError(PrecisionDoctorError):
    """The data fed to the model is wrong."""


class InputNameError(InputError):
    """Missing or extra input names."""


class InputShapeError(InputError):
    """An input has the wrong rank, shape or dtype."""


class DataFormatError(InputError):
    """A data file cannot be decoded (image, .npy/.npz, Polygraphy JSON)."""


class PlanError(PrecisionDoctorError):
    """A precision plan names nodes that do not exist or uses an unknown precision."""


class ReferenceError_(PrecisionDoctorError):  # noqa: N801 - avoid shadowing the builtin
    """The FP32 reference produced NaN/Inf, so nothing can be compared against it."""


class BackendError(PrecisionDoctorError):
    """A runner failed to build a session/engine or to run it."""


class BackendUnavailable(BackendError):
    """An optional backend (ONNX Runtime CUDA, TensorRT) is not installed or not usable here."""


class MetricError(PrecisionDoctorError):
    """A task metric raised, returned NaN, or could not be imported."""


class TargetNotMetError(PrecisionDoctorError):
    """The accuracy target cannot be met even with every node in FP32."""


class InvariantError(PrecisionDoctorError):
    """A tool defect, never a diagnosis: an invariant of the tool does not hold on this model
    (e.g. the plan with every candidate node in FP32 does not reproduce the FP32 reference)."""


class OutputError(PrecisionDoctorError):
    """An output file cannot be written (checked before any work starts)."""


class OutputExistsError(OutputError):
    """Refusing to overwrite an existing file without ``--force``."""


class OutputPathError(OutputError):
    """An output path cannot be written: its folder is missing or not writable, it is a folder,
    or it is one of the command's inputs (the model is never overwritten)."""
