"""``fix`` on a range-bound model: the region-first search, the range-bound report with BF16's
measured error, and the plan printed by region (``search.regions``, ``repair.range_bound``,
``report.terminal.fix.plan_lines``), on the miniature diffusion UNet of
``tests/diagnosis/periodic_models.py`` (25 residual blocks, each overflowing FP16 before its
InstanceNorm: 75 nodes needed in FP32)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import precision_doctor as pd
from precision_doctor.formats import Precision
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.precision.rewrites import REWRITES
from precision_doctor.repair import ranking
from precision_doctor.repair.range_bound import is_range_bound, range_bound_report
from precision_doctor.report.terminal.fix import MAX_PLAN_LINES, plan_lines

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnosis"))
from periodic_models import diffusion_unet, unet_samples  # noqa: E402


def _fix(regions: bool, monkeypatch) -> dict:
    monkeypatch.setattr(ranking, "REGION_SEARCH", regions)
    fixed = pd.fix(diffusion_unet(), [s.feeds for s in unet_samples()], target="fp16",
                   quiet=True)
    return {"report": dict(fixed.report), "result": fixed.result}


@pytest.fixture(scope="module")
def both():
    with pytest.MonkeyPatch.context() as mp:
        # prescale-normalized-residual scales these streams into FP16's range (the cure is then
        # the periodic reduction's 7 nodes): the searches are measured on the model without it
        mp.delitem(REWRITES, "prescale-normalized-residual")
        return _fix(False, mp), _fix(True, mp)


def test_regions_first_keeps_the_same_nodes_from_the_range_floor(both):
    nodes, regions = (b["report"] for b in both)
    assert nodes["search"]["regions"] is None
    assert nodes["resources"]["evaluations"] == 150  # the node search spends its budget
    assert any("whole budget" in w for w in nodes["warnings"])
    assert regions["verdict"] == nodes["verdict"] == "pass"
    assert sorted(regions["search"]["kept"]) == sorted(nodes["search"]["kept"])
    assert len(regions["search"]["kept"]) == 75
    # the range floor's first rung (every value above 65504 with its readers) passes: start,
    # the rung, the final evaluation (54 without the floor)
    assert regions["resources"]["evaluations"] <= 4
    assert not any("whole budget" in w for w in regions["warnings"])
    done = regions["search"]["regions"]
    assert done["regions"] >= 2 and not done["stopped"]
    assert done["floor"] == 75 and done["floor_threshold"] == 65504.0 and not done["kept"]


def test_the_range_bound_report_measures_bf16(both):
    bound = both[1]["report"]["range_bound"]
    assert bound["fp32_nodes"] == 82 and bound["in_overflow"] == 75
    assert bound["peak"] > 65504 and bound["flops"] > 0.9
    bf16 = bound["bf16"]
    assert bf16["tolerance"] == 0.08 and bf16["rel_l2"] > bf16["tolerance"]
    assert not bf16["passed"]
    assert bound["message"].startswith("range-bound: the FP16 cure keeps 82 nodes (99.6% of "
                                       "FLOPs) in FP32 (75 in overflow regions, values up to")
    assert "BF16 alone does not meet its tolerance either" in bound["message"]


def test_the_plan_prints_by_region_in_at_most_30_lines(both):
    result = both[1]["result"]
    lines = plan_lines(result)
    assert len(lines) <= MAX_PLAN_LINES
    assert lines[0].startswith("FP32 nodes by region (82;")
    assert "  input_blocks: 24 (search 24; Add x8, InstanceNormalization x8, MatMul x8)" \
        in lines
    assert any(line.startswith("  output_blocks: 48 ") for line in lines)
    assert len(lines[1:]) == 7 and all(len(line) <= 100 for line in lines)
    # a limit smaller than the regions: the last line counts what is left
    short = plan_lines(result, limit=4)
    assert len(short) == 4 and short[-1].startswith("  ... 5 more regions, ")


def test_small_plans_keep_one_line_per_node():
    plan = PrecisionPlan(Precision.FP16).keep_fp32(["/a/Conv", "/b/Add"], "search", "needed")
    lines = plan_lines(SimpleNamespace(plan=plan, rewritten=None))
    assert lines == ["  FP32 /a/Conv: search needed", "  FP32 /b/Add: search needed"]


def test_range_bound_is_defined_by_measured_quantities():
    overflow = {f"n{i}": (f"n{i}",) for i in range(20)}
    kept = [f"n{i}" for i in range(20)]
    assert is_range_bound(Precision.FP16, 1e6, kept, overflow, 0.01)  # 20 nodes kept
    assert not is_range_bound(Precision.FP16, 6e4, kept, overflow, 0.5)  # inside 65504
    assert not is_range_bound(Precision.FP16, 1e6, kept, {}, 0.5)  # no overflow region
    assert not is_range_bound(Precision.BF16, 1e6, kept, overflow, 0.5)  # BF16 has the range
    assert not is_range_bound(Precision.FP16, 1e6, kept[:3], overflow, 0.05)  # small cure
    assert is_range_bound(Precision.FP16, 1e6, kept[:3], overflow, 0.2)  # 20% of FLOPs
    bf16 = {"rel_l2": 0.0425, "output": "y", "tolerance": 0.08, "passed": True,
            "objective_passed": False, "score": 0.0425}
    msg = range_bound_report(369, 300, 0.349, 3.1e6, bf16)["message"]
    assert msg == ("range-bound: the FP16 cure keeps 369 nodes (34.9% of FLOPs) in FP32 (300 "
                   "in overflow regions, values up to 3.1e+06 > 65504); BF16 alone meets its "
                   "tolerance (rel L2 0.0425 <= 0.08)")


def test_the_html_fix_section_lists_regions_and_the_range_bound_line(both):
    from precision_doctor.report.html_fix import MAX_GROUPS, render_fix_section
    from precision_doctor.report.terminal.fix import fp32_groups

    result = both[1]["result"]
    plan = [{"node": n, "op_type": "", "precision": d.precision.value, "reason": d.reason,
             "detail": d.detail} for n, d in result.plan.overrides.items()]
    groups = fp32_groups(result)
    html = render_fix_section({"plan": plan, "plan_groups": groups,
                               "range_bound": result.range_bound}).html
    assert "FP32 nodes by region" in html and "<code>output_blocks</code>" in html
    assert "range-bound: the FP16 cure keeps 82 nodes" in html
    many = render_fix_section({"plan": plan, "plan_groups": groups * 10}).html
    assert many.count("<tr><td class=\"name\"><code>") <= MAX_GROUPS + len(plan)
    assert "more regions" in many
