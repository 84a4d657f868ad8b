"""``--device auto`` by workload: the GPU where it pays, the CPU for a few samples of a small
model.

A diagnosis or a fix runs the model's FP32 equivalent some 20 to 60 times over (reference,
emulation, noise probes, layerwise segments, impact trials, search evaluations). A process on
a GPU pays seconds before its first useful run and more per session. Measured on one H100
machine with 16 CPU cores (BENCHMARKS.md, 2026-11-26, ONNX Runtime 1.31.1): starting CUDA
(``onnxruntime.preload_dlls()``, cuDNN/cuBLAS, the first session) took 3.7 s; PP-OCRv4 det on
3 images at 640 (FP32 reference 0.38 s on the CPU) was diagnosed in 8.2 s on the CPU and 14.4 s
on the GPU; PP-OCRv4 rec on 256 real strips (reference 3.5 s on the CPU) in 225 s on the CPU
and 73 s on the GPU. So ``auto`` times one FP32 run of the first sample on the CPU, scales it
by the number of samples, and stays on the CPU when that estimate of the reference is under
``AUTO_CPU_SECONDS`` (1.5 s: between det's 0.4 s, where the CPU won, and the 256 strips' 3.5 s,
where the GPU won). Models with external data or of 256 MiB and more
(``graph.external.small_in_memory``) go to the GPU without the estimate: their one CPU run
would itself cost seconds. ``--device cuda`` always takes the GPU.
"""

from __future__ import annotations

import time
from typing import Sequence

import onnx

from precision_doctor.errors import PrecisionDoctorError
from precision_doctor.graph.external import small_in_memory
from precision_doctor.inputs import Sample
from precision_doctor.runners.device import CPU, Device, parse_device, resolve_device
from precision_doctor.runners.ort import OrtRunner

AUTO_CPU_SECONDS = 1.5


def choose_device(spec: str | Device | None, model: onnx.ModelProto,
                  samples: Sequence[Sample]) -> tuple[Device, str | None]:
    """The device a diagnosis or fix of ``samples`` runs on, and a note when ``auto`` chose
    the CPU although a GPU is there.

    Args:
        spec: ``--device`` (``auto``/None, ``cpu``, ``cuda``, ``cuda:N`` or a ``Device``).
        model: The FP32 model.
        samples: The calibration samples (their count scales the estimate).

    Returns:
        ``(device, note)``; the note (None unless ``auto`` kept the CPU) says why and how to
        force the GPU. When ONNX Runtime CPU cannot run the model, ``auto`` keeps the GPU.

    Raises:
        InputError: Unknown spec.
        BackendUnavailable: CUDA was asked for explicitly and cannot run
            (``runners.device.resolve_device``).
    """
    device = resolve_device(spec)
    if not device.is_cuda or not parse_device(spec)[1] or not samples \
            or not small_in_memory(model):
        return device, None
    try:
        seconds = cpu_reference_seconds(model, samples)
    except PrecisionDoctorError:  # the CPU cannot run it: the GPU may (its error is the run's)
        return device, None
    if seconds >= AUTO_CPU_SECONDS:
        return device, None
    return CPU, (f"--device auto ran on the CPU, not {device.label}: the FP32 reference of "
                 f"these {len(samples)} sample(s) takes about {seconds:.2f} s there, under "
                 f"the {AUTO_CPU_SECONDS} s below which starting CUDA costs more than it saves "
                 "(api/device.py); --device cuda runs it on the GPU")


def cpu_reference_seconds(model: onnx.ModelProto, samples: Sequence[Sample]) -> float:
    """Estimated seconds of the FP32 reference of ``samples`` on ONNX Runtime CPU: one run of
    the first sample, timed (its first run: an overestimate, which favours the GPU), times the
    number of samples.

    Raises:
        BackendError: ONNX Runtime CPU cannot run the model.
    """
    with OrtRunner(model, ("cpu",), name="device-estimate") as runner:
        t = time.perf_counter()
        runner.run(samples[0].feeds)
        return (time.perf_counter() - t) * len(samples)
