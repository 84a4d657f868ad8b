"""``analyze_tensors``: what differs between two input tensors meant to be the same sample.

Hypotheses are tested in an order where each step makes the next one measurable:

1. layout: canonicalize both to (C, H, W) (``canonical``), naming a layout, batch or channel-
   count difference, and the dtype;
2. geometry: trailing padding (PaddleOCR pads text lines on the right), then different spatial
   (or padded content) sizes (resample to the smaller size, or locate the smaller as a window of
   the larger: the hypothesis with the smaller residual wins), then a translation of same-size
   tensors (phase correlation; kept only when aligning by it cuts the residual by
   ``SHIFT_GAIN``);
3. values: per-channel affine fit with a channel-permutation search (``fit``); channel order
   from the permutation, scale / mean-std normalization from the normalization each tensor's
   values reveal (``normalization``) or from the fitted constants;
4. resampling: if the fit still leaves more than ``EXPLAINED_REL_STD`` of B's spread, compare the
   sharpness of both (``interpolation``); a buffer reshaped instead of transposed is tried when
   the fit explains almost nothing.

Whatever is left is the residual, reported so the reader knows whether the findings are the
whole story (an ``unexplained`` finding says so when it is large).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from precision_doctor.forensics.canonical import (
    Canonical,
    canonicalize_pair,
    find_padding,
    reinterpret_memory,
    resample,
)
from precision_doctor.forensics.explain import (
    channel_finding,
    chroma,
    dtype_finding,
    layout_findings,
    value_finding,
)
from precision_doctor.forensics.fit import (
    AffineFit,
    estimate_shift,
    fit_affine,
    overlap,
    pointwise_rel_std,
)
from precision_doctor.forensics.interpolation import interpolation_finding
from precision_doctor.forensics.normalization import Recognition, recognize
from precision_doctor.forensics.result import ForensicsResult, InputFinding, sort_findings

# Residual below 2 % of B's spread counts as explained: uint8 rounding of a 0..255 image with
# ~60 levels of spread is ~0.5 %, float16 rounding ~0.05 %; a different resize filter on real
# text crops measured 5-30 %.
EXPLAINED_REL_STD = 0.02
# An ``unexplained`` finding is raised above 5 %: between 2 and 5 % the residual is reported
# but small (Pillow bilinear vs cv2-linear upscaling of tiny crops measured 2.1-2.5 %).
UNEXPLAINED_REL_STD = 0.05
# A per-value (non-linear) map that leaves < 50 % of the affine residual marks a tone curve.
CURVE_GAIN = 0.5
SHIFT_GAIN = 0.7          # an integer shift is kept when it leaves < 70 % of the residual
SHIFT_MIN_RATIO = 2.0     # phase-correlation peak over the next-highest value
REINTERPRET_REL_STD = 0.5  # try "reshaped instead of transposed" above this residual
GRAY_CHROMA = 0.01        # below this, channel order is not observable in the data
_SIZE_SLACK = 2           # pixels of content-size disagreement still treated as equal


@dataclass(frozen=True)
class _Aligned:
    """A and B on one pixel grid, with the pixels to compare."""

    a: np.ndarray
    b: np.ndarray
    mask: np.ndarray
    same_grid: bool  # True when no resampling was needed (interpolation is testable)


def _describe(desc: str, c: Canonical) -> str:
    return f"{desc}: {c.dtype} [{', '.join(str(d) for d in c.shape)}]"


def _match_channels(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Make channel counts equal: drop an alpha channel, replicate a gray one."""
    if a.shape[0] == b.shape[0]:
        return a, b
    if 4 in (a.shape[0], b.shape[0]):
        a, b = a[:3], b[:3]
    if a.shape[0] == 1:
        a = np.repeat(a, b.shape[0], axis=0)
    if b.shape[0] == 1:
        b = np.repeat(b, a.shape[0], axis=0)
    return a, b


def _rel_std(aligned: _Aligned) -> float:
    return fit_affine(aligned.a, aligned.b, aligned.mask).rel_std


def _same_content(a: np.ndarray, b: np.ndarray) -> bool:
    """Same-size tensors whose padded content also agrees (within ``_SIZE_SLACK`` pixels)."""
    (ha, wa), (hb, wb) = find_padding(a).content, find_padding(b).content
    return abs(ha - hb) <= _SIZE_SLACK and abs(wa - wb) <= _SIZE_SLACK


def _same_size(a: np.ndarray, b: np.ndarray
               ) -> tuple[_Aligned, list[InputFinding], dict[str, Any]]:
    """Align same-size tensors: common content mask, then an integer shift when it helps."""
    pa, pb = find_padding(a), find_padding(b)
    h = min(pa.content[0], pb.content[0])
    w = min(pa.content[1], pb.content[1])
    mask = np.zeros(a.shape[1:], bool)
    mask[:h, :w] = True
    findings: list[InputFinding] = []
    info: dict[str, Any] = {}
    base = fit_affine(a, b, mask)
    if min(h, w) >= 8:
        shift = estimate_shift(a[:, :h, :w].mean(axis=0), b[:, :h, :w].mean(axis=0))
        dy, dx = shift.integer
        if (dy, dx) != (0, 0) and shift.ratio >= SHIFT_MIN_RATIO and abs(dy) < h // 2 \
                and abs(dx) < w // 2:
            sa, sb = overlap(a[:, :h, :w], b[:, :h, :w], dy, dx)
            smask = np.ones(sa.shape[1:], bool)
            shifted = fit_affine(sa, sb, smask)
            if shifted.rel_std < SHIFT_GAIN * base.rel_std:
                info["shift_px"] = [dy, dx]
                findings.append(InputFinding(
                    "crop-offset", f"crop/offset differs: B's pixels are A's moved by "
                    f"(dy, dx) = ({dy}, {dx}) px (B[y, x] = A[y {dy:+d}, x {dx:+d}])",
                    {"shift_px": [round(shift.dy, 3), round(shift.dx, 3)],
                     "peak": round(shift.peak, 4), "peak_ratio": round(min(shift.ratio, 1e6), 2),
                     "rel_std_unshifted": round(base.rel_std, 5),
                     "rel_std_shifted": round(shifted.rel_std, 5)},
                    float(np.clip(1.0 - shifted.rel_std / max(base.rel_std, 1e-12), 0.5, 0.95))))
                return _Aligned(sa, sb, smask, True), findings, info
        info["subpixel_shift_px"] = [round(shift.dy, 3), round(shift.dx, 3)]
    if pa.padded or pb.padded:
        info["padding"] = {"a_content": list(pa.content), "b_content": list(pb.content),
                           "a_value": list(pa.value), "b_value": list(pb.value)}
    return _Aligned(a, b, mask, True), findings, info


def _different_size(a: np.ndarray, b: np.ndarray
                    ) -> tuple[_Aligned, list[InputFinding], dict[str, Any]]:
    """Compare different-size tensors: resampled to the smaller size, or as a window."""
    pa, pb = find_padding(a), find_padding(b)
    ha, wa = pa.content
    hb, wb = pb.content
    a_c, b_c = a[:, :ha, :wa], b[:, :hb, :wb]
    evidence: dict[str, Any] = {
        "a_size": list(a.shape[1:]), "b_size": list(b.shape[1:]),
        "a_content": [ha, wa], "b_content": [hb, wb],
        "a_aspect_w_over_h": round(wa / ha, 4), "b_aspect_w_over_h": round(wb / hb, 4)}
    padded = [s for s, p in (("A", pa), ("B", pb)) if p.padded]
    small = (ha, wa) if ha * wa <= hb * wb else (hb, wb)
    ra, rb = resample(a_c, small), resample(b_c, small)
    if padded and abs(ha - hb) <= _SIZE_SLACK and abs(wa - wb) <= _SIZE_SLACK:
        # The same image on different canvases (sizes may differ by rounding: PaddleOCR
        # rounds the resized width up when it pads, down when it does not).
        same = (ha, wa) == (hb, wb)
        content = f"same {ha}x{wa} content" if same else \
            f"content {ha}x{wa} vs {hb}x{wb}: size rounding"
        return (_Aligned(ra, rb, np.ones(small, bool), same), [InputFinding(
            "padding", f"padding differs: {' and '.join(padded)} padded to a larger canvas (A "
            f"{a.shape[1]}x{a.shape[2]}, B {b.shape[1]}x{b.shape[2]}; {content})",
            evidence, 0.9)], {"compared_size": list(small)})
    resampled = fit_affine(*_match_channels(ra, rb))
    window = _locate_window(a_c, b_c)
    if window is not None and window[1].rel_std < resampled.rel_std:
        (oy, ox, inner_is_b), wfit, wa_arr, wb_arr = window
        inner, outer = ("B", "A") if inner_is_b else ("A", "B")
        evidence.update(window_offset=[oy, ox], rel_std_window=round(wfit.rel_std, 5),
                        rel_std_resampled=round(resampled.rel_std, 5))
        finding = InputFinding(
            "crop-offset", f"{inner} is a {wa_arr.shape[1]}x{wa_arr.shape[2]} window of "
            f"{outer} at offset ({oy}, {ox}) (different crop)", evidence, 0.8)
        return (_Aligned(wa_arr, wb_arr, np.ones(wa_arr.shape[1:], bool), True), [finding],
                {"window_offset": [oy, ox], "compared_size": list(wa_arr.shape[1:])})
    evidence["rel_std_resampled"] = round(resampled.rel_std, 5)
    pad_text = f"; {' and '.join(padded)} padded" if padded else ""
    finding = InputFinding(
        "resize", f"resize differs: content is {ha}x{wa} in A and {hb}x{wb} in B (aspect "
        f"{wa / ha:.3g} vs {wb / hb:.3g}{pad_text})", evidence, 0.95)
    return (_Aligned(ra, rb, np.ones(small, bool), False), [finding],
            {"resampled": f"both resampled to {small[0]}x{small[1]} (bilinear) to compare",
             "compared_size": list(small)})


def _locate_window(a: np.ndarray, b: np.ndarray
                   ) -> tuple[tuple[int, int, bool], AffineFit, np.ndarray, np.ndarray] | None:
    """Where the smaller tensor sits inside the larger one (phase correlation), if it fits."""
    inner_is_b = b.shape[1] <= a.shape[1] and b.shape[2] <= a.shape[2]
    if not inner_is_b and not (a.shape[1] <= b.shape[1] and a.shape[2] <= b.shape[2]):
        return None
    outer, inner = (a, b) if inner_is_b else (b, a)
    _, h, w = inner.shape
    if min(h, w) < 8:
        return None
    plane = inner.mean(axis=0)
    padded = np.full(outer.shape[1:], plane.mean())
    padded[:h, :w] = plane
    shift = estimate_shift(outer.mean(axis=0), padded)
    oy, ox = shift.integer
    if not (0 <= oy <= outer.shape[1] - h and 0 <= ox <= outer.shape[2] - w):
        return None
    crop = outer[:, oy:oy + h, ox:ox + w]
    pair = (crop, inner) if inner_is_b else (inner, crop)
    fa, fb = _match_channels(*pair)
    return (oy, ox, inner_is_b), fit_affine(fa, fb), fa, fb


def _try_reinterpret(arr_a: np.ndarray, arr_b: np.ndarray, ca: Canonical, cb: Canonical
                     ) -> tuple[np.ndarray, np.ndarray, InputFinding] | None:
    """A buffer reshaped instead of transposed: does reading it as the other layout fit?

    Returns:
        (A, B) with the offending side re-read, and the layout finding; None when the tensors
        already fit reasonably (``REINTERPRET_REL_STD``) or re-reading does not halve the
        residual.
    """
    fit = fit_affine(ca.chw, cb.chw)
    if fit.rel_std <= REINTERPRET_REL_STD:
        return None
    for side, arr, canon in (("B", arr_b, cb), ("A", arr_a, ca)):
        other = reinterpret_memory(arr, canon)
        if other is None or other.shape != canon.chw.shape:
            continue
        a, b = (ca.chw, other) if side == "B" else (other, cb.chw)
        refit = fit_affine(a, b)
        if refit.rel_std < 0.5 * fit.rel_std:
            held = "HWC" if canon.axes == (0, 1, 2) else "CHW"
            return a, b, InputFinding(
                "layout", f"{side}'s memory holds {held} data in a "
                f"{canon.layout.upper()}-shaped tensor (reshaped instead of transposed)",
                {"rel_std_as_given": round(fit.rel_std, 5),
                 "rel_std_reinterpreted": round(refit.rel_std, 5)}, 0.9)
    return None


def _recognize_own(canon: Canonical, values: np.ndarray, aligned: _Aligned) -> Recognition:
    """Normalization of one side, read from its own pixel grid (resampling breaks the lattice)."""
    if aligned.same_grid:
        return recognize(values, canon.dtype, aligned.mask)
    chw = canon.chw if values.shape[0] == canon.channels else values
    h, w = find_padding(chw).content
    mask = np.zeros(chw.shape[1:], bool)
    mask[:h, :w] = True
    return recognize(chw, canon.dtype, mask)


def _value_findings(fit: AffineFit, aligned: _Aligned, ca: Canonical, cb: Canonical,
                    transform: dict[str, Any]) -> list[InputFinding]:
    """Channel order, then scale / normalization (a tone curve replaces an unrecognized map)."""
    findings = []
    colour = chroma(aligned.a, aligned.mask)
    transform.update(channel_permutation=list(fit.perm), scale=list(fit.scale),
                     offset=list(fit.offset), chroma=round(colour, 4),
                     channel_order_observable=colour >= GRAY_CHROMA,
                     residual_rel_std=fit.rel_std)
    channel = channel_finding(fit, aligned.a, aligned.mask)
    findings += [channel] if channel else []
    rec_a, rec_b = _recognize_own(ca, aligned.a, aligned), _recognize_own(cb, aligned.b, aligned)
    transform["normalization"] = {
        "a": rec_a.normalization.key if rec_a.normalization else None,
        "b": rec_b.normalization.key if rec_b.normalization else None}
    value = value_finding(fit, rec_a, rec_b, aligned.b, aligned.mask)
    if fit.rel_std > EXPLAINED_REL_STD:
        pointwise = pointwise_rel_std(fit.apply(aligned.a), aligned.b, aligned.mask)
        transform["pointwise_rel_std"] = pointwise
        if pointwise < CURVE_GAIN * fit.rel_std:
            recognized = rec_a.normalization is not None and rec_b.normalization is not None
            findings += [value] if value and recognized else []
            return findings + [InputFinding(
                "normalization", "values differ by a non-linear curve (gamma, tone curve or a "
                f"colour-space round trip): a per-value map leaves {pointwise:.1%} of B's "
                f"spread where the best affine map leaves {fit.rel_std:.1%}",
                {"rel_std_affine": round(fit.rel_std, 5),
                 "rel_std_pointwise": round(pointwise, 5)}, 0.7)]
    return findings + ([value] if value else [])


def _residual_findings(fit: AffineFit, aligned: _Aligned, found: list[InputFinding],
                       transform: dict[str, Any]) -> list[InputFinding]:
    """Resampling differences, or an ``unexplained`` finding, for what the value map leaves."""
    kinds = {f.kind for f in found}
    curve = "pointwise_rel_std" in transform and \
        transform["pointwise_rel_std"] < CURVE_GAIN * fit.rel_std
    if fit.rel_std <= EXPLAINED_REL_STD or curve:
        return []
    if aligned.same_grid and "crop-offset" not in kinds:
        interp = interpolation_finding(aligned.a, fit.apply(aligned.a), aligned.b,
                                       aligned.mask, fit.rel_std)
        if interp is not None:
            return [interp]
    if fit.rel_std <= UNEXPLAINED_REL_STD or kinds & {"resize", "crop-offset", "layout"}:
        return []
    evidence = {"residual_rel_std": round(fit.rel_std, 5)}
    if "subpixel_shift_px" in transform:
        evidence["subpixel_shift_px"] = transform["subpixel_shift_px"]
    return [InputFinding(
        "unexplained", f"{fit.rel_std:.1%} of B's spread is not explained by a channel order, "
        "scale, normalization, offset or resampling difference", evidence, 0.5)]


def analyze_tensors(a: np.ndarray, b: np.ndarray, a_desc: str = "A", b_desc: str = "B"
                    ) -> ForensicsResult:
    """Name what differs between tensors A and B and estimate the transform from A to B.

    Args:
        a: Tensor A: (N, C, H, W), (N, H, W, C), (C, H, W), (H, W, C), (H, W), any numeric
            dtype; with N > 1 only the first entry is compared.
        b: Tensor B, same conventions.
        a_desc: Where A came from (file, preprocessing), for the report.
        b_desc: Same for B.

    Returns:
        ``ForensicsResult`` with findings sorted most important first, the transform and the
        residual (``output_effect`` None: see ``compare_inputs``).

    Raises:
        InputShapeError: A tensor is empty or not numeric.
    """
    ca, cb = canonicalize_pair(a, b)
    nonfinite = {"a": int(np.size(ca.chw) - np.count_nonzero(np.isfinite(ca.chw))),
                 "b": int(np.size(cb.chw) - np.count_nonzero(np.isfinite(cb.chw)))}
    if nonfinite["a"] or nonfinite["b"]:  # compared as 0; reported in the transform
        ca = dataclasses.replace(ca, chw=np.nan_to_num(ca.chw, nan=0.0, posinf=0.0, neginf=0.0))
        cb = dataclasses.replace(cb, chw=np.nan_to_num(cb.chw, nan=0.0, posinf=0.0, neginf=0.0))
    findings = layout_findings(ca, cb)
    dt = dtype_finding(ca, cb)
    findings += [dt] if dt else []
    xa, xb = _match_channels(ca.chw, cb.chw)
    transform: dict[str, Any] = {"layout": {"a": ca.layout, "b": cb.layout}}
    if nonfinite["a"] or nonfinite["b"]:
        transform["nonfinite"] = nonfinite
    if a.shape == b.shape:  # the difference as given, before any explanation
        raw_a, raw_b = (np.nan_to_num(np.asarray(x, np.float64), nan=0.0, posinf=0.0,
                                      neginf=0.0) for x in (a, b))
        den = float(np.linalg.norm(raw_b))
        transform["difference_rel_l2"] = float(np.linalg.norm(raw_a - raw_b) / den) if den \
            else None
    if xa.shape == xb.shape:
        memory = _try_reinterpret(a, b, ca, cb) if ca.chw.shape == cb.chw.shape else None
        if memory is not None:
            xa, xb, found = memory
            findings.append(found)
            transform["reinterpreted"] = found.summary
        aligned, geo, info = _same_size(xa, xb)
        if not _same_content(xa, xb):  # padded content differs: or was B stretched?
            other = _different_size(xa, xb)
            if _rel_std(other[0]) < _rel_std(aligned):
                aligned, geo, info = other
    else:
        aligned, geo, info = _different_size(xa, xb)
    findings += geo
    transform.update(info)
    fit = fit_affine(aligned.a, aligned.b, aligned.mask)
    findings += _value_findings(fit, aligned, ca, cb, transform)
    findings += _residual_findings(fit, aligned, findings, transform)
    return ForensicsResult(_describe(a_desc, ca), _describe(b_desc, cb), sort_findings(findings),
                           transform, fit.rel_l2)
