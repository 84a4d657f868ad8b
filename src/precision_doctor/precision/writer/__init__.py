"""The strongly typed mixed-precision writer.

``core`` drives it: ``decide`` (storage format of every float tensor, using ``checks`` and the
op ``schema`` tables) -> ``apply`` (Casts at precision boundaries, converted constants) ->
``validate`` (checker, shape inference, an ONNX Runtime session); ``report`` is its result.
"""

from precision_doctor.precision.writer.core import (
    PlanWriter,
    convert_opset,
    write_mixed_precision,
    written_opset,
)
from precision_doctor.precision.writer.report import KeptNode, WriterReport

__all__ = ["KeptNode", "PlanWriter", "WriterReport", "convert_opset", "write_mixed_precision",
           "written_opset"]
