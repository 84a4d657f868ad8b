"""Load, inspect and edit ONNX graphs (models with external data included)."""

from precision_doctor.graph.external import has_external_data
from precision_doctor.graph.external_files import link_model, save_model
from precision_doctor.graph.load import (
                                         input_metadata,
                                         load_model,
                                         name_nodes,
                                         opset_of,
                                         ort_model_source,
)

__all__ = ["has_external_data", "input_metadata", "link_model", "load_model", "name_nodes",
           "opset_of", "ort_model_source", "save_model"]
