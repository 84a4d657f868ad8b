"""What kernels an engine has: ONNX Runtime registry (``registry``) and the tables measured
on engines this machine cannot load (``engines``)."""
