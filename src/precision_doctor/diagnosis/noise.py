"""The FP32 noise floor: how much the FP32 reference itself moves under harmless changes.

Two probes, each compared with the reference outputs (relative L2 error):

* ``fp64``: the same model computed in float64 (every float initializer, Constant, Cast target
  and graph I/O switched to double), when ONNX Runtime CPU has double kernels for all its ops.
  This measures the FP32 reference's own rounding error against a much more exact result.
* ``no-graph-opt``: ONNX Runtime with graph optimizations disabled (no fusions, other kernels),
  i.e. a different but equally valid FP32 evaluation order.
* ``cpu``: when the reference ran on a GPU (``runners.device``: CUDA FP32, TF32 off), ONNX
  Runtime CPU on the first ``CPU_PROBE_SAMPLES`` samples: the CPU reference the GPU one
  stands in for, so the floor covers the difference between the two.
* ``repeat``: for a model with random operators (``graph.random_ops``; ``diagnose`` seeds
  them), the same FP32 model run again in a new session: any difference is nondeterminism
  that the seeds did not remove, and ``nondeterministic`` says so. The ``fp64`` probe is then
  skipped: a float64 generator draws other numbers than a float32 one from the same seed.

The floor of an output is the largest of the probes that ran. An error at (a small multiple of)
the floor is the model's conditioning, not a precision problem.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from precision_doctor.compare.metrics import relative_l2
from precision_doctor.errors import BackendError
from precision_doctor.graph.external import external_bytes, is_external, tensor_array
from precision_doctor.graph.random_ops import RANDOM_OPS
from precision_doctor.graph.weight_store import stored_tensor_proto
from precision_doctor.runners import device
from precision_doctor.runners.batching import batches_on, run_batched
from precision_doctor.runners.ort import OrtRunner

_F = TensorProto.FLOAT
_D = TensorProto.DOUBLE
# The fp64 probe doubles the weights (as float64 in the weight store): skipped above 1 GiB of
# external weights, where memory and disk, not accuracy, would limit the run.
FP64_PROBE_MAX_BYTES = 1 << 30
# Samples the CPU cross-check of a GPU reference runs: one CPU run per sample is what the GPU
# saves, so a large calibration set is not run on the CPU again.
CPU_PROBE_SAMPLES = 2


@dataclass(frozen=True)
class NoiseFloor:
    """FP32 noise floor per output.

    Attributes:
        per_output: Output name -> floor (relative L2 error, the max over probes).
        probes: Probe name -> {output name: relative L2 error}.
        skipped: Probe name -> why it did not run.
    """

    per_output: dict[str, float]
    probes: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def nondeterministic(self) -> bool:
        """Whether two FP32 runs of the same model on the same samples differed (``repeat``)."""
        return any(v != 0 for v in self.probes.get("repeat", {}).values())

    @classmethod
    def from_dict(cls, data: Mapping) -> NoiseFloor:
        return cls(dict(data["per_output"]), dict(data.get("probes", {})),
                   dict(data.get("skipped", {})))


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64 wherever it computed in float32."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for t in g.initializer:
        if t.data_type == _F and is_external(t):  # stays external (weight store)
            t.CopyFrom(stored_tensor_proto(tensor_array(t).astype(np.float64), t.name))
        elif t.data_type == _F:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == _F:
            vi.type.tensor_type.elem_type = _D
    del g.value_info[:]
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _F:
                a.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
            elif node.op_type == "Cast" and a.name == "to" and a.i == _F:
                a.i = _D
    return m


def measure_noise_floor(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]],
                        reference: Mapping[str, Sequence[np.ndarray]],
                        outputs: dict[str, dict[str, list[np.ndarray]]] | None = None
                        ) -> NoiseFloor:
    """Run the probes and return the floor per output.

    Args:
        model: The FP32 model.
        samples: Feed dicts.
        reference: Output name -> reference arrays (one per sample).
        outputs: When given, filled with probe name -> output name -> the probe's arrays
            (per-position noise, e.g. at decision flips).

    Returns:
        ``NoiseFloor``; probes that cannot run are listed in ``skipped`` with the reason.
    """
    probes: dict[str, dict[str, float]] = {}
    skipped: dict[str, str] = {}
    big = external_bytes(model)
    if big > FP64_PROBE_MAX_BYTES:
        skipped["fp64"] = (f"the model has {big / 2**30:.1f} GiB of external weights: a float64 "
                           "copy would double them (limit "
                           f"{FP64_PROBE_MAX_BYTES / 2**30:.0f} GiB)")
    random = any(n.op_type in RANDOM_OPS for n in model.graph.node)
    if random:
        skipped["fp64"] = ("the model draws random numbers: a float64 copy would draw others "
                           "from the same seed")
    variants = {} if big > FP64_PROBE_MAX_BYTES or random else {
        "fp64": lambda: OrtRunner(to_float64(model), name="ort-cpu-fp64")}
    if random:
        variants["repeat"] = lambda: OrtRunner(model, name="ort-cpu-repeat")
    variants["no-graph-opt"] = lambda: OrtRunner(model, name="ort-cpu-noopt",
                                                 graph_optimization="disable")
    batched = batches_on(device.current().is_cuda, model, len(samples))
    for probe, make in variants.items():
        try:
            with make() as runner:
                outs: dict[str, list[np.ndarray]] = {k: [] for k in reference}
                feeds_list = [{k: (v.astype(np.float64) if probe == "fp64"
                                   and v.dtype == np.float32 else v) for k, v in feeds.items()}
                              for feeds in samples]
                if batched:  # on a GPU, as the reference ran (runners.batching)
                    results = run_batched(runner, feeds_list, list(reference))
                else:
                    results = [runner.run(feeds) for feeds in feeds_list]
                for result in results:
                    for k in reference:
                        outs[k].append(result[k])
            probes[probe] = {k: relative_l2(reference[k], outs[k]) for k in reference}
            if outputs is not None:
                outputs[probe] = outs
        except BackendError as exc:
            skipped[probe] = str(exc).splitlines()[0][:300]
    if device.current().is_cuda:
        try:
            probes["cpu"] = _cpu_probe(model, samples[:CPU_PROBE_SAMPLES], reference)
        except BackendError as exc:
            skipped["cpu"] = str(exc).splitlines()[0][:300]
    per_output = {k: max((p[k] for p in probes.values()), default=0.0) for k in reference}
    return NoiseFloor(per_output, probes, skipped)


def _cpu_probe(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]],
               reference: Mapping[str, Sequence[np.ndarray]]) -> dict[str, float]:
    """Relative L2 of ONNX Runtime CPU FP32 against the (GPU) reference on ``samples``."""
    with OrtRunner(model, ("cpu",), name="ort-cpu") as runner:
        outs = [runner.run(feeds) for feeds in samples]
    return {k: relative_l2(list(reference[k][:len(outs)]), [o[k] for o in outs])
            for k in reference}
