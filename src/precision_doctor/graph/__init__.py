"""Load, inspect and edit ONNX graphs."""

from precision_doctor.graph.load import (
                                         input_metadata,
                                         load_model,
                                         name_nodes,
                                         opset_of,
                                         ort_model_source,
)

__all__ = ["input_metadata", "load_model", "name_nodes", "opset_of", "ort_model_source"]
