"""apply_rewrites contract: copy not mutation, preserved model fields, report JSON, rule names."""

from __future__ import annotations

import json

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from precision_doctor.errors import PlanError
from precision_doctor.precision.rewrites import (
    REWRITES,
    FoldConstants,
    RewriteRecord,
    RewriteReport,
    apply_rewrites,
)

TEXT = """
<ir_version: 8, opset_import: ["" : 13], producer_name: "unit", producer_version: "1.2",
 doc_string: "model doc", metadata_props: ["character": "abc", "author": "me"]>
g (float[1, 2, 3, 3] x) => (float[1, 2, 3, 3] y, float[1, 2, 3, 3] z)
<float[2, 2, 1, 1] W = {1.0, 0.5, -0.5, 2.0}, int64[4] shp = {1, 2, 1, 1},
 float[2] s = {1.0, 2.0}, float[2] b = {0.0, 0.5}, float[2] m = {0.1, 0.2},
 float[2] v = {4.0, 9.0}> {
    scale = Constant<value = float[2] {3.0, 4.0}>()
    two = Constant<value = float {2.0}>()
    halved = Div(scale, two)
    c = Conv(x, W)
    y = BatchNormalization<epsilon = 0.001>(c, s, b, m, v)
    h4 = Reshape(halved, shp)
    z = Mul(y, h4)
}
"""


def _model() -> onnx.ModelProto:
    model = onnx.parser.parse_model(TEXT)
    model.graph.doc_string = "graph doc"
    return model


def test_input_is_not_mutated_and_model_fields_are_kept() -> None:
    model = _model()
    before = model.SerializeToString()
    out, report = apply_rewrites(model)
    assert model.SerializeToString() == before
    onnx.checker.check_model(out, full_check=True)
    assert (out.producer_name, out.producer_version, out.doc_string) == ("unit", "1.2", "model doc")
    assert out.graph.doc_string == "graph doc"
    assert {p.key: p.value for p in out.metadata_props} == {"character": "abc", "author": "me"}
    assert [i.name for i in out.graph.input] == ["x"]
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert len(out.graph.value_info) == 0  # the rewrites add no shape annotations
    assert report.rules == tuple(REWRITES) and report.changed


def test_fold_constants_records_what_was_folded() -> None:
    out, report = apply_rewrites(_model(), ["fold-constants"])
    folded = {r.nodes[0]: r for r in report.applied("fold-constants")}
    assert {"Div_2", "Reshape_5", "Constant_0", "Constant_1"} <= set(folded)
    assert "stored as initializer" in folded["Reshape_5"].reason
    assert {n.op_type for n in out.graph.node} == {"Conv", "BatchNormalization", "Mul"}
    assert all(not i.metadata_props for i in out.graph.initializer)


def test_nothing_to_fold_is_one_skipped_record() -> None:
    model = ir.from_proto(onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 13]> g (float[2] x) => (float[2] y) { y = Relu(x) }'))
    result = FoldConstants()(model)
    assert not result.modified and len(result.records) == 1 and not result.records[0].applied


def test_report_round_trips_through_json() -> None:
    _, report = apply_rewrites(_model())
    extra = RewriteRecord("fold-batchnorm", False, ("n",), (), "why", {"x": float("inf")})
    report = RewriteReport(report.rules, report.records + (extra,), report.opset_before,
                           report.opset_after)
    text = json.dumps(report.to_dict())
    again = RewriteReport.from_dict(json.loads(text))
    assert again == report
    assert again.counts() == report.counts()


def test_unknown_rule_raises_with_the_list() -> None:
    with pytest.raises(PlanError, match="available: fold-constants"):
        apply_rewrites(_model(), ["fold-bn"])


def test_rules_run_in_canonical_order() -> None:
    _, report = apply_rewrites(_model(), ["fold-batchnorm", "fold-constants"])
    assert report.rules == ("fold-constants", "fold-batchnorm")


def test_failed_opset_conversion_is_recorded_not_raised() -> None:
    model = _model()
    _, report = apply_rewrites(model, [], target_opset=99)
    [record] = report.records
    assert record.rule == "convert-opset" and not record.applied and "13 -> 99" in record.reason
    assert report.opset_after == 13


def test_passes_compose_on_an_ir_model() -> None:
    model = ir.from_proto(_model())
    manager = ir.passes.PassManager([REWRITES[name]() for name in REWRITES
                                     if name != "fuse-layernorm"])
    result = manager(model)
    assert result.modified
    assert [n.op_type for n in model.graph] == ["Conv", "Mul"]
