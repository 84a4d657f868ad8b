"""Turn measurements into named findings: layout, dtype, channel order, scale/normalization.

Each function reads one aspect of the evidence and returns ``InputFinding`` objects (or none);
the order in which ``analyze`` calls them, and how it aligns the tensors first, lives in
``precision_doctor.forensics.analyze``.
"""

from __future__ import annotations

import numpy as np

from precision_doctor.forensics.canonical import Canonical
from precision_doctor.forensics.fit import AffineFit
from precision_doctor.forensics.normalization import (
    MIN_LEVEL_SPAN,
    Normalization,
    Recognition,
    describe_change,
    match_lattice,
)
from precision_doctor.forensics.result import InputFinding

# A B channel is "the same scale" as another within 2 %, and an offset is negligible below 2 %
# of B's value range: far above float32/float16 rounding, far below any real mean (>= 0.4 std).
UNIFORM_SCALE_TOL = 0.02
OFFSET_TOL = 0.02
# |log s| within 3 % of log 255: the factor 255 (or 1/255) of a missing or extra ``/255``.
SCALE_255_TOL = 0.03
_LAYOUT_NAMES = {"nchw": "NCHW", "nhwc": "NHWC", "chw": "CHW", "hwc": "HWC", "hw": "HW",
                 "flat": "flat"}


def _shape(c: Canonical) -> str:
    return "[" + ", ".join(str(d) for d in c.shape) + "]"


def layout_findings(a: Canonical, b: Canonical) -> list[InputFinding]:
    """Layout (axis order), missing batch dim, and channel-count differences."""
    findings = []
    evidence = {"a_layout": a.layout, "b_layout": b.layout, "a_shape": list(a.shape),
                "b_shape": list(b.shape)}
    confidence = 0.6 if (a.ambiguous or b.ambiguous) else 0.95
    la, lb = _LAYOUT_NAMES[a.layout], _LAYOUT_NAMES[b.layout]
    if a.axes != b.axes and "flat" not in (a.layout, b.layout):
        findings.append(InputFinding(
            "layout", f"layout differs: A is {la} {_shape(a)}, B is {lb} {_shape(b)} "
            f"(B = A transposed)", evidence, confidence))
    elif la.lstrip("N") == lb.lstrip("N") and la != lb:
        missing = "B" if la.startswith("N") else "A"
        findings.append(InputFinding(
            "layout", f"{missing} has no batch dimension: A is {la} {_shape(a)}, B is {lb} "
            f"{_shape(b)}", evidence, 0.9))
    if a.channels != b.channels and "flat" not in (a.layout, b.layout):
        kinds = {1: "grayscale", 3: "color", 4: "color with alpha"}
        findings.append(InputFinding(
            "layout", f"channel count differs: A has {a.channels} "
            f"({kinds.get(a.channels, 'channels')}), B has {b.channels} "
            f"({kinds.get(b.channels, 'channels')})",
            {**evidence, "a_channels": a.channels, "b_channels": b.channels}, 0.95))
    if a.batch != b.batch:
        findings.append(InputFinding(
            "layout", f"batch size differs: A has {a.batch}, B has {b.batch} (only the first "
            "entry of each is compared)", {"a_batch": a.batch, "b_batch": b.batch}, 0.9))
    return findings


def dtype_finding(a: Canonical, b: Canonical) -> InputFinding | None:
    """The dtype finding, with what the narrower type loses."""
    if a.dtype == b.dtype:
        return None
    evidence: dict[str, object] = {"a_dtype": a.dtype, "b_dtype": b.dtype}
    notes = []
    for side, c in (("A", a), ("B", b)):
        kind = np.dtype(c.dtype).kind if c.dtype in np.sctypeDict else "V"
        if kind in "iu":
            notes.append(f"{side} holds integers (fractions are rounded away)")
        elif c.dtype == "float16":
            notes.append(f"{side} is float16 (11-bit significand, ~3 significant digits)")
        elif c.dtype == "bfloat16":
            notes.append(f"{side} is bfloat16 (8-bit significand, ~2 significant digits)")
    tail = f"; {'; '.join(notes)}" if notes else ""
    return InputFinding("dtype", f"dtype differs: A is {a.dtype}, B is {b.dtype}{tail}",
                        evidence, 1.0)


def channel_finding(fit: AffineFit, a: np.ndarray, mask: np.ndarray) -> InputFinding | None:
    """Channel-order finding from the best permutation of the affine fit.

    Confidence is the share of the identity fit's residual variance that the permutation
    removes: ``1 - (rel_std(best) / rel_std(identity))^2`` (0.75 when the identity leaves twice
    the residual, e.g. when a resize difference adds its own residual to both).
    """
    if fit.perm == tuple(range(len(fit.perm))):
        return None
    evidence = {"permutation": list(fit.perm), "rel_std_best": round(fit.rel_std, 5),
                "rel_std_identity": round(fit.identity_rel_std, 5),
                "chroma": round(chroma(a, mask), 4)}
    gain = 1.0 - (fit.rel_std / fit.identity_rel_std) ** 2 if fit.identity_rel_std > 0 else 0.0
    confidence = float(np.clip(gain, 0.0, 0.99))
    if fit.perm == (2, 1, 0):
        summary = "channel order is reversed (RGB vs BGR)"
    else:
        pairs = ", ".join(f"B[{c}] = A[{p}]" for c, p in enumerate(fit.perm))
        summary = f"channels are permuted: {pairs}"
    return InputFinding("channel-order", summary, evidence, confidence)


def chroma(chw: np.ndarray, mask: np.ndarray) -> float:
    """How colourful a tensor is: mean |channel - channel mean| / std, over ``mask``.

    0 for a gray image, where channel order cannot be seen in the data.
    """
    if chw.shape[0] < 2:
        return 0.0
    values = chw[:, mask]
    standardized = (values - values.mean(axis=1, keepdims=True)) / np.maximum(
        values.std(axis=1, keepdims=True), 1e-12)
    return float(np.abs(standardized - standardized.mean(axis=0)).mean())


def _factor_text(s: float) -> str:
    if abs(abs(np.log(abs(s))) - np.log(255.0)) <= SCALE_255_TOL * np.log(255.0):
        return "255" if abs(s) > 1 else "1/255"
    return f"{s:.4g}" if abs(s) >= 1 else f"1/{1 / s:.4g}"


def implied_normalization(known: Normalization, fit: AffineFit, channels: int,
                          a_is_known: bool, rel_tol: float = 0.03) -> Normalization | None:
    """The other side's normalization implied by ``known`` and the fitted map, if it is known.

    B = s * A[perm] + t, so B's lattice is (s d_A[perm], s o_A[perm] + t); A's follows by
    inverting the map. ``rel_tol`` is passed to ``match_lattice``.
    """
    lattice = known.lattice(channels)
    if lattice is None:
        return None
    d, o = lattice
    s, t, perm = np.asarray(fit.scale), np.asarray(fit.offset), list(fit.perm)
    if np.any(s == 0):
        return None
    if a_is_known:
        return match_lattice(s * d[perm], s * o[perm] + t, rel_tol)
    inverse = np.argsort(perm)  # A[j] = (B[inverse[j]] - t) / s
    si, ti = s[inverse], t[inverse]
    return match_lattice(d[inverse] / si, (o[inverse] - ti) / si, rel_tol)


def lattices_consistent(na: Normalization, nb: Normalization, rec_a: Recognition,
                        rec_b: Recognition, fit: AffineFit) -> bool:
    """Are two recognized normalizations trustworthy together?

    A lattice recognized over a wide span of levels (``MIN_LEVEL_SPAN``) is no accident and is
    trusted (the fitted slope is biased by resampling differences: up to 9 % measured on the
    PP-OCR crops). Over a narrow span (a few small integers that need not be pixels) the
    recognitions must agree with the fitted map (within the fit's own residual, at least 3 %).
    """
    if min(rec_a.level_span, rec_b.level_span) >= MIN_LEVEL_SPAN:
        return True
    tolerance = max(0.03, fit.rel_std)
    return implied_normalization(na, fit, len(fit.scale), True, tolerance) == nb


def value_finding(fit: AffineFit, rec_a: Recognition, rec_b: Recognition, b: np.ndarray,
                  mask: np.ndarray) -> InputFinding | None:
    """Scale / normalization finding.

    Both sides recognized (``normalization.recognize``): named from the two normalizations.
    One side recognized: the other's is inferred through the fitted map when it is a known
    one. Otherwise: read off the fitted per-channel scale and offset.
    """
    na, nb = rec_a.normalization, rec_b.normalization
    evidence: dict[str, object] = {
        "scale": [round(v, 6) for v in fit.scale], "offset": [round(v, 6) for v in fit.offset],
        "a": rec_a.to_evidence(), "b": rec_b.to_evidence()}
    channels = len(fit.scale)
    inferred = None
    if na is not None and nb is None:
        nb = inferred = implied_normalization(na, fit, channels, a_is_known=True)
    elif nb is not None and na is None:
        na = inferred = implied_normalization(nb, fit, channels, a_is_known=False)
    if inferred is None and na is not None and nb is not None and \
            not lattices_consistent(na, nb, rec_a, rec_b, fit):
        # Both lattices fit but the fitted map does not connect them (e.g. small integer
        # tensors that are not pixels): trust the fitted map.
        evidence["recognition_inconsistent_with_fit"] = True
        return _affine_finding(fit, b, mask, evidence)
    if na is not None and nb is not None:
        change = describe_change(na, nb)
        if change is None:
            return None
        if inferred is not None:
            evidence["inferred"] = inferred.key
        kind, summary = change
        return InputFinding(kind, summary, evidence, 0.95 if inferred is None else 0.85)
    return _affine_finding(fit, b, mask, evidence)


def _affine_finding(fit: AffineFit, b: np.ndarray, mask: np.ndarray,
                    evidence: dict[str, object]) -> InputFinding | None:
    s, t = np.asarray(fit.scale), np.asarray(fit.offset)
    values = b[:, mask]
    spread = np.quantile(values, 0.999, axis=1) - np.quantile(values, 0.001, axis=1)
    spread = np.where(spread > 0, spread, 1.0)
    uniform = bool(np.all(s > 0) or np.all(s < 0)) and \
        float(np.abs(s).max() / max(np.abs(s).min(), 1e-300)) <= 1 + UNIFORM_SCALE_TOL
    offset_small = bool(np.all(np.abs(t) <= OFFSET_TOL * spread))
    unit = bool(np.all(np.abs(s - 1.0) <= UNIFORM_SCALE_TOL / 2))
    if uniform and unit and offset_small:
        return None
    confidence = 0.8 if fit.rel_std < 0.05 else 0.6
    mean_s = float(np.mean(s))
    near_255 = abs(abs(np.log(abs(mean_s))) - np.log(255.0)) <= SCALE_255_TOL * np.log(255.0)
    if uniform and (offset_small or near_255):
        tail = "" if offset_small else f", plus offsets {', '.join(f'{v:.4g}' for v in t)}"
        return InputFinding("scale", f"value scale differs: B = A x {_factor_text(mean_s)}"
                            f"{tail}", evidence, confidence)
    sc = ", ".join(f"{v:.4g}" for v in s)
    of = ", ".join(f"{v:.4g}" for v in t)
    return InputFinding(
        "normalization", f"normalization differs (unrecognized constants): per channel "
        f"B = A x ({sc}) + ({of})", evidence, confidence)
