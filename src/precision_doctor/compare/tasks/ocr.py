"""OCR (CTC text recognition) agreement: decode both outputs and compare the strings.

Decoding is CTC best-path ("greedy") decoding (Graves et al., "Connectionist Temporal
Classification", ICML 2006, sec. 3.2): argmax class per time step, collapse repeats, drop the
blank (index 0). This is PaddleOCR's ``CTCLabelDecode`` / RapidOCR 1.4.4's
``ch_ppocr_rec/utils.py``, including its confidence (mean of the per-step maximum probability of
the kept steps, 0.0 for an empty string).

Without a character list the metrics compare the decoded class-index sequences, which is the same
as comparing strings whenever each class is one character; pass ``charset=model.onnx`` (the rec
model, reading its ``character`` metadata) or ``charset=keys.txt`` (one character per line) to
compare text, which ``ignore_case=true`` needs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from precision_doctor.compare.tasks.io import select_pair
from precision_doctor.errors import MetricError, ModelLoadError

BLANK = ""  # placeholder text of the CTC blank class (index 0); never emitted


def ctc_charset_from_model(model: onnx.ModelProto | str | os.PathLike,
                           use_space_char: bool | None = None) -> list[str]:
    """The class list of a PP-OCR recognition model, from its ``character`` metadata.

    PP-OCR ONNX exports (paddle2onnx, as shipped in RapidOCR) store the dictionary in
    ``metadata_props["character"]``, one character per line. The class list is, as in RapidOCR
    1.4.4 (``OrtInferSession.get_character_list`` uses ``str.splitlines``; ``CTCLabelDecode``
    inserts the blank at 0 and appends ``" "``) and PaddleOCR ``use_space_char=True``::

        [blank] + lines + [" "]

    Args:
        model: The model proto, or a path to the ``.onnx`` file (external weights not needed).
        use_space_char: Append ``" "``. ``None`` decides from the model's static class dimension
            (last axis of output 0): ``len(lines) + 2`` -> yes, ``len(lines) + 1`` -> no; when
            the dimension is not static, yes (RapidOCR always appends it).

    Returns:
        Class index -> text; index 0 is the blank (``""``).

    Raises:
        ModelLoadError: The path cannot be read as ONNX.
        MetricError: No ``character`` metadata, or its length does not fit the class dimension.
    """
    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # missing file, bad protobuf
            raise ModelLoadError(f"cannot read {path} to get its CTC character list: {exc}",
                                 file=str(path)) from exc
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise MetricError(
            "the model has no 'character' metadata (PP-OCR's CTC dictionary); pass the "
            f"dictionary file as charset=keys.txt instead. Metadata keys: {sorted(meta)}")
    lines = meta["character"].splitlines()
    classes = _static_class_dim(model)
    if use_space_char is None:
        use_space_char = classes != len(lines) + 1
    charset = [BLANK, *lines, *([" "] if use_space_char else [])]
    if classes is not None and classes != len(charset):
        raise MetricError(
            f"the model's 'character' metadata has {len(lines)} entries, so {len(charset)} "
            f"classes with blank{' and space' if use_space_char else ''}, but the output has "
            f"{classes} classes; is this the dictionary of this model?")
    return charset


def _static_class_dim(model: onnx.ModelProto) -> int | None:
    if not model.graph.output:
        return None
    dims = model.graph.output[0].type.tensor_type.shape.dim
    return int(dims[-1].dim_value) if dims and dims[-1].HasField("dim_value") else None


def ctc_charset_from_file(path: str | os.PathLike, use_space_char: bool = True) -> list[str]:
    """A class list from a PaddleOCR dictionary text file (one character per line, UTF-8).

    Lines are read as PaddleOCR/RapidOCR do (``rstrip`` of ``"\\r\\n"``); blank inserted at 0, and
    ``" "`` appended when ``use_space_char``.

    Raises:
        MetricError: The file cannot be read.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricError(f"cannot read CTC dictionary {path}: {exc}", file=str(path)) from exc
    lines = [line.rstrip("\r\n") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return [BLANK, *lines, *([" "] if use_space_char else [])]


def load_charset(spec: str | os.PathLike | Sequence[str] | None) -> list[str] | None:
    """Class list from ``.onnx`` (model metadata), any other file (dictionary text), or a list.

    ``None`` stays ``None``; a list or tuple of strings is returned as a list.
    """
    if spec is None:
        return None
    if not isinstance(spec, (str, os.PathLike)):
        return list(spec)
    path = Path(spec).resolve()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise MetricError(f"CTC character list file {spec} cannot be read: {exc}",
                          file=str(spec)) from exc
    return list(_cached_charset(str(path), stamp))


@functools.lru_cache(maxsize=8)
def _cached_charset(path: str, stamp: int) -> tuple[str, ...]:
    # ``stamp`` (mtime) is part of the key so an edited file is read again.
    if path.lower().endswith(".onnx"):
        return tuple(ctc_charset_from_model(path))
    return tuple(ctc_charset_from_file(path))


def ctc_best_path(probs: np.ndarray, blank: int = 0) -> list[tuple[tuple[int, ...], float]]:
    """Greedy CTC decoding to class indices.

    Args:
        probs: ``[N, T, C]`` per-step class scores (probabilities for PP-OCR); ``[T, C]`` is one
            sample.
        blank: Index of the blank class.

    Returns:
        Per sample ``(class_indices, confidence)``: the collapsed non-blank classes, and the mean
        of the per-step maximum score over the kept steps (0.0 when nothing is kept).

    Raises:
        MetricError: ``probs`` is not 2-D or 3-D.
    """
    p = np.asarray(probs)
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3 or p.shape[-1] == 0:
        raise MetricError(f"CTC decoding needs scores of shape [N, T, C], got {p.shape}; "
                          "name the recognition output with output=NAME")
    idx = p.argmax(axis=2)
    top = p.max(axis=2)
    keep = idx != blank
    keep[:, 1:] &= idx[:, 1:] != idx[:, :-1]
    return [(tuple(int(i) for i in idx[n][keep[n]]),
             float(np.mean(top[n][keep[n]])) if keep[n].any() else 0.0) for n in range(len(p))]


def ctc_greedy_decode(probs: np.ndarray, charset: Sequence[str],
                      blank: int = 0) -> list[tuple[str, float]]:
    """Greedy CTC decoding to text (PaddleOCR ``CTCLabelDecode``).

    Args:
        probs: ``[N, T, C]`` scores; ``[T, C]`` is one sample.
        charset: Class index -> text, ``len(charset) == C`` (see :func:`ctc_charset_from_model`).
        blank: Index of the blank class.

    Returns:
        Per sample ``(text, confidence)``, see :func:`ctc_best_path`.

    Raises:
        MetricError: Shape problems, or ``charset`` does not have ``C`` entries.
    """
    classes = np.shape(probs)[-1] if np.ndim(probs) else 0
    if len(charset) != classes:
        raise MetricError(f"the character list has {len(charset)} entries but the output has "
                          f"{classes} classes; use the dictionary of this model")
    return [("".join(charset[i] for i in seq), conf) for seq, conf in ctc_best_path(probs, blank)]


def ctc_margin(probs: np.ndarray, blank: int = 0) -> np.ndarray:
    """How close each sample's decoding is to flipping: the smallest top-1 minus top-2 score.

    Formula: per sample, ``min_t (s_t[(1)] - s_t[(2)])`` over the time steps ``t`` whose argmax is
    not the blank (the steps that emit or repeat a character), in the output's units
    (probability for PP-OCR). Small margins mark near-ties where tiny numeric changes legitimately
    change the text.

    Args:
        probs: ``[N, T, C]`` scores (``C >= 2``); ``[T, C]`` is one sample.
        blank: Index of the blank class.

    Returns:
        ``[N]`` float64; ``inf`` for a sample where every step decides the blank.

    Raises:
        MetricError: Shape problems.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3 or p.shape[-1] < 2:
        raise MetricError(f"CTC margin needs scores of shape [N, T, C>=2], got {p.shape}")
    top2 = -np.partition(-p, 1, axis=2)[..., :2]
    margin = top2[..., 0] - top2[..., 1]
    decides = p.argmax(axis=2) != blank
    return np.where(decides, margin, np.inf).min(axis=1)


def edit_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Levenshtein distance (unit-cost insertions, deletions, substitutions; Wagner-Fischer DP).

    Args:
        a: First sequence (a string, or class indices).
        b: Second sequence.

    Returns:
        The minimum number of edits turning ``a`` into ``b``.
    """
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def character_error_rate(references: Sequence[Sequence[Hashable]],
                         candidates: Sequence[Sequence[Hashable]]) -> float:
    """Corpus character error rate: ``sum_i edit(ref_i, cand_i) / sum_i len(ref_i)``.

    The usual CER definition (e.g. jiwer's ``cer``); can exceed 1 when the candidate inserts a lot.
    When every reference is empty: 0.0 if every candidate is empty too, else 1.0.

    Args:
        references: Reference strings (or class-index sequences).
        candidates: Candidate strings, same count.

    Returns:
        CER >= 0.
    """
    edits = sum(edit_distance(r, c) for r, c in zip(references, candidates, strict=True))
    chars = sum(len(r) for r in references)
    if chars == 0:
        return 0.0 if edits == 0 else 1.0
    return edits / chars


@dataclass(frozen=True)
class OcrSample:
    """One sample's decodings and how close the reference was to a tie.

    Attributes:
        index: Sample index in the batch.
        reference_text: Reference decoding (text, or class indices joined by spaces without a
            character list).
        candidate_text: Candidate decoding, same form.
        reference_confidence: Reference decoding confidence (see :func:`ctc_best_path`).
        candidate_confidence: Candidate decoding confidence.
        equal: Whether the decodings match (after case folding if asked).
        edit_distance: Levenshtein distance between the decodings.
        reference_margin: :func:`ctc_margin` of the reference (``None`` for ``inf``).
    """

    index: int
    reference_text: str
    candidate_text: str
    reference_confidence: float
    candidate_confidence: float
    equal: bool
    edit_distance: int
    reference_margin: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OcrSample:
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def _decodings(probs: np.ndarray, charset: Sequence[str] | None,
               ignore_case: bool) -> list[tuple[Sequence[Hashable], str, float]]:
    if charset is None:
        if ignore_case:
            raise MetricError("ignore_case=true needs the character list: pass "
                              "charset=path/to/rec.onnx or charset=keys.txt")
        return [(seq, " ".join(map(str, seq)), conf) for seq, conf in ctc_best_path(probs)]
    out: list[tuple[Sequence[Hashable], str, float]] = []
    for text, conf in ctc_greedy_decode(probs, charset):
        out.append((text.casefold() if ignore_case else text, text, conf))
    return out


def ctc_details(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                output: str | None = None, charset: str | Sequence[str] | None = None,
                ignore_case: bool = False) -> list[OcrSample]:
    """Decode reference and candidate and compare them sample by sample.

    Args:
        reference: Reference outputs (name -> array); the recognition output is ``[N, T, C]``.
        candidate: Candidate outputs.
        output: The recognition output (default: first output).
        charset: Class list, or a path to the rec ``.onnx`` / a dictionary file; ``None``
            compares class-index sequences.
        ignore_case: Compare ``str.casefold`` of the texts (needs ``charset``).

    Returns:
        One :class:`OcrSample` per sample.

    Raises:
        MetricError: Missing output, shape mismatch, unusable character list.
    """
    ref, cand = select_pair(reference, candidate, output, role="CTC scores")
    chars = load_charset(charset)
    ref_dec = _decodings(ref, chars, ignore_case)
    cand_dec = _decodings(cand, chars, ignore_case)
    margins = ctc_margin(ref)
    return [OcrSample(index=i, reference_text=r[1], candidate_text=c[1],
                      reference_confidence=r[2], candidate_confidence=c[2],
                      equal=tuple(r[0]) == tuple(c[0]), edit_distance=edit_distance(r[0], c[0]),
                      reference_margin=None if np.isinf(m) else float(m))
            for i, (r, c, m) in enumerate(zip(ref_dec, cand_dec, margins, strict=True))]


def ctc_string_agreement(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                         *, output: str | None = None, charset: str | Sequence[str] | None = None,
                         ignore_case: bool = False) -> float:
    """Fraction of samples whose candidate decoding equals the reference decoding.

    Args and errors as :func:`ctc_details`.

    Returns:
        String equality rate in [0, 1].
    """
    samples = ctc_details(reference, candidate, output=output, charset=charset,
                          ignore_case=ignore_case)
    return float(np.mean([s.equal for s in samples]))


def ctc_char_agreement(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                       *, output: str | None = None, charset: str | Sequence[str] | None = None,
                       ignore_case: bool = False) -> float:
    """Character agreement ``max(0, 1 - CER)``, CER of the candidate against the reference.

    CER as :func:`character_error_rate` (corpus level). Args and errors as :func:`ctc_details`.

    Returns:
        Agreement in [0, 1]; 1.0 when every decoding matches.
    """
    ref, cand = select_pair(reference, candidate, output, role="CTC scores")
    chars = load_charset(charset)
    ref_seqs = [d[0] for d in _decodings(ref, chars, ignore_case)]
    cand_seqs = [d[0] for d in _decodings(cand, chars, ignore_case)]
    return max(0.0, 1.0 - character_error_rate(ref_seqs, cand_seqs))
