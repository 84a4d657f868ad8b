"""The evaluation of ``quant_anchors``, the same for every output model: ONNX Runtime CPU with
``graph_optimization_level=ORT_ENABLE_BASIC`` (the extended level's Q/DQ fusions change FP8 Q/DQ
semantics) and its ``WeightBiasQuantization`` transformer disabled (at the basic level it turns
a Conv/Gemm bias into int32 Q/DQ with scale x_scale * w_scale computed in the bias's type: with
FP16 scales the quotient overflows and the output is ruined), on every sample, against the FP32
model on the same session options: relative L2 per output (over all samples), the task metric
(worst sample, per sample, samples meeting the threshold), and the unquantized layers:
Conv/ConvTranspose/MatMul/Gemm nodes none of whose inputs comes from a DequantizeLinear (through
Cast/Identity/Reshape/Transpose/Flatten/Squeeze/Unsqueeze only), with their names; Q/DQ scales
that are NaN, inf or 0. ``raw BASIC`` (column and ``raw_basic``): max relative L2 / worst metric
with that transformer left on, as a plain ``ORT_ENABLE_BASIC`` session runs the model.
``calibration_set``: the task metric on the calibration samples (those the tools saw);
``compute``: the share of MACs and weights in INT8/FP8 (``quant_anchors_macs``).
"""

from __future__ import annotations

from quant_anchors_macs import WEIGHTED, dequantized, node_costs, quantized_share

# ORT 1.32's level-1 (BASIC) transformer that rewrites a float Conv/Gemm bias into int32 Q/DQ
# with scale x_scale * w_scale, computed in the bias's type: with FP16 scales and bias the
# quotient overflows/underflows and the output is ruined (rel L2 0.7-0.9 on PP-OCR models whose
# BatchNorm was folded into the bias); off in the main evaluation, measured apart ("raw BASIC")
WEIGHT_BIAS_QUANTIZATION = "WeightBiasQuantization"


def session(path: str, disabled: tuple[str, ...] = (WEIGHT_BIAS_QUANTIZATION,)):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def run_all(path: str, spec: dict, disabled: tuple[str, ...] = (WEIGHT_BIAS_QUANTIZATION,),
            files: list[str] | None = None) -> dict:
    """Outputs of the model at ``path`` on ``files`` (default: the evaluation samples)."""
    import numpy as np

    sess = session(path, disabled)
    names = [o.name for o in sess.get_outputs()]
    outs: dict = {n: [] for n in names}
    for f in spec["samples"] if files is None else files:
        for n, v in zip(names, sess.run(names, dict(np.load(f)))):
            outs[n].append(np.asarray(v, np.float32) if v.dtype.kind == "f" else v)
    return outs


def weighted_layers(path: str) -> tuple[list[str], list[str]]:
    """(every Conv/ConvTranspose/MatMul/Gemm node, those none of whose inputs comes from a
    DequantizeLinear through pass-through ops), by name, graph order."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    from_dq = dequantized(graph)
    weighted = [n for n in graph.node if n.op_type in WEIGHTED]
    left = [n.name or f"{n.op_type}:{n.output[0]}" for n in weighted
            if not any(from_dq(i) for i in n.input if i)]
    return [n.name for n in weighted], left


def bad_scales(path: str) -> list[str]:
    """Inputs of Q/DQ nodes whose scale initializer has a NaN, an inf or a zero."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    scales = {i.name: i for i in graph.initializer}
    for node in graph.node:  # scales held in Constant nodes
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            scales[node.output[0]] = node.attribute[0].t
    bad = []
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.input[1] in scales:
            value = numpy_helper.to_array(scales[node.input[1]]).astype(np.float32)
            if not np.all(np.isfinite(value)) or np.any(value == 0):
                bad.append(f"{node.op_type}({node.input[0]})")
    return bad


def references(spec: dict) -> dict:
    """What every output model of ``spec`` is measured against: the FP32 outputs on the
    evaluation samples (``reference``) and on the calibration samples (``calibration``), and
    the MACs and weights of each weighted node (``costs``, ``quant_anchors_macs``)."""
    import numpy as np

    return {"reference": run_all(spec["model"], spec),
            "calibration": run_all(spec["model"], spec, files=spec["calibration"]),
            "costs": node_costs(spec["model"], dict(np.load(spec["calibration"][0])))}


def evaluate(path: str, spec: dict, refs: dict) -> dict:
    """The row's evaluation of the output model at ``path`` (module docstring); ``refs`` from
    :func:`references`."""
    import numpy as np

    from precision_doctor.compare.tasks.registry import evaluate_metric, get_metric

    reference = refs["reference"]
    try:
        outs = run_all(path, spec)
        raw = run_all(path, spec, disabled=())
        seen = run_all(path, spec, files=spec["calibration"])
    except Exception as exc:  # noqa: BLE001 - a model ORT refuses is a finding
        return {"eval_error": f"{type(exc).__name__}: {str(exc)[:400]}"}

    def rel_l2(outs: dict) -> dict:
        rel = {}
        for n, refs in reference.items():
            num = sum(float(np.sum((np.asarray(c, np.float64) - np.asarray(r, np.float64)) ** 2))
                      for r, c in zip(refs, outs[n]))
            den = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in refs)
            rel[n] = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
        return rel

    rel = rel_l2(outs)
    row: dict = {"rel_l2": rel, "max_rel_l2": max(rel.values())}
    n_samples = len(spec["samples"])
    primary = get_metric(spec["metric"])
    raw_values = [evaluate_metric(primary, {k: v[i] for k, v in reference.items()},
                                  {k: v[i] for k, v in raw.items()}) for i in range(n_samples)]
    row["raw_basic"] = {"max_rel_l2": max(rel_l2(raw).values()),
                        "metric_worst": min(raw_values), "metric_per_sample": raw_values}
    for spec_str, threshold, key in ([(spec["metric"], spec["threshold"], "metric")]
                                     + [(m, t, m) for m, t in
                                        spec.get("extra_metrics", {}).items()]):
        metric = get_metric(spec_str)
        values = [evaluate_metric(metric, {k: v[i] for k, v in reference.items()},
                                  {k: v[i] for k, v in outs.items()}) for i in range(n_samples)]
        worst = min(values) if metric.higher_is_better else max(values)
        row[key] = {"name": metric.name, "threshold": threshold, "worst": worst,
                    "mean": float(np.mean(values)), "per_sample": values,
                    "met_on_every_sample": all(metric.meets(v, threshold) for v in values)}
    # the same metric on the calibration samples, which every tool saw (pd also searched on
    # them): a pass there and a failure on the evaluation samples is a plan that overfits
    values = [evaluate_metric(primary, {k: v[i] for k, v in refs["calibration"].items()},
                              {k: v[i] for k, v in seen.items()})
              for i in range(len(spec["calibration"]))]
    row["calibration_set"] = {
        "samples": len(values), "metric_worst": min(values) if primary.higher_is_better
        else max(values), "met": sum(primary.meets(v, spec["threshold"]) for v in values),
        "per_sample": values}
    weighted, left = weighted_layers(path)
    bad = bad_scales(path)
    row.update(weighted_layers=len(weighted), unquantized=len(left), unquantized_layers=left,
               bad_scales=len(bad), bad_scales_first=bad[:5],
               compute=quantized_share(path, refs["costs"]))
    try:  # the package's own measure, as fix reports it (its MACs equal compute's)
        import onnx

        from precision_doctor.search.cost import quantized_share as package_share

        shapes = {k: v.shape for k, v in np.load(spec["calibration"][0]).items()}
        row["package_quantized_share"] = package_share(onnx.load(path), shapes)
    except Exception as exc:  # noqa: BLE001 - older package, or shapes it cannot infer
        row["package_quantized_share"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return row

