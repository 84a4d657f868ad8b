"""Precision plans, emulation of reduced precision, cast insertion and safe rewrites."""
