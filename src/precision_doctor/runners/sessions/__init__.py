"""Scopes inside which ONNX Runtime sessions share resources: one CPU memory arena
(``cpu_arena``), one switched emulation session per model on a GPU (``switched``)."""
