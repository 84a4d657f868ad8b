"""Layerwise comparison: segment engines, tensor statistics, local error gains, recorded tensors."""
