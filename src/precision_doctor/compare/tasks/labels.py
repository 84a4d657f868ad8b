"""Ground truth from the user (``--labels``): COCO JSON for detection, CSV for classification.

* COCO JSON (the format of ``instances_val2017.json``): ``images`` (``id``, ``file_name``,
  ``width``, ``height``), ``annotations`` (``image_id``, ``category_id``, ``bbox`` as
  ``[x, y, width, height]`` in source-image pixels, ``iscrowd``, ``area``) and ``categories``
  (``id``, ``name``). A sample takes the image whose ``file_name`` (its base name) is the
  sample's name. Category ids are the model's class indices unless ``class_names`` maps them
  by name (a model that stores its class names, as ultralytics exports do in ``names``).
* CSV: one row per sample, ``file,class`` (a header row is skipped when its class column is
  not a number); ``class`` is the class index of the model's output.

A sample without labels gets none (``ground_truth`` is not passed); labels that match no
sample are an error naming the first few sample names, so a wrong file is caught at once.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from precision_doctor.compare.tasks.io import select_output
from precision_doctor.errors import InputError, MetricError

DETECTION = "detection"
CLASSIFICATION = "classification"


@dataclass(frozen=True)
class ImageLabels:
    """One sample's ground truth.

    Attributes:
        kind: ``detection`` or ``classification``.
        name: The file name it was matched by.
        image_id: COCO image id (detection).
        width / height: Source image size in pixels from the COCO ``images`` entry (0: unknown).
        boxes: ``(x, y, w, h)`` per object, source-image pixels (COCO ``bbox``).
        categories: Class index per object (after ``class_names`` mapping).
        crowd: COCO ``iscrowd`` per object.
        class_id: The class (classification).
    """

    kind: str
    name: str
    image_id: int = 0
    width: int = 0
    height: int = 0
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    categories: tuple[int, ...] = ()
    crowd: tuple[int, ...] = ()
    class_id: int | None = None


@dataclass(frozen=True)
class Labels:
    """Every sample's ground truth from one file.

    Attributes:
        path: The file.
        kind: ``detection`` (COCO JSON) or ``classification`` (CSV).
        images: File base name -> :class:`ImageLabels`.
        categories: Class index -> name (COCO ``categories``; empty for CSV).
    """

    path: str
    kind: str
    images: Mapping[str, ImageLabels]
    categories: Mapping[int, str]

    def for_samples(self, names: Sequence[str]) -> list[ImageLabels | None]:
        """The labels of each sample (by the base name of its file), None where there are none.

        Raises:
            InputError: No sample has labels (the message shows names on both sides).
        """
        found = [self.images.get(os.path.basename(n)) for n in names]
        if names and not any(found):
            raise InputError(
                f"--labels {self.path}: no sample has labels; samples are named "
                f"{', '.join(map(repr, list(names)[:3]))}, the labels name "
                f"{', '.join(map(repr, list(self.images)[:3]))}. Label the files by their "
                "names (COCO images[].file_name, or the CSV's first column).", file=self.path)
        return found

    def with_class_names(self, class_names: Mapping[int, str]) -> Labels:
        """Category ids mapped to the model's class indices by name (case and ``_``/space
        insensitive), when every labelled category's name is one of the model's classes;
        unchanged otherwise."""
        def key(text: str) -> str:
            return text.strip().lower().replace("_", " ")

        by_name = {key(v): k for k, v in class_names.items()}
        if self.kind != DETECTION or not self.categories or not by_name:
            return self
        if not all(key(n) in by_name for n in self.categories.values()):
            return self
        table = {cid: by_name[key(n)] for cid, n in self.categories.items()}
        images = {k: replace(v, categories=tuple(table.get(c, c) for c in v.categories))
                  for k, v in self.images.items()}
        return replace(self, images=images,
                       categories={table[c]: n for c, n in self.categories.items()})


def load_labels(path: str | os.PathLike) -> Labels:
    """Read a COCO JSON (``.json``) or class CSV (anything else) label file.

    Raises:
        InputError: Missing or malformed file (the message names the file and what is wrong).
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--labels {p}: no such file", file=str(p))
    if p.suffix.lower() == ".json":
        return _load_coco(p)
    return _load_csv(p)


def _load_coco(p: Path) -> Labels:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        images = {int(im["id"]): im for im in data["images"]}
        cats = {int(c["id"]): str(c.get("name", c["id"])) for c in data.get("categories", [])}
        anns = data.get("annotations", [])
        per: dict[int, list[dict[str, Any]]] = {i: [] for i in images}
        for a in anns:
            per.setdefault(int(a["image_id"]), []).append(a)
        out = {}
        for iid, im in images.items():
            objs = per.get(iid, [])
            out[os.path.basename(str(im["file_name"]))] = ImageLabels(
                DETECTION, os.path.basename(str(im["file_name"])), iid,
                int(im.get("width", 0)), int(im.get("height", 0)),
                tuple(tuple(float(v) for v in a["bbox"]) for a in objs),  # type: ignore[misc]
                tuple(int(a["category_id"]) for a in objs),
                tuple(int(a.get("iscrowd", 0)) for a in objs))
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--labels {p}: not a COCO detection JSON ({type(exc).__name__}: "
                         f"{exc}); it needs images (id, file_name), annotations (image_id, "
                         "category_id, bbox [x, y, w, h]) and categories", file=str(p)) from None
    return Labels(str(p), DETECTION, out, cats)


def _load_csv(p: Path) -> Labels:
    out = {}
    with p.open(newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.reader(fh)):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 2:
                raise InputError(f"--labels {p}: line {i + 1} is not 'file,class'", file=str(p))
            try:
                cls = int(row[1].strip())
            except ValueError:
                if i == 0:
                    continue  # header
                raise InputError(f"--labels {p}: line {i + 1}: class {row[1]!r} is not a class "
                                 "index", file=str(p)) from None
            name = os.path.basename(row[0].strip())
            out[name] = ImageLabels(CLASSIFICATION, name, class_id=cls)
    if not out:
        raise InputError(f"--labels {p}: no 'file,class' rows", file=str(p))
    return Labels(str(p), CLASSIFICATION, out, {})


def predicted_class(outputs: Mapping[str, np.ndarray], output: str | None = None,
                    axis: int = -1) -> int:
    """The top-1 class of a one-sample classifier output (argmax over ``axis``).

    Raises:
        MetricError: The output holds more than one decision (batch or positions).
    """
    a = np.asarray(select_output(outputs, output), np.float64)
    scores = np.moveaxis(a, axis, -1).reshape(-1, a.shape[axis])
    if scores.shape[0] != 1:
        raise MetricError(f"classification labels give one class per sample; the output has "
                          f"{scores.shape[0]} decisions per sample (batch 1 per sample?)")
    row = np.nan_to_num(scores[0], nan=-np.inf)
    return int(np.argmax(row))


def accuracy_drop(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], *,
                  output: str | None = None, axis: int = -1,
                  ground_truth: ImageLabels | None = None) -> float:
    """Top-1 accuracy lost on one sample: 1 when the reference is right and the candidate is
    not, -1 the other way round, else 0 (lower is better; ``--threshold 0``: no sample that the
    FP32 model classifies correctly is lost).

    Args:
        reference / candidate: Outputs (name -> array) of one sample.
        output: The class-score output (default: the first).
        axis: Class axis.
        ground_truth: The sample's label (per-sample context from ``--labels``).

    Raises:
        MetricError: No labels for the sample, or not a one-decision output.
    """
    if ground_truth is None or ground_truth.class_id is None:
        raise MetricError("accuracy-drop needs a class label per sample: --labels FILE.csv "
                          "with 'file,class' rows (API: labels=...)")
    truth = ground_truth.class_id
    ref_ok = predicted_class(reference, output, axis) == truth
    cand_ok = predicted_class(candidate, output, axis) == truth
    return float(ref_ok) - float(cand_ok)


__all__ = ["CLASSIFICATION", "DETECTION", "ImageLabels", "Labels", "accuracy_drop",
           "load_labels", "predicted_class"]
