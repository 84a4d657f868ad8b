import numpy as np
import pytest
from onnx import TensorProto, helper
from tiny_models import make_model, tensor

from precision_doctor.diagnosis.decisions.reading import detect_decision, read_decisions

F = TensorProto.FLOAT


def head(op, out_shape, attrs=None, metadata=None, in_shape=None):
    """x -> MatMul -> op -> y (op None: MatMul output is the graph output)."""
    c = out_shape[-1]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h" if op else "y"], name="mm")]
    if op:
        nodes.append(helper.make_node(op, ["h"], ["y"], name="head", **(attrs or {})))
    return make_model(nodes, [helper.make_tensor_value_info("x", F, in_shape or out_shape)],
                      [helper.make_tensor_value_info("y", F, out_shape)],
                      [tensor("w", np.eye(c))], metadata=metadata)


def softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def test_detection_from_producers_and_values():
    rng = np.random.default_rng(0)
    probs = [softmax(rng.normal(size=(2, 5)))]
    assert detect_decision(head("Softmax", [2, 5], {"axis": -1}), "y", probs) == (
        "class-probabilities", 1)
    assert detect_decision(head(None, [2, 5]), "y", [rng.normal(size=(2, 5))]) == (
        "class-logits", 1)
    sig = [np.float32(0.5) * np.ones((1, 1, 4, 4), np.float32)]
    assert detect_decision(head("Sigmoid", [1, 1, 4, 4]), "y", sig) == ("sigmoid-map", 0)
    # box regressions [N, anchors, 4] are not decisions
    assert detect_decision(head(None, [1, 7, 4]), "y", [rng.normal(size=(1, 7, 4))]) is None
    # a per-pixel class map [N, C, H, W] found from its values (sums to 1 over axis 1)
    seg = [softmax(rng.normal(size=(1, 3, 4, 4)), axis=1)]
    assert detect_decision(head("Relu", [1, 3, 4, 4]), "y", seg) == ("class-probabilities", 1)


def ctc_model(chars, steps=6):
    return head("Softmax", [1, steps, len(chars) + 2], {"axis": 2},
                metadata={"character": "\n".join(chars)})


def test_ctc_flips_report_margin_share_and_whether_the_text_changed():
    steps = 40  # 3 flips of 80 time steps: under 5%, so the flips are listed
    model = ctc_model(["a", "b"], steps)  # classes: blank, a, b, space
    assert detect_decision(model, "y", [softmax(np.zeros((1, steps, 4)))]) == ("ctc", 2)

    def onehot(seq, hot=8.0):
        seq = seq + [0] * (steps - len(seq))
        z = np.zeros((1, len(seq), 4))
        z[0, np.arange(len(seq)), seq] = hot
        return softmax(z)

    ref = [onehot([1, 0, 2, 0, 0, 0]), onehot([1, 1, 0, 0, 0, 0])]
    # sample 0: "ab" -> "a" + "b" shifted one step (text unchanged); sample 1: "a" -> "b"
    cand = [onehot([1, 0, 0, 2, 0, 0]), onehot([1, 2, 0, 0, 0, 0])]
    summaries, flips = read_decisions(model, {"y": ref}, {"y": cand}, ["s0.png", "s1.png"],
                                      {"no-graph-opt": {"y": ref}})
    (d,) = summaries
    assert (d.kind, d.flips, d.positions) == ("ctc", 3, 2 * steps)
    assert d.task_agreement == 0.5 and d.suggested_metric.startswith("ctc-string:charset=")
    assert d.flip_error_share == pytest.approx(1.0)
    assert d.rel_l2_without_flips == pytest.approx(0.0)
    # the shift leaves the text as it was; "a" -> "b" at a margin of ~1 is damage
    assert (d.task_neutral, d.near_ties, d.damage) == (2, 0, 1) and not d.destroyed
    by = {(f.sample, f.position): f for f in flips}
    assert by[("s0.png", (0, 2))].task_changed is False
    assert by[("s0.png", (0, 2))].reading == "task-neutral"
    assert by[("s1.png", (0, 1))].task_changed is True
    assert by[("s1.png", (0, 1))].reading == "damage"
    shift = by[("s0.png", (0, 3))]
    assert shift.fp32_top[0] == 0 and shift.candidate_top == 2
    assert shift.fp32_margin > 0.99 and shift.fp32_noise == 0.0
    assert sum(f.error_share for f in flips) == pytest.approx(1.0)


def test_sigmoid_map_flips_at_threshold_and_classifier_task_change():
    ref = np.full((1, 1, 8, 8), 0.9, np.float32)
    ref[0, 0, 0, 0], ref[0, 0, 1, 1] = 0.49, 0.7
    cand = ref.copy()
    cand[0, 0, 0, 0], cand[0, 0, 1, 1] = 0.51, 0.69
    summaries, flips = read_decisions(head("Sigmoid", [1, 1, 8, 8]), {"y": [ref]},
                                      {"y": [cand]}, ["img"])
    assert summaries[0].flips == 1 and flips[0].position == (0, 0, 0, 0)
    assert flips[0].fp32_margin == pytest.approx(0.01, abs=1e-6)
    assert flips[0].task_changed is None and flips[0].fp32_noise is None
    # the margin (0.01) is 8x the typical error (0.01 at one of the 63 other positions): damage
    assert flips[0].reading == "damage" and summaries[0].typical_error == pytest.approx(
        0.01 / np.sqrt(63), rel=1e-3)
    logits = [np.array([[1.0, 1.001, 0.0]] + [[5.0, 0.0, 0.0]] * 39, np.float32)]
    moved = [logits[0].copy()]
    moved[0][0, 0] = 1.002
    moved[0][1:, 0] += 0.002  # the other positions move as much as the near-tie's margin
    summaries, flips = read_decisions(head(None, [40, 3]), {"y": logits}, {"y": moved}, ["b"])
    assert summaries[0].task_metric == "top1" and summaries[0].task_agreement == 0.975
    assert flips[0].task_changed is True and flips[0].fp32_top == (1, 0)
    assert flips[0].reading == "near-tie" and summaries[0].near_ties == 1


def test_a_destroyed_classifier_counts_damage_and_lists_no_flips():
    """16 of 16 decisions flip at FP32 margins of ~1 (Magika in FP16): damage, not near-ties."""
    probs = np.full((16, 4), 0.0, np.float32)
    probs[:, 0] = 1.0
    flipped = np.roll(probs, 1, axis=1)
    model = head("Softmax", [16, 4], {"axis": -1})
    summaries, flips = read_decisions(model, {"y": [probs]}, {"y": [flipped]}, ["s"])
    (d,) = summaries
    assert (d.flips, d.damage, d.near_ties, d.destroyed) == (16, 16, 0, True)
    assert d.damage_margin == pytest.approx(1.0) and d.typical_error is None
    assert flips == [] and not d.benign
    assert d.rel_l2_without_flips == 0.0  # nothing left: relative to the whole output's norm


def test_hidden_states_are_not_decisions_but_lm_heads_are():
    rng = np.random.default_rng(1)
    hidden = [rng.normal(size=(1, 5, 16)).astype(np.float32)]
    # a LayerNorm's final "+ beta" (Add of Mul output and a constant): hidden states
    nodes = [helper.make_node("Mul", ["x", "g"], ["n"], name="scale"),
             helper.make_node("Add", ["n", "beta"], ["y"], name="shift")]
    ln = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 5, 16])],
                    [helper.make_tensor_value_info("y", F, [1, 5, 16])],
                    [tensor("g", np.ones(16)), tensor("beta", np.zeros(16))])
    assert detect_decision(ln, "y", hidden) is None
    # MatMul + bias over a 16-token vocabulary: per-token logits
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="lm"),
             helper.make_node("Add", ["h", "bias"], ["y"], name="lm_bias")]
    lm = make_model(nodes, [helper.make_tensor_value_info("x", F, [1, 5, 16])],
                    [helper.make_tensor_value_info("y", F, [1, 5, 16])],
                    [tensor("w", np.eye(16)), tensor("bias", np.zeros(16))])
    assert detect_decision(lm, "y", hidden) == ("class-logits", 2)


def test_nan_scores_are_flips_carrying_all_the_error():
    """Magika v1 in FP16 outputs NaN for every file: its flips carry the (infinite) error."""
    probs = np.full((16, 4), 0.0, np.float32)
    probs[:, 0] = 1.0
    nan = np.full_like(probs, np.nan)
    (d,), _ = read_decisions(head("Softmax", [16, 4], {"axis": -1}), {"y": [probs]},
                             {"y": [nan]}, ["s"])
    assert d.flips == 16 and d.flip_error_share == 1.0 and d.destroyed
