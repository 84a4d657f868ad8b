"""The base of the rewrites for one target format that read calibration maxima."""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from precision_doctor.formats import Precision


class TargetPass(ir.passes.InPlacePass):
    """An in-place rewrite for one reduced format, which may read measured maxima.

    Args:
        target: The reduced format the model is rewritten for (None: no target given).
        max_abs: Tensor name -> largest finite |x| on the calibration data in FP32, or None
            (the graph's own bounds decide).
    """

    def __init__(self, target: Precision | None = None,
                 max_abs: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.target = target
        self.max_abs = max_abs


__all__ = ["TargetPass"]
