"""Where the ONNX Runtime sessions of a diagnosis or a fix run: the CPU or a CUDA GPU.

``--device`` takes ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (the default): ``auto`` is the
first CUDA device when the installed ONNX Runtime has the CUDA execution provider
(``onnxruntime-gpu``) and a GPU answers, else the CPU. The CPU-only ``onnxruntime`` wheel never
lists that provider, so ``auto`` costs nothing there.

``use(device)`` opens a scope (visible from every thread, like
``runners.sessions.cpu_arena``): inside
it, every ``OrtRunner`` built without explicit providers, i.e. the FP32 reference, the
emulation graph, the layerwise segments and the search's evaluations, runs on that device.
Runners given providers (``--runner ort:cpu``, the CPU cross-check of the noise floor) keep
them.

On CUDA the sessions use these CUDA execution provider options (names from the ONNX Runtime
CUDA EP documentation):

* ``use_tf32=0``: the reference is FP32. ONNX Runtime enables TF32 on Ampere and later unless
  told otherwise, which rounds MatMul/Conv inputs to 10 mantissa bits (~5e-4 relative): that
  would be a candidate, not a reference (field report 3).
* ``cudnn_conv_algo_search=EXHAUSTIVE`` with ``cudnn_conv_use_max_workspace=0``: cuDNN times
  the convolution algorithms that fit a 32 MiB workspace and keeps the fastest, per session and
  input shape. cuDNN's heuristic picks without timing, but its picks can need a workspace far
  beyond the tensors, which ONNX Runtime allocates whatever ``cudnn_conv_use_max_workspace``
  says (it caps only the exhaustive search): one CUDA session of PP-OCRv4 rec at batch 6 held
  4.2 GiB for 6 MiB of output under the heuristic, 0.2 GiB under the capped exhaustive search,
  whose runs took 4.1 instead of 29.5 ms (``benchmarks/probes/gpu_segment_memory.py``, H200,
  2026-11-26). The exhaustive search times its candidates again at every new session and input
  shape (PP-OCRv4 det at 640: 0.7-0.9 s a run with two batch shapes in turn, against 0.10 s
  under the heuristic; ``benchmarks/probes/gpu_switched_runs.py``), which made it the slower choice
  while a diagnosis's stages changed shape at most runs. Since they run shape by shape
  (``runners.batching``), the capped exhaustive search everywhere measured (H200, 2026-11-27,
  ``benchmarks/gpu_pipeline.py``): rec on its 28 crops 38.5 s and 5.0 GiB peak (heuristic 39.4 s,
  10.0 GiB), on 256 strips 45.8 s and 4.0 GiB (58.4 s, 4.6 GiB), ``fix`` on the 28 crops 85.8 s
  and 2.3 GiB (86.6 s, 8.0 GiB), the same verdicts, findings and fix plans; det (3 images at
  640, two sessions' first timings) 2-3 s slower: diagnose 13.0 s (11.1-11.8), fix 13.4-14.7 s
  (10.7-11.1). Which algorithm the timing picks may differ between sessions, which moves FP32
  results by rounding only (calib256's relative L2 identical to 17 digits across runs; rec's
  minor findings' impacts, 2e-5 to 1.4e-3, within 9%).
* ``arena_extend_strategy=kSameAsRequested``: the device arena grows by what a request needs,
  not to the next power of two (PP-OCRv4 det, every tensor of 3 images at 640 on the device:
  2322 instead of 3224 MiB for 1976 MiB of outputs; ``benchmarks/probes/gpu_segment_memory.py``,
  H200, 2026-11-26).

The emulation's Cast round trips (FP32 -> FP16/BF16 -> FP32) are exact on the GPU as on the
CPU (IEEE round-to-nearest-even casts; the FP16 answers of ``benchmarks/gpu_pipeline.py`` agree
with the CPU's, BENCHMARKS.md). The Veltkamp splits of the TF32 emulation (and of BF16 below
opset 13) need separate Mul/Sub kernels without FMA contraction and with denormals kept, which
ONNX Runtime's CUDA elementwise kernels are; that path is not yet compared with the CPU on a GPU.
"""

from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from precision_doctor.errors import BackendUnavailable, InputError

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
INSTALL_HINT = ("install the GPU extra (pip install 'precision-doctor[gpu]', i.e. onnxruntime-gpu "
                "in place of onnxruntime, with the CUDA 12/13 and cuDNN 9 libraries it names) "
                "on a machine with an NVIDIA GPU; or use --device cpu")
# CUDA EP options of every session on a CUDA device (module docstring says why).
CUDA_SESSION_OPTIONS: Mapping[str, str] = {
    "use_tf32": "0", "cudnn_conv_algo_search": "EXHAUSTIVE", "cudnn_conv_use_max_workspace": "0",
    "arena_extend_strategy": "kSameAsRequested"}


@dataclass(frozen=True)
class Device:
    """One place sessions run.

    Attributes:
        kind: ``cpu`` or ``cuda``.
        index: CUDA device ordinal (as ``CUDA_VISIBLE_DEVICES`` numbers them); None for the
            CPU, or for ``cuda`` without an index (device 0, and every visible device for a
            pool of workers).
    """

    kind: str = "cpu"
    index: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        """``cpu``, ``cuda`` or ``cuda:N``."""
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def ordinal(self) -> int:
        """The CUDA ordinal sessions use (0 when no index was given)."""
        return self.index or 0

    def providers(self) -> list[str]:
        """ONNX Runtime providers of a session on this device, CPU last."""
        return [CUDA_PROVIDER, CPU_PROVIDER] if self.is_cuda else [CPU_PROVIDER]

    def provider_options(self) -> list[dict[str, str]]:
        """One options dict per entry of ``providers()``."""
        if not self.is_cuda:
            return [{}]
        return [{"device_id": str(self.ordinal), **CUDA_SESSION_OPTIONS}, {}]

    def reference_name(self) -> str:
        """Label of the FP32 reference on this device, for reports."""
        return "ort-cpu" if not self.is_cuda else f"ort-cuda:{self.ordinal}-fp32 (tf32 off)"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "index": self.index, "label": self.label}


CPU = Device()


def parse_device(spec: str | Device | None) -> tuple[Device | None, bool]:
    """``(device, auto)`` from ``cpu``, ``cuda``, ``cuda:N``, ``gpu`` (= ``cuda``) or ``auto``.

    ``auto`` (and None) gives ``(None, True)``.

    Raises:
        InputError: Any other text, or a negative index.
    """
    if isinstance(spec, Device):
        return spec, False
    text = (spec or "auto").strip().lower()
    if text == "auto":
        return None, True
    kind, sep, index = text.partition(":")
    kind = "cuda" if kind == "gpu" else kind
    if kind == "cpu" and not sep:
        return CPU, False
    if kind == "cuda":
        if not sep:
            return Device("cuda"), False
        if index.isdigit():
            return Device("cuda", int(index)), False
    raise InputError(f"--device {spec!r}: use cpu, cuda, cuda:N (N = 0, 1, ...) or auto")


def resolve_device(spec: str | Device | None = "auto") -> Device:
    """The device ``spec`` names, checked to be usable.

    Args:
        spec: ``cpu``, ``cuda``, ``cuda:N``, ``auto`` (None = auto) or a ``Device``.

    Returns:
        The device; for ``auto`` the first CUDA device when ONNX Runtime's CUDA execution
        provider is installed and a GPU answers, else the CPU.

    Raises:
        InputError: Unknown spec.
        BackendUnavailable: CUDA was asked for and ONNX Runtime has no CUDA execution
            provider, no GPU answers, or device N does not exist (the message says which and
            what to install).
    """
    device, auto = parse_device(spec)
    if device is not None and not device.is_cuda:
        return device
    count, why = cuda_devices()
    if auto:
        return Device("cuda", 0) if count else CPU
    assert device is not None
    if not count:
        raise BackendUnavailable(f"--device {device.label}: {why}; {INSTALL_HINT}",
                                 device=device.label)
    if device.ordinal >= count:
        raise BackendUnavailable(
            f"--device {device.label}: ONNX Runtime sees {count} CUDA device(s) "
            f"(0..{count - 1}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
            device=device.label)
    return device


_probe_lock = threading.Lock()
_probe: tuple[int, str] | None = None


def cuda_devices() -> tuple[int, str]:
    """``(number of CUDA devices ONNX Runtime can use, why none)``, probed once per process.

    The CUDA execution provider must be in ``onnxruntime.get_available_providers()``; its
    libraries are loaded with ``onnxruntime.preload_dlls()`` where that exists (ONNX Runtime
    >= 1.21 finds the CUDA/cuDNN wheels that way); the count is the CUDA runtime's
    ``cudaGetDeviceCount``, confirmed by a one-node session on device 0.
    """
    global _probe
    with _probe_lock:
        if _probe is None:
            _probe = _count_cuda()
        return _probe


def _count_cuda() -> tuple[int, str]:
    import onnxruntime as ort

    if CUDA_PROVIDER not in ort.get_available_providers():
        return 0, (f"this onnxruntime ({ort.__version__}) has no CUDA execution provider "
                   f"(available: {', '.join(ort.get_available_providers())})")
    ort.set_default_logger_severity(3)  # I/O binding warns on every bind_output to 'cuda'
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # noqa: BLE001 - the session below says whether CUDA loads
            pass
    if not _session_on_cuda(0):
        return 0, ("ONNX Runtime's CUDA execution provider did not start (no NVIDIA GPU, "
                   "driver, or CUDA/cuDNN libraries it can load)")
    return max(1, _runtime_device_count()), ""


def _session_on_cuda(ordinal: int) -> bool:
    """Whether a one-node session runs on CUDA device ``ordinal``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=[CUDA_PROVIDER],
                                       provider_options=[{"device_id": str(ordinal)}])
    except Exception:  # noqa: BLE001 - any failure means: not usable
        return False
    return CUDA_PROVIDER in session.get_providers()


def _cuda_runtimes() -> Iterator[ctypes.CDLL]:
    """The CUDA runtime libraries that load (the one ONNX Runtime loaded first), newest first."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so", "cudart64_12.dll"):
        try:
            yield ctypes.CDLL(name)
        except OSError:
            continue


def _runtime_device_count() -> int:
    """``cudaGetDeviceCount`` of the CUDA runtime ONNX Runtime loaded (0 if not found)."""
    for lib in _cuda_runtimes():
        count = ctypes.c_int(0)
        if lib.cudaGetDeviceCount(ctypes.byref(count)) == 0:
            return count.value
    return 0


# Layerwise comparison with the tensors on the GPU (``layerwise.resident``): what a segment
# holds in GPU memory, for both runners and a batch of samples, stays within this many bytes,
# and within a quarter of the device's memory (the weights, the CUDA context and the other
# stages' sessions take the rest). The statistics' temporaries take up to GPU_STATS_BYTES of it
# (layerwise.resident reduces in slices of at most 256 MiB); the segment's sessions hold
# GPU_HELD_PER_OUTPUT times the bytes of their outputs (ONNX Runtime's arena rounds blocks up,
# the emulation graph keeps its rounded copies): measured on an H100 (2026-11-27,
# benchmarks/gpu_pipeline.py), a layerwise stage rose 4.35 GiB for 3.04 GiB of estimated
# outputs (PP-OCRv4 rec, 5 text lines at 48x320), 3.9 GiB for 2.6 GiB (det, 2 images at 640):
# 1.43x and 1.5x.
GPU_SEGMENT_BUDGET = 4 << 30
GPU_STATS_BYTES = 256 << 20
GPU_HELD_PER_OUTPUT = 1.5


def segment_budget(device: Device, host_budget: int) -> int:
    """Bytes of one layerwise segment's outputs (both runners, one batch) on ``device``: the
    host budget on the CPU; on a GPU, the outputs whose sessions and statistics fit
    ``min(GPU_SEGMENT_BUDGET, total memory / 4)`` (the CUDA runtime's ``cudaMemGetInfo``):
    ``(that - GPU_STATS_BYTES) / GPU_HELD_PER_OUTPUT``, 2.5 GiB on a GPU of 16 GiB or more;
    never less than the host budget."""
    if not device.is_cuda:
        return host_budget
    total = _device_memory(device.ordinal)
    if not total:
        return host_budget
    held = min(GPU_SEGMENT_BUDGET, total // 4)
    return max(host_budget, int((held - GPU_STATS_BYTES) / GPU_HELD_PER_OUTPUT))


def _device_memory(ordinal: int) -> int:
    """Total memory of CUDA device ``ordinal`` in bytes (0 when the runtime cannot say)."""
    for lib in _cuda_runtimes():
        free, total, current = ctypes.c_size_t(0), ctypes.c_size_t(0), ctypes.c_int(0)
        if lib.cudaGetDevice(ctypes.byref(current)) != 0:
            return 0
        try:
            if lib.cudaSetDevice(ordinal) != 0 or \
                    lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
                return 0
        finally:
            lib.cudaSetDevice(current.value)
        return int(total.value)
    return 0


def pool_devices(device: Device, workers: int) -> list[Device]:
    """The devices of a pool of ``workers`` processes, one per device.

    ``cuda`` without an index spreads over every visible device; ``cuda:N`` and the CPU are
    one device. The list has ``min(workers, devices)`` entries for CUDA, ``workers`` CPU
    entries otherwise.
    """
    if not device.is_cuda:
        return [device] * workers
    if device.index is not None:
        return [device]
    count = max(1, cuda_devices()[0])
    return [Device("cuda", i) for i in range(min(workers, count))]


_lock = threading.Lock()
_stack: list[Device] = []


def current() -> Device:
    """The device of the innermost open ``use`` scope (the CPU outside any)."""
    with _lock:
        return _stack[-1] if _stack else CPU


@contextmanager
def use(device: Device) -> Iterator[Device]:
    """Run the default ONNX Runtime sessions created inside (any thread) on ``device``."""
    with _lock:
        _stack.append(device)
    try:
        yield device
    finally:
        with _lock:
            for i in range(len(_stack) - 1, -1, -1):  # scopes of other threads may end later
                if _stack[i] is device:
                    del _stack[i]
                    break


def default_providers() -> tuple[list[str], list[dict[str, str]]]:
    """``(providers, provider_options)`` of the current device."""
    device = current()
    return device.providers(), device.provider_options()


def describe(providers: Sequence[str]) -> str:
    """Short label of a provider list (``cuda``, ``cpu``)."""
    return "+".join(p.replace("ExecutionProvider", "").lower() for p in providers)
