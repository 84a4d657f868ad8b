"""Model inputs: images with a preprocessing spec, .npy/.npz, Polygraphy JSON, seeded random.

Entry point: ``load_samples(source, inputs, preprocess, max_samples)`` returns validated
``Sample`` objects (feeds checked and cast by ``check_feeds``); ``open_samples`` streams image
sources (``LazySamples``); ``split_indices`` splits one set into calibration and evaluation.
"""

from precision_doctor.inputs.arrays import load_array_file, read_npy, read_npz, split_along_batch
from precision_doctor.inputs.feeds import (
    Sample,
    cast_input,
    check_feeds,
    check_sample,
    is_dynamic_dim,
    nonfinite_count,
)
from precision_doctor.inputs.images import (
    IMAGE_SUFFIXES,
    SkippedImageWarning,
    decode_image,
    image_input,
    image_to_tensor,
    load_images,
)
from precision_doctor.inputs.load import load_samples, open_samples
from precision_doctor.inputs.polygraphy import (
    decode_array,
    encode_array,
    load_polygraphy_inputs,
    load_polygraphy_outputs,
    read_polygraphy_inputs,
    save_polygraphy_inputs,
)
from precision_doctor.inputs.preprocess import PRESETS, PreprocessSpec, parse_preprocess
from precision_doctor.inputs.resize import ResizePlan, plan_resize
from precision_doctor.inputs.subsets import SPLIT_SEED, LazySamples, Split, pick, split_indices
from precision_doctor.inputs.synthetic import RandomSpec, parse_random, random_samples

__all__ = [
    "IMAGE_SUFFIXES", "PRESETS", "SPLIT_SEED", "LazySamples", "PreprocessSpec", "RandomSpec",
    "ResizePlan", "Sample", "SkippedImageWarning", "Split", "cast_input", "check_feeds",
    "check_sample", "decode_array", "decode_image", "encode_array", "image_input",
    "image_to_tensor", "is_dynamic_dim", "load_array_file", "load_images",
    "load_polygraphy_inputs", "load_polygraphy_outputs", "load_samples", "nonfinite_count",
    "open_samples", "parse_preprocess", "parse_random", "pick", "plan_resize",
    "random_samples", "read_npy", "read_npz", "read_polygraphy_inputs",
    "save_polygraphy_inputs", "split_along_batch", "split_indices",
]
