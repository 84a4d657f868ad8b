"""Random operators, made to draw the same numbers in every run that is compared.

A VITS voice run with its noise on (``RandomNormalLike`` without a ``seed``) gives another
waveform, and even another length, at every run of the same FP32 model: no comparison is
possible. ONNX's random operators take an optional float attribute ``seed`` (ONNX operator
specs: RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike, Multinomial,
Bernoulli); with it ONNX Runtime starts the operator's generator from that seed when the session
is created, so two sessions that run the same samples in the same order draw the same numbers
(``seed_random_ops``: ``diagnose``'s reference and candidate runs). A search runs samples in
other orders and several times in one session, which draws other numbers: there
``determinize`` replaces each normal or uniform random operator by draws read from a fixed,
seeded table (``TABLE`` numbers, tiled for larger tensors, reshaped to the operator's shape),
the same in every run, and ``restore_random_ops`` puts the original operators back in the model
that is written. What nondeterminism remains shows in the FP32 noise floor.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})
FIRST_SEED = 1234.0  # seeds FIRST_SEED, FIRST_SEED + 1, ... in graph order


def unseeded_random_ops(model: onnx.ModelProto) -> list[str]:
    """Names of the top-level random operators without a ``seed`` attribute, graph order."""
    return [n.name or n.output[0] for n in model.graph.node
            if n.op_type in RANDOM_OPS and n.domain in ("", "ai.onnx")
            and not any(a.name == "seed" for a in n.attribute)]


def seed_random_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """A copy of ``model`` whose unseeded random operators have a ``seed`` (module docstring).

    Args:
        model: The model (not modified).

    Returns:
        ``(model, seeded node names)``: ``model`` itself when nothing needed a seed.
    """
    names = unseeded_random_ops(model)
    if not names:
        return model, ()
    seeded = onnx.ModelProto()
    seeded.CopyFrom(model)
    wanted, k = set(names), 0
    for n in seeded.graph.node:
        if (n.name or n.output[0]) in wanted and n.op_type in RANDOM_OPS \
                and not any(a.name == "seed" for a in n.attribute):
            n.attribute.append(helper.make_attribute("seed", FIRST_SEED + k))
            k += 1
    return seeded, tuple(names)


def unseed_random_ops(model: onnx.ModelProto, names: tuple[str, ...]) -> onnx.ModelProto:
    """``model`` with the ``seed`` attribute of the nodes ``names`` removed again: a model
    written for deployment draws fresh numbers as the user's model did (in place; returned)."""
    wanted = set(names)
    for n in model.graph.node:
        if (n.name or n.output[0]) in wanted and n.op_type in RANDOM_OPS:
            kept = [a for a in n.attribute if a.name != "seed"]
            del n.attribute[:]
            n.attribute.extend(kept)
    return model


TABLE = 1 << 20  # numbers in a determinized operator's table (4 MiB of float32)
_DRAWN = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike")
_PREFIX = "/noise-table/"  # the nodes determinize adds are named <original node><_PREFIX>...


def determinize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.NodeProto]]:
    """A copy of ``model`` whose normal/uniform random operators draw from fixed tables
    (module docstring); Multinomial and Bernoulli get a ``seed`` instead.

    Args:
        model: The model (not modified).

    Returns:
        ``(model, originals)``: ``originals`` maps each replaced operator's name to its node,
        for ``restore_random_ops``; ``model`` itself when it has no random operator.
    """
    if not any(n.op_type in RANDOM_OPS for n in model.graph.node):
        return model, {}
    users = {n.name or n.output[0]: n for n in model.graph.node}  # as the user wrote them
    model, _ = seed_random_ops(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    originals: dict[str, onnx.NodeProto] = {}
    nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(model.graph.node):
        if n.op_type not in _DRAWN or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        name = n.name or n.output[0]
        originals[name] = users[name]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        normal = n.op_type.startswith("RandomNormal")
        rng = np.random.default_rng(int(attrs.get("seed", FIRST_SEED)) + k)
        table = (rng.standard_normal(TABLE) if normal else rng.random(TABLE)).astype(np.float32)
        low, high = attrs.get("low", 0.0), attrs.get("high", 1.0)
        scale = attrs.get("scale", 1.0) if normal else high - low
        shift = attrs.get("mean", 0.0) if normal else low
        nodes.extend(_table_nodes(out, name, n, table, float(scale), float(shift), attrs))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, originals


def _table_nodes(model: onnx.ModelProto, name: str, node: onnx.NodeProto, table: np.ndarray,
                 scale: float, shift: float, attrs: dict) -> list[onnx.NodeProto]:
    """Nodes computing ``shift + scale * table[:numel]`` in the operator's shape and type."""
    p = f"{name}{_PREFIX}"

    def const(tag: str, value) -> str:
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), p + tag))
        return p + tag

    if node.input:  # *Like: the shape of the input
        shape = [helper.make_node("Shape", [node.input[0]], [p + "shape"], name=p + "Shape")]
    else:
        shape = []
        const("shape", np.asarray(attrs.get("shape", ()), np.int64))
    n = TABLE
    out = [*shape,
           helper.make_node("ReduceProd", [p + "shape"], [p + "numel"], name=p + "ReduceProd",
                            keepdims=1),
           helper.make_node("Add", [p + "numel", const("n_minus_1", np.array([n - 1]))],
                            [p + "up"], name=p + "Add"),
           helper.make_node("Div", [p + "up", const("n", np.array([n]))], [p + "reps"],
                            name=p + "Div"),
           helper.make_node("Tile", [const("table", table), p + "reps"], [p + "tiled"],
                            name=p + "Tile"),
           helper.make_node("Slice", [p + "tiled", const("zero", np.array([0])), p + "numel"],
                            [p + "flat"], name=p + "Slice"),
           helper.make_node("Reshape", [p + "flat", p + "shape"], [p + "draws"],
                            name=p + "Reshape"),
           helper.make_node("Mul", [p + "draws", const("scale", np.float32(scale))],
                            [p + "scaled"], name=p + "Mul"),
           helper.make_node("Add", [p + "scaled", const("shift", np.float32(shift))],
                            [p + "values"], name=p + "Shift")]
    dtype = attrs.get("dtype")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if dtype is None and node.input and opset >= 15:  # the input's type (CastLike: opset 15)
        out.append(helper.make_node("CastLike", [p + "values", node.input[0]],
                                    list(node.output), name=name))
    else:
        out.append(helper.make_node("Cast", [p + "values"], list(node.output), name=name,
                                    to=int(dtype if dtype is not None else 1)))
    return out


def restore_random_ops(model: onnx.ModelProto, originals: dict[str, onnx.NodeProto]
                       ) -> onnx.ModelProto:
    """``model`` (written from a ``determinize``d model) with the original random operators
    back in place of their tables (in place; returned). Each takes the element type its
    output has in ``model`` (the plan may have made it FP16)."""
    if not originals:
        return model
    from precision_doctor.graph.shapes import infer_types

    types = infer_types(model)
    kept: list[onnx.NodeProto] = []
    for n in model.graph.node:
        name = n.name or ""
        owner = name.split(_PREFIX)[0] if _PREFIX in name else name
        if owner not in originals:
            kept.append(n)
            continue
        if _PREFIX in name:
            continue
        node = onnx.NodeProto()
        node.CopyFrom(originals[owner])
        del node.output[:]
        node.output.extend(n.output)
        t = types.get(n.output[0])
        elem = t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else 0
        attrs = [a for a in node.attribute if not (elem and a.name == "dtype")]
        del node.attribute[:]
        node.attribute.extend(attrs)
        if elem:
            node.attribute.append(helper.make_attribute("dtype", elem))
        kept.append(node)
    used = {i for n in kept for i in n.input}
    inits = [t for t in model.graph.initializer if _PREFIX not in t.name or t.name in used]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    return model


def determinized_note(originals: dict[str, onnx.NodeProto]) -> str:
    """The fix report's sentence about determinized random operators ("" when none)."""
    if not originals:
        return ""
    names = list(originals)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{len(names)} random operator(s) ({shown}) drew the same numbers in every run "
            "compared (a fixed table of seeded draws); the written model has the original "
            "operators")


def seeded_note(names: tuple[str, ...]) -> str:
    """The report's sentence about seeded random operators ("" when none)."""
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{len(names)} random operator(s) without a seed ({shown}) were given the same "
            "ONNX `seed` in the reference and the candidate, so both draw the same numbers "
            "when they run the samples in the same order")


__all__ = ["RANDOM_OPS", "TABLE", "determinize", "determinized_note", "restore_random_ops",
           "seed_random_ops", "seeded_note", "unseed_random_ops", "unseeded_random_ops"]
