"""Integer decision sites: where a model turns a floating-point value into an integer or a
boolean that later sets a shape or picks elements.

A text-to-speech voice rounds a predicted duration per phoneme (``Ceil`` or ``Round``, then
``Cast`` to int64) and builds the audio's frames from the durations (``CumSum``, ``Range``,
``Expand``); a detector counts boxes (``NonZero``, ``TopK``, ``NonMaxSuppression``). FP16 moves
the float value; once it crosses a rounding boundary the integer changes, and so may the
output's length. A site is one of:

* ``Ceil``, ``Floor`` and ``Round``: their float output holds integers, which later ops add
  up exactly (Piper sums and accumulates its ceil'd durations in float32 before one
  ``Cast``); the *source* is the op's input and the rounding boundary is the op's (integers
  for Ceil/Floor, half-integers for Round);
* ``Cast``/``CastLike`` from a float to an integer or bool type that no rounding op feeds
  (directly, or through ops that keep integers integer and each element in place: ``Clip``,
  ``Max``/``Min``, ``Relu``, reshapes; Kokoro writes Round -> Clip -> Cast, whose site is the
  Round): a truncation toward zero, boundaries at the integers;
* ``ArgMax``/``ArgMin``, the indices of ``TopK`` and ``NonMaxSuppression`` on float inputs;
* ``NonZero`` of a float tensor, and a float comparison (``Greater``, ``Less``, ...) whose
  boolean reaches ``NonZero`` or ``Compress``.

``sets_shape`` says whether the integer reaches (through integer arithmetic; from a rounding
op, through any op within ``REACH`` steps) an input that sets a shape (``Range``,
``Expand``'s shape, ``Tile``'s repeats, ``ConstantOfShape``, ``Reshape``'s shape, ``Slice``'s
bounds, ``Resize``'s sizes, ``Pad``'s pads, ``OneHot``'s depth) or is a count (``NonZero``,
``NonMaxSuppression``).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import onnx

from precision_doctor.graph.shapes import infer_types
from precision_doctor.precision.plan import FLOAT_ELEM_TYPES

ROUNDING_OPS = ("Ceil", "Floor", "Round")
# ops between a rounding op and its Cast that keep integer values integer and elements in
# order (the first input is the data)
KEEP_INTEGERS = ("Clip", "Max", "Min", "Relu", "Identity", "Reshape", "Squeeze", "Unsqueeze",
                 "Flatten")
INDEX_OPS = ("ArgMax", "ArgMin")
COMPARISONS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal")
COUNT_OPS = ("NonZero", "Compress", "NonMaxSuppression")
# op -> input positions that set an output shape (ONNX operator specs, opset 13-21)
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Range": (0, 1, 2), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,),
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Resize": (3,), "Pad": (1,), "OneHot": (1,),
    "TopK": (1,), "Upsample": (1,)}
REACH = 8  # ops a rounding op's integers may pass through before they set a shape
_INT_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                        onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                        onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
                        onnx.TensorProto.BOOL})


@dataclass(frozen=True)
class DecisionSite:
    """One place where a float becomes an integer decision.

    Attributes:
        node: Name of the node that writes the integer (or boolean).
        op: Its op type (``Cast``, ``ArgMax``, ``TopK`` ...).
        tensor: The integer/boolean tensor it writes.
        source: The float tensor the decision reads (the rounding op's input for
            ``Ceil``/``Floor``/``Round`` -> ``Cast``).
        rounding: ``Ceil``, ``Floor``, ``Round``, ``Cast`` (truncation) or ``""`` where the
            decision has no scalar rounding boundary (ArgMax, TopK, comparisons, NonZero).
        index: Graph position of the node.
        sets_shape: Whether the integer sets a shape or a count (module docstring).
    """

    node: str
    op: str
    tensor: str
    source: str
    rounding: str
    index: int
    sets_shape: bool


def decision_sites(model: onnx.ModelProto) -> list[DecisionSite]:
    """Every integer decision site of ``model``'s top-level graph, graph order.

    Args:
        model: The model (nodes named). Element types from ONNX shape inference; a tensor
            whose type stays unknown counts as neither float nor integer.

    Returns:
        ``DecisionSite`` per site (module docstring), graph order.
    """
    elem = {k: t.tensor_type.elem_type for k, t in infer_types(model).items()
            if t.HasField("tensor_type")}
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output if o}
    readers: defaultdict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in nodes:
        for i in n.input:
            if i:
                readers[i].append(n)

    def is_float(name: str) -> bool:
        return elem.get(name) in FLOAT_ELEM_TYPES

    sites = []
    for index, n in enumerate(nodes):
        found = _site(n, is_float, lambda t: elem.get(t) in _INT_TYPES, producer, readers)
        if found is not None:
            tensor, source, rounding = found
            sites.append(DecisionSite(n.name, n.op_type, tensor, source, rounding, index,
                                      _sets_shape(tensor, readers, elem,
                                                  n.op_type in ROUNDING_OPS)))
    return sites


def _site(n: onnx.NodeProto, is_float, is_int, producer, readers
          ) -> tuple[str, str, str] | None:
    """(integer tensor, float source, rounding) when ``n`` is a decision site."""
    op = n.op_type
    if not n.input or not n.output:
        return None
    first = n.input[0]
    if op in ROUNDING_OPS and is_float(first):
        return n.output[0], first, op
    if op in ("Cast", "CastLike") and is_float(first) and is_int(n.output[0]):
        before = producer.get(first)
        while before is not None and before.op_type in KEEP_INTEGERS and before.input:
            before = producer.get(before.input[0])
        if before is not None and before.op_type in ROUNDING_OPS:
            return None  # the rounding op is the site
        return n.output[0], first, "Cast"
    if op in INDEX_OPS and is_float(first):
        return n.output[0], first, ""
    if op == "TopK" and len(n.output) > 1 and is_float(first):
        return n.output[1], first, ""
    if op == "NonMaxSuppression" and is_float(first):
        return n.output[0], first, ""
    if op == "NonZero" and is_float(first):
        return n.output[0], first, ""
    if op in COMPARISONS and is_float(first) and _reaches_count(n.output[0], readers):
        return n.output[0], first, ""
    return None


def _reaches_count(tensor: str, readers) -> bool:
    """Whether a boolean reaches NonZero/Compress through logic ops only."""
    todo, seen = deque([tensor]), {tensor}
    while todo:
        for r in readers.get(todo.popleft(), ()):
            if r.op_type in COUNT_OPS:
                return True
            if r.op_type in ("Not", "And", "Or", "Xor", "Cast", "Identity"):
                for o in r.output:
                    if o and o not in seen:
                        seen.add(o)
                        todo.append(o)
    return False


def _sets_shape(tensor: str, readers, elem, any_type: bool = False) -> bool:
    """Whether an integer tensor reaches a shape-setting input through integer values (with
    ``any_type``: through any values, at most ``REACH`` ops away)."""
    todo, seen = deque([(tensor, 0)]), {tensor}
    while todo:
        name, depth = todo.popleft()
        for r in readers.get(name, ()):
            if r.op_type in COUNT_OPS:
                return True
            positions = SHAPE_INPUTS.get(r.op_type, ())
            if any(i < len(r.input) and r.input[i] == name for i in positions):
                return True
            for o in r.output:
                follow = depth < REACH if any_type else elem.get(o) in _INT_TYPES
                if o and o not in seen and follow:
                    seen.add(o)
                    todo.append((o, depth + 1))
    return False


def input_cone(model: onnx.ModelProto, tensors: list[str]) -> list[str]:
    """Names of the nodes that ``tensors`` depend on (their producers and everything before
    them), graph order."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    todo, seen_t, cone = deque(tensors), set(tensors), set()
    while todo:
        node = producer.get(todo.popleft())
        if node is None or node.name in cone:
            continue
        cone.add(node.name)
        for i in node.input:
            if i and i not in seen_t:
                seen_t.add(i)
                todo.append(i)
    return [n.name for n in model.graph.node if n.name in cone]


__all__ = ["DecisionSite", "ROUNDING_OPS", "decision_sites", "input_cone"]
