import numpy as np
from onnx import TensorProto, helper
from tiny_models import conv_bn, make_model, tensor, transformer_block

from precision_doctor.diagnosis.causes.hazards import find_decomposed_layernorms, scan_hazards
from precision_doctor.formats import Precision


def test_batchnorm_variance_above_fp16_max_but_fine_in_bf16():
    fp16 = scan_hazards(conv_bn(), Precision.FP16)
    assert [h.tensor for h in fp16 if h.kind == "parameter-out-of-range"] == ["v"]
    assert fp16[0].severity == "high"
    bf16 = scan_hazards(conv_bn(), Precision.BF16)
    assert not [h for h in bf16 if h.kind == "parameter-out-of-range"]


def test_layernorm_epsilon_1e_12_flushes_in_fp16():
    hazards = scan_hazards(transformer_block(eps=1e-12), Precision.FP16)
    eps = [h for h in hazards if h.kind == "parameter-underflow" and h.tensor == "eps"]
    assert eps and eps[0].severity == "high"
    ln = [h for h in hazards if h.kind == "decomposed-layernorm"]
    assert ln and "flushes to 0" in ln[0].detail


def test_decomposed_layernorm_pattern():
    matches = find_decomposed_layernorms(transformer_block())
    assert len(matches) == 1
    m = matches[0]
    assert m["square"] == "ln/pow" and m["square_output"] == "d2"
    assert m["nodes"][0] == "ln/mean" and m["nodes"][-1] == "ln/div"
    assert m["epsilon"] == np.float32(1e-5)


def test_clip_bound_and_small_divisor():
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"], name="clip"),
             helper.make_node("Div", ["c", "tiny"], ["y"], name="div")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                       [tensor("lo", 0.0), tensor("hi", 1e5), tensor("tiny", 1e-4)])
    kinds = {h.kind: h for h in scan_hazards(model, Precision.FP16)}
    assert kinds["clip-bounds"].evidence["rounded"] == float("inf")
    assert kinds["div-small-constant"].node == "div"
