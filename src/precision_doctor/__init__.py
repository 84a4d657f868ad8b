"""precision-doctor: does an ONNX model survive FP16/BF16/TF32, where and why does it break, and
which mixed-precision model keeps it within the accuracy target."""

__version__ = "0.1.0"
