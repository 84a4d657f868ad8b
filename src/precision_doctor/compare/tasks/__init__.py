"""Task metrics, one module per task family, one registry (``registry``).

``classification`` (top-1/top-5), ``mask`` (mask IoU), ``db`` (the OCR client's DB boxes),
``detection`` (box match, VOC AP), ``ocr`` (CTC decoding, string/char agreement), ``image``
(PSNR/SSIM); ``io`` selects outputs and parses options for all of them.
"""

from precision_doctor.compare.tasks.registry import (
    CONTEXT_KEYS,
    TaskMetric,
    evaluate_metric,
    get_metric,
    list_metrics,
    sample_context,
)

__all__ = ["CONTEXT_KEYS", "TaskMetric", "evaluate_metric", "get_metric", "list_metrics",
           "sample_context"]
