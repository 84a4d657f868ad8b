"""Picking the model output a task metric looks at.

Every task metric receives the reference and the candidate outputs as mappings
``output name -> array`` (the order of the mapping is the model's output order) and chooses the
tensor(s) it needs with an ``output=name`` option; without one it takes the first output.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from precision_doctor.errors import MetricError


def select_output(outputs: Mapping[str, np.ndarray], name: str | None = None, *,
                  role: str = "output") -> np.ndarray:
    """Return one output as a numpy array.

    Args:
        outputs: Output name -> array, in the model's output order.
        name: Output to take; ``None`` takes the first one.
        role: What the caller uses the output for (``"boxes"``, ``"scores"``...), for messages.

    Returns:
        The array (``np.asarray`` of the stored value; not copied).

    Raises:
        MetricError: No outputs at all, or ``name`` is not one of them (the message lists them).
    """
    if not outputs:
        raise MetricError(f"the task metric needs a {role} but the model produced no outputs")
    if name is None:
        return np.asarray(next(iter(outputs.values())))
    if name not in outputs:
        raise MetricError(
            f"the task metric's {role} {name!r} is not a model output; outputs are: "
            f"{', '.join(map(repr, outputs))}. Pass one of them as {role}=NAME.", output=name)
    return np.asarray(outputs[name])


def select_pair(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                name: str | None = None, *, role: str = "output") -> tuple[np.ndarray, np.ndarray]:
    """Return the same output of the reference and of the candidate, checked to have one shape.

    Args:
        reference: Reference outputs (name -> array).
        candidate: Candidate outputs (name -> array).
        name: Output to take; ``None`` takes the first output of each.
        role: What the caller uses the output for, for messages.

    Returns:
        ``(reference_array, candidate_array)``.

    Raises:
        MetricError: The output is missing, or the two arrays differ in shape.
    """
    ref = select_output(reference, name, role=role)
    cand = select_output(candidate, name, role=role)
    if ref.shape != cand.shape:
        label = name if name is not None else "first output"
        raise MetricError(
            f"{role} {label!r}: reference shape {ref.shape} differs from candidate shape "
            f"{cand.shape}; the task metric compares the same tensor of two runs of one model "
            "on the same inputs.", output=name)
    return ref, cand


def parse_param_value(text: str) -> object:
    """Convert one ``key=value`` option value from a metric spec to a Python value.

    ``true``/``false`` (any case) become booleans, ``none`` becomes ``None``, integers and floats
    are converted, anything else stays a string (output names, paths).

    Args:
        text: The value as written after ``=``.

    Returns:
        ``bool``, ``None``, ``int``, ``float`` or ``str``.
    """
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text
