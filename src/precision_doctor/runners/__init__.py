"""Backends behind one Runner protocol: ORT CPU reference, emulator, ORT with any EP, TensorRT."""
