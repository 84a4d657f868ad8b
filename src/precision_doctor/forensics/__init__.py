"""Preprocessing forensics: what differs between two inputs meant to be the same sample.

Entry point: ``compare_inputs(a, b, preprocess_a=..., preprocess_b=..., model=...)`` returns a
``ForensicsResult`` naming channel order, layout, scale, mean/std normalization, resize,
interpolation, crop offset and dtype differences, with the estimated transform and its residual;
``report.terminal.forensics.render_forensics(result, console)`` prints it (report layer).
``analyze_tensors`` works on arrays directly and ``output_effect`` measures how far the
difference moves a model's outputs next to FP16's effect.
"""

from precision_doctor.forensics.analyze import EXPLAINED_REL_STD, analyze_tensors
from precision_doctor.forensics.compare import compare_inputs
from precision_doctor.forensics.effect import output_effect
from precision_doctor.forensics.normalization import KNOWN_NORMALIZATIONS, Normalization, recognize
from precision_doctor.forensics.result import KIND_ORDER, ForensicsResult, InputFinding
from precision_doctor.forensics.sources import LoadedInput, load_side, parse_source

__all__ = [
    "EXPLAINED_REL_STD", "KIND_ORDER", "KNOWN_NORMALIZATIONS", "ForensicsResult", "InputFinding",
    "LoadedInput", "Normalization", "analyze_tensors", "compare_inputs", "load_side",
    "output_effect", "parse_source", "recognize",
]
