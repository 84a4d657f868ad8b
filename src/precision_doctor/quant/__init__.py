"""INT8 and FP8 (E4M3) quantization: Q/DQ placement by TensorRT's explicit-quantization rules,
calibration, the exact Q/DQ emulation on ONNX Runtime CPU, per-layer measurements, causes by
measured cure, and the search for the fewest unquantized layers."""
