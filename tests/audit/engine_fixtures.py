"""Layer-information fixtures in the exact schemas TensorRT writes (copied field by field from
the real samples in ../shared/data/engine-json), small enough to read."""

from __future__ import annotations

F32 = "Row major linear FP32"
F16_NHWC8 = "Channel major FP16 format where channel % 8 == 0"
F16_LINEAR = "Row major linear FP16 format"
I8 = "Thirty-two wide channel vectorized row major Int8 format"
I32 = "Row major linear Int32"
TF32_TACTIC = ("sm80_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16"
               "_stage4_warpsize2x2x1_g1_tensor16x8x8_t1r1s1")
F16_TACTIC = ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize256x64x32"
              "_stage3_warpsize4x1x1_g1_tensor16x8x16_t1r3s3_aACCESS")


def tensor(name: str, fmt: str, dims: list[int] | None = None, kgen: bool = False) -> dict:
    """One Inputs/Outputs entry (TensorRT 10 Myelin kernels omit Location)."""
    out = {"Name": name, "Dimensions": dims or [1, 64, 8, 8], "Format/Datatype": fmt}
    if not kgen:
        out["Location"] = "Device"
    return out


def trt84_layers() -> dict:
    """TensorRT 8.4 style (TREx ResNet samples): no Metadata, names joined with ' + '."""
    return {"Layers": [
        {"Name": "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1",
         "LayerType": "Reformat", "Inputs": [tensor("input.1", F32, [1, 3, 8, 8])],
         "Outputs": [tensor("Reformatted Input Tensor 0 to Conv_0 + Relu_1", F16_NHWC8,
                            [1, 3, 8, 8])],
         "ParameterType": "Reformat", "Origin": "REFORMAT", "TacticValue": "0x0"},
        {"Name": "Conv_0 + Relu_1", "LayerType": "CaskConvolution",
         "Inputs": [tensor("Reformatted Input Tensor 0 to Conv_0 + Relu_1", F16_NHWC8,
                           [1, 3, 8, 8])],
         "Outputs": [tensor("onnx::MaxPool_125", F16_NHWC8)], "ParameterType": "Convolution",
         "Kernel": [3, 3], "Weights": {"Type": "Half", "Count": 1728},
         "Bias": {"Type": "Half", "Count": 64}, "TacticName": F16_TACTIC,
         "TacticValue": "0xe2222883a6602489"},
        {"Name": "Conv_2", "LayerType": "CaskConvolution",
         "Inputs": [tensor("onnx::MaxPool_125", F32)], "Outputs": [tensor("x3", F32)],
         "ParameterType": "Convolution", "Weights": {"Type": "Float", "Count": 10},
         "TacticName": TF32_TACTIC, "TacticValue": "0x1"},
        {"Name": "Softmax_3", "LayerType": "CudaSoftMax", "Inputs": [tensor("x3", F32)],
         "Outputs": [tensor("out", F32)], "ParameterType": "SoftMax", "Axes": 2, "HasLog": 0,
         "TacticValue": "0x2"},
        {"Name": "MysteryLayer_4", "LayerType": "SomethingNew", "Inputs": [],
         "Outputs": [{"Name": "y", "Format/Datatype": "Sixty-four wide quantum format"}],
         "BrandNewKey": 1},
    ], "Bindings": ["input.1", "out"]}


def trt84_profile() -> list:
    return [{"count": 10},
            {"name": "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1",
             "timeMs": 1.0, "averageMs": 0.1, "medianMs": 0.1, "percentage": 10.0},
            {"name": "Conv_0 + Relu_1", "timeMs": 4.0, "averageMs": 0.4, "medianMs": 0.4,
             "percentage": 40.0},
            {"name": "Conv_2", "timeMs": 3.0, "averageMs": 0.3, "medianMs": 0.3,
             "percentage": 30.0},
            {"name": "Softmax_3", "timeMs": 2.0, "averageMs": 0.2, "medianMs": 0.2,
             "percentage": 20.0}]


def foreign_name(first: str, last: str) -> str:
    return f"{{ForeignNode[{first} + (Unnamed Layer* 109) [Shuffle]...{last}]}}"


REGION_FIRST = "blocks.0.transformer_blocks.0.norm1.weight"
REGION_LAST = "/blocks.0/Reshape_3"


def trt86_layers(with_formats: bool = True) -> dict:
    """TensorRT 8.6 style (ControlNet samples): Metadata with \\x1e, Myelin ForeignNode."""
    region_io = {
        "Inputs": [tensor("/blocks.0/proj_in/Conv_output_0", F16_NHWC8),
                   tensor("context", F32, [1, 77, 768])],
        "Outputs": [tensor("/blocks.0/Reshape_3_output_0", F16_NHWC8)],
    } if with_formats else {"Inputs": [], "Outputs": []}
    return {"Layers": [
        {"Name": "/Unsqueeze", "LayerType": "NoOp", "Inputs": [tensor("t", I32, [1])],
         "Outputs": [tensor("/Unsqueeze_output_0", I32, [1, 1])], "TacticValue": "0x0",
         "StreamId": 0, "Metadata": "[ONNX Layer: /Unsqueeze]"},
        {"Name": "/Cast_1", "LayerType": "MyelinReformat", "Inputs": [tensor("x", F32)],
         "Outputs": [tensor("/Cast_1_output_0", F16_NHWC8)], "TacticValue": "0x0",
         "StreamId": 0, "Metadata": ""},
        {"Name": "/blocks.0/proj_in/Conv", "LayerType": "CaskGemmConvolution",
         "Inputs": [tensor("/Cast_1_output_0", F16_NHWC8)],
         "Outputs": [tensor("/blocks.0/proj_in/Conv_output_0", F16_NHWC8)],
         "ParameterType": "Convolution", "Weights": {"Type": "Half", "Count": 4096},
         "TacticName": F16_TACTIC, "TacticValue": "0x3", "StreamId": 0,
         "Metadata": "[ONNX Layer: /blocks.0/proj_in/Conv]"},
        {"Name": foreign_name(REGION_FIRST, REGION_LAST), "LayerType": "Myelin", **region_io,
         "TacticValue": "0x0", "StreamId": 0, "Metadata": ""},
        {"Name": "/blocks.0/norm/InstanceNormalization", "LayerType": "PluginV2",
         "Inputs": [tensor("/blocks.0/Reshape_3_output_0", F16_LINEAR)],
         "Outputs": [tensor("/blocks.0/norm/InstanceNormalization_output_0", F16_LINEAR)],
         "ParameterType": "PluginV2", "PluginType": "InstanceNormalization_TRT",
         "TacticValue": "0x0", "StreamId": 0,
         "Metadata": "[ONNX Layer: /blocks.0/norm/InstanceNormalization]"},
        {"Name": "PWN(PWN(/blocks.0/act/Sigmoid), /blocks.0/act/Mul)", "LayerType":
         "PointWiseV2", "Inputs": [tensor("/blocks.0/norm/InstanceNormalization_output_0",
                                          F16_LINEAR)],
         "Outputs": [tensor("/blocks.0/act/Mul_output_0", F16_LINEAR)], "TacticValue": "0x4",
         "StreamId": 0,
         "Metadata": "[ONNX Layer: /blocks.0/act/Sigmoid]\x1e[ONNX Layer: /blocks.0/act/Mul]\x1e"},
        {"Name": "Reformatting CopyNode for Output Tensor 0 to /out/Conv", "LayerType":
         "Reformat", "Inputs": [tensor("/blocks.0/act/Mul_output_0", F16_LINEAR)],
         "Outputs": [tensor("out", F32)], "ParameterType": "Reformat", "Origin": "REFORMAT",
         "TacticValue": "0x0", "StreamId": 0, "Metadata": ""},
    ], "Bindings": ["x", "t", "context", "out"]}


def trt86_profile() -> list:
    names = [x["Name"] for x in trt86_layers()["Layers"]]
    times = [0.0, 0.01, 0.2, 1.5, 0.1, 0.05, 0.04]
    total = sum(times)
    return [{"count": 5}] + [
        {"name": n, "timeMs": t * 5, "averageMs": t, "medianMs": t,
         "percentage": 100 * t / total} for n, t in zip(names, times, strict=True)]


def trt10_layers() -> dict:
    """TensorRT 10 style (alexnet trtexec sample): kgen/gemm/shape_call with Half/Float."""
    gemm_inputs = [tensor("/flat_output_0", "Half", [1, 9216], kgen=True),
                   tensor("__mye583_dconst", "Half", [9216, 4096], kgen=True),
                   tensor("__mye546/fc/Gemm_alpha", "Float", [1], kgen=True),
                   tensor("__mye547/fc/Gemm_beta", "Float", [1], kgen=True),
                   tensor("fc_bias", "Half", [1, 4096], kgen=True)]
    return {"Layers": [
        {"Name": "/features/Conv + /features/Relu", "LayerType": "CaskConvolution",
         "Inputs": [tensor("input", F16_NHWC8)], "Outputs": [tensor("c", F16_NHWC8)],
         "ParameterType": "Convolution", "TacticName": F16_TACTIC, "TacticValue": "0x5",
         "StreamId": 0,
         "Metadata": "[ONNX Layer: /features/Conv]\x1e[ONNX Layer: /features/Relu]"},
        {"Name": "dummy_shape_call__mye622_0_myl9_0", "LayerType": "shape_call", "Inputs": [],
         "Outputs": [], "TacticName": "", "StreamId": 0, "Metadata": ""},
        {"Name": "__myl_Res_myl9_1", "LayerType": "kgen",
         "Inputs": [tensor("c", "Half", [1, 256, 6, 6], kgen=True)],
         "Outputs": [tensor("/flat_output_0", "Half", [1, 9216], kgen=True)],
         "TacticName": "__myl_Res_0x63adb2bae59ff89a94fc133e2755c132", "StreamId": 0,
         "Metadata": "[ONNX Layer: /Flatten]"},
        {"Name": "/fc/Gemm_myl9_2", "LayerType": "gemm", "Inputs": gemm_inputs,
         "Outputs": [tensor("output", "Half", [1, 4096], kgen=True)],
         "TacticName": "sm50_xmma_cublas_gemvx_f16f16_f32_f32_tn_n_int32_unit_n_launch_param4x32x32"
                       "_strided_unit_stride", "StreamId": 0,
         "Metadata": "[ONNX Layer: /fc/Gemm]\x1f[ONNX Layer: /fc/Softmax]"},
    ], "Bindings": ["input", "output"]}


