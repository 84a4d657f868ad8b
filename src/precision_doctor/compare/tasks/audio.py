"""Audio outputs of different lengths: the log-spectral distance after dynamic time warping.

A text-to-speech voice whose low-precision run rounds one duration otherwise speaks the same
phrase one frame longer: the waveforms cannot be compared sample by sample (and even at equal
lengths their relative L2 error says little about what is heard). What TTS evaluations compare
instead are spectra aligned in time: frames of the log power spectrum, matched by dynamic time
warping (DTW; Sakoe & Chiba, "Dynamic programming algorithm optimization for spoken word
recognition", IEEE TASSP 1978), scored by the log-spectral distance

    LSD(a, b) = sqrt(mean_k (10 log10 P_a[k] - 10 log10 P_b[k])^2)   (dB)

of each matched pair of frames (P: |STFT|^2 with a Hann window, plus 1e-10 against log 0),
averaged over the warping path. The path's total cost is divided by ``max(N, M)`` frames
(the path has at least that many steps), so identical signals score 0 (up to the float64
rounding of the Gram expansion in ``frame_distances``, ~1e-7 dB) and equal-length
signals aligned on the diagonal score their mean frame LSD.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from precision_doctor.errors import MetricError

FRAME = 1024  # STFT frame and hop in samples: 46 / 11.6 ms at 22.05 kHz, a TTS voice's rate
HOP = 256
POWER_FLOOR = 1e-10


def log_spectrogram(signal: np.ndarray, frame: int = FRAME, hop: int = HOP) -> np.ndarray:
    """Frames of the log power spectrum in dB.

    Args:
        signal: Audio samples, any shape whose size-1 axes squeeze to one axis.
        frame / hop: STFT frame length and hop (samples); a signal shorter than ``frame`` is
            one zero-padded frame.

    Returns:
        ``[frames, frame // 2 + 1]`` float64 dB.

    Raises:
        MetricError: The signal is not one-dimensional after squeezing, or has NaN/Inf.
    """
    x = np.asarray(signal, np.float64).squeeze()
    if x.ndim != 1:
        raise MetricError(f"an audio output must be one signal; got shape {np.shape(signal)}")
    if not np.isfinite(x).all():
        raise MetricError("the audio output has NaN/Inf values")
    if x.size < frame:
        x = np.pad(x, (0, frame - x.size))
    count = 1 + (x.size - frame) // hop
    index = np.arange(frame)[None, :] + hop * np.arange(count)[:, None]
    spectrum = np.fft.rfft(x[index] * np.hanning(frame), axis=1)
    return 10.0 * np.log10(np.abs(spectrum) ** 2 + POWER_FLOOR)


def frame_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """LSD in dB between every frame of ``a`` ``[N, K]`` and of ``b`` ``[M, K]``: ``[N, M]``."""
    sq = (np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :] - 2.0 * (a @ b.T))
    return np.sqrt(np.maximum(sq, 0.0) / a.shape[1])


def dtw_cost(cost: np.ndarray) -> float:
    """Total cost of the cheapest monotone path from (0, 0) to (N-1, M-1) with steps (1, 0),
    (0, 1) and (1, 1).

    Row by row: with ``a_j = C[i, j] + min(D[i-1, j-1], D[i-1, j])`` and ``S`` the running sum
    of ``C[i, :]``, ``D[i, j] = S_j + min_{k <= j}(a_k - S_k)`` (the horizontal steps), so each
    row is two cumulative operations instead of a loop over its columns.
    """
    n, m = cost.shape
    prev = np.cumsum(cost[0])
    for i in range(1, n):
        up = np.concatenate(([np.inf], prev[:-1]))
        a = cost[i] + np.minimum(up, prev)
        s = np.cumsum(cost[i])
        prev = s + np.minimum.accumulate(a - s)
    return float(prev[-1])


def lsd_dtw(reference_signal: np.ndarray, candidate_signal: np.ndarray, frame: int = FRAME,
            hop: int = HOP) -> float:
    """Log-spectral distance (dB) of two signals of any lengths after DTW (module docstring).

    Raises:
        MetricError: A signal is not one-dimensional or has NaN/Inf.
    """
    a = log_spectrogram(reference_signal, frame, hop)
    b = log_spectrogram(candidate_signal, frame, hop)
    return dtw_cost(frame_distances(a, b)) / max(len(a), len(b))


def lsd(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
        output: str | None = None, frame: int = FRAME, hop: int = HOP) -> float:
    """Log-spectral distance in dB after DTW between the reference's and the candidate's audio
    (lower is better; 0 when identical); the lengths may differ.

    Args:
        reference / candidate: Outputs of one sample (name -> array).
        output: The audio output (default: the first).
        frame / hop: STFT frame and hop in samples.

    Raises:
        MetricError: The output is missing, not one signal, or has NaN/Inf in the reference;
            a candidate with NaN/Inf scores ``inf``.
    """
    name = output or next(iter(reference))
    if name not in reference or name not in candidate:
        raise MetricError(f"lsd: no output {name!r}; outputs: {', '.join(reference)}")
    if not np.isfinite(np.asarray(candidate[name], np.float64)).all():
        return float("inf")
    return lsd_dtw(reference[name], candidate[name], frame, hop)


def is_signal(shape: tuple[int, ...], frame: int = FRAME) -> bool:
    """Whether an output of ``shape`` reads as one audio signal: one axis of at least
    ``frame`` samples, every other axis of size 1."""
    big = [s for s in shape if s != 1]
    return len(big) == 1 and big[0] >= frame


__all__ = ["FRAME", "HOP", "dtw_cost", "frame_distances", "is_signal", "log_spectrogram",
           "lsd", "lsd_dtw"]
