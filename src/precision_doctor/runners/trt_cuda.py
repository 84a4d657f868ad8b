"""Device memory, streams and TensorRT callbacks for ``TensorRTRunner``.

UNTESTED in this project's environment (no TensorRT there; see ``runners/tensorrt.py``).

Device buffers come from cuda-python's runtime bindings (``cuda.bindings.runtime``, or the older
``cuda.cudart``), as in TensorRT's own samples (``samples/python/common_runtime.py``), or else from
PyTorch. Every cuda-python call returns ``(cudaError_t, *results)``; errors are raised here.
With PyTorch only, TensorRT-owned debug-tensor memory cannot be copied, so the runner marks
debug tensors as outputs instead.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from precision_doctor.errors import BackendError, BackendUnavailable


def np_dtype(trt: Any, dtype: Any) -> np.dtype:
    """numpy dtype of a TensorRT ``DataType`` (BF16 through ``ml_dtypes``).

    Raises:
        BackendError: The type has no numpy equivalent (FP8, INT4, FP4).
    """
    if getattr(trt, "bfloat16", None) is not None and dtype == trt.bfloat16:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(trt.nptype(dtype))
    except TypeError as exc:
        raise BackendError(f"TensorRT type {dtype} has no numpy equivalent") from exc


class CudaRuntime:
    """cuda-python runtime: ``cudaMalloc``/``cudaMemcpyAsync``/streams (ints as pointers)."""

    raw_copies = True

    def __init__(self, cudart: Any) -> None:
        self.rt = cudart

    def _check(self, result: Any) -> Any:
        err, rest = result[0], result[1:]
        if err != self.rt.cudaError_t.cudaSuccess:
            raise BackendError(f"CUDA runtime error: {err}")
        return rest[0] if len(rest) == 1 else None

    def malloc(self, nbytes: int) -> int:
        """Device address of ``nbytes`` (at least 1) new bytes."""
        return int(self._check(self.rt.cudaMalloc(max(int(nbytes), 1))))

    def free(self, ptr: int) -> None:
        """Release memory from ``malloc``."""
        self._check(self.rt.cudaFree(ptr))

    def stream(self) -> Any:
        """A new CUDA stream."""
        return self._check(self.rt.cudaStreamCreate())

    def handle(self, stream: Any) -> int:
        """The stream as the integer ``execute_async_v3`` takes."""
        return int(stream)

    def h2d(self, ptr: int, array: np.ndarray, stream: Any) -> None:
        """Copy a C-contiguous host array to ``ptr`` on ``stream``."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.rt.cudaMemcpyAsync(ptr, array.ctypes.data, array.nbytes, kind, stream))

    def d2h(self, array: np.ndarray, ptr: int, stream: Any) -> None:
        """Copy ``array.nbytes`` from ``ptr`` into a C-contiguous host array on ``stream``."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.rt.cudaMemcpyAsync(array.ctypes.data, ptr, array.nbytes, kind, stream))

    def sync(self, stream: Any) -> None:
        """Wait for ``stream``."""
        self._check(self.rt.cudaStreamSynchronize(stream))

    def destroy(self, stream: Any) -> None:
        """Destroy a stream from ``stream()``."""
        self._check(self.rt.cudaStreamDestroy(stream))


class TorchCuda:
    """PyTorch fallback with ``CudaRuntime``'s methods: buffers are ``uint8`` CUDA tensors kept
    alive by their address; only buffers it allocated can be copied (``raw_copies`` is False)."""

    raw_copies = False

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._blocks: dict[int, Any] = {}

    def malloc(self, nbytes: int) -> int:
        block = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, device="cuda")
        self._blocks[block.data_ptr()] = block
        return int(block.data_ptr())

    def free(self, ptr: int) -> None:
        self._blocks.pop(ptr, None)

    def stream(self) -> Any:
        return self.torch.cuda.Stream()

    def handle(self, stream: Any) -> int:
        return int(stream.cuda_stream)

    def _block(self, ptr: int, nbytes: int) -> Any:
        if ptr not in self._blocks:
            raise BackendUnavailable("copying TensorRT-owned memory needs cuda-python "
                                     "(pip install cuda-python)")
        return self._blocks[ptr][:nbytes]

    def h2d(self, ptr: int, array: np.ndarray, stream: Any) -> None:
        source = self.torch.from_numpy(array.reshape(-1).view(np.uint8))
        with self.torch.cuda.stream(stream):
            self._block(ptr, array.nbytes).copy_(source)

    def d2h(self, array: np.ndarray, ptr: int, stream: Any) -> None:
        stream.synchronize()
        array.reshape(-1).view(np.uint8)[:] = self._block(ptr, array.nbytes).cpu().numpy()

    def sync(self, stream: Any) -> None:
        stream.synchronize()

    def destroy(self, stream: Any) -> None:
        return None


def cuda_backend() -> CudaRuntime | TorchCuda:
    """cuda-python if importable, else PyTorch with CUDA.

    Raises:
        BackendUnavailable: Neither is importable (or PyTorch sees no GPU).
    """
    try:
        from cuda.bindings import runtime as cudart
        return CudaRuntime(cudart)
    except ImportError:
        pass
    try:
        from cuda import cudart  # cuda-python < 12.6 layout
        return CudaRuntime(cudart)
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return TorchCuda(torch)
    except ImportError:
        pass
    raise BackendUnavailable("TensorRTRunner needs GPU buffers from cuda-python (pip install "
                             "cuda-python) or PyTorch with CUDA; neither is usable here",
                             backend="tensorrt")


def capsule_pointer(addr: Any) -> int:
    """An address as int: TensorRT's binding passes an int, its docs say a capsule; take both."""
    if isinstance(addr, int):
        return addr
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get(addr, None))


def make_output_allocator(trt: Any, cuda: Any) -> Any:
    """An ``IOutputAllocator`` that grows one device buffer per output and records its shape.

    Both ``reallocate_output`` (deprecated in TensorRT 10/11) and ``reallocate_output_async`` are
    implemented; ``notify_shape`` gives the real shape, also for data-dependent outputs.
    """

    class OutputAllocator(trt.IOutputAllocator):
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffers: dict[str, tuple[int, int]] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}

        def reallocate_output(self, tensor_name: str, memory: Any, size: int,
                              alignment: int) -> int:
            held = self.buffers.get(tensor_name)
            if held is None or held[1] < size:
                if held is not None:
                    cuda.free(held[0])
                held = (cuda.malloc(size), int(size))
                self.buffers[tensor_name] = held
            return held[0]

        def reallocate_output_async(self, tensor_name: str, memory: Any, size: int,
                                    alignment: int, stream: Any) -> int:
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            self.shapes[tensor_name] = tuple(int(d) for d in shape)

        def release(self) -> None:
            for ptr, _ in self.buffers.values():
                cuda.free(ptr)
            self.buffers.clear()

    return OutputAllocator()


def make_debug_listener(trt: Any, cuda: Any) -> Any:
    """An ``IDebugListener`` that copies each debug tensor to the host as it is produced.

    The buffer is valid only during the callback (``process_debug_tensor`` doc), so it is copied
    on the callback's stream and synchronized there, as Polygraphy's ``DebugTensorWriter`` does.
    Exceptions cannot cross into TensorRT; they are kept in ``errors`` for the runner to raise.
    """
    class DebugListener(trt.IDebugListener):
        def __init__(self) -> None:
            trt.IDebugListener.__init__(self)
            self.tensors: dict[str, np.ndarray] = {}
            self.errors: dict[str, str] = {}

        def process_debug_tensor(self, addr: Any, location: Any, dtype: Any, shape: Any,
                                 name: str, stream: Any) -> bool:
            try:
                host = np.empty(tuple(int(d) for d in shape), dtype=np_dtype(trt, dtype))
                ptr = capsule_pointer(addr)
                if location == trt.TensorLocation.HOST:
                    ctypes.memmove(host.ctypes.data, ptr, host.nbytes)
                else:
                    cuda.sync(stream)
                    cuda.d2h(host, ptr, stream)
                    cuda.sync(stream)
                self.tensors[name] = host
            except Exception as exc:  # noqa: BLE001 - reported after the run
                self.errors[name] = f"{dtype}: {exc}"
            return True

    return DebugListener()
