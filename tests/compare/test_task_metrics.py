"""Metric specs, the built-in registry, user functions and evaluate_metric's checks."""

import json
import math
import sys

import numpy as np
import pytest

from precision_doctor.compare.tasks.registry import (
    BUILTINS,
    TaskMetric,
    evaluate_metric,
    get_metric,
    list_metrics,
)
from precision_doctor.errors import MetricError

REF = {"logits": np.array([[0.1, 0.9], [0.8, 0.2]]), "map": np.array([[[0.9, 0.1]]])}
CAND = {"logits": np.array([[0.2, 0.7], [0.1, 0.2]]), "map": np.array([[[0.35, 0.1]]])}


def test_builtins_resolve_with_params_and_evaluate():
    top1 = get_metric("top1")
    assert top1.name == "top1" and top1.higher_is_better and top1.default_threshold == 0.99
    assert evaluate_metric(top1, REF, CAND) == 0.5 and top1(REF, CAND) == 0.5
    iou = get_metric("mask-iou:output=map, threshold=0.3")
    assert iou.params == (("output", "map"), ("threshold", 0.3))
    assert evaluate_metric(iou, REF, CAND) == 1.0
    assert evaluate_metric(get_metric("mask-iou:output=map"), REF, CAND) == 0.0
    assert [m.name for m in list_metrics()] == list(BUILTINS)
    assert {"top1", "top5", "mask-iou", "box-match", "box-map", "ctc-string", "ctc-char",
            "psnr", "ssim"} <= set(BUILTINS)


def test_text_options_stay_text_and_json_round_trip():
    metric = get_metric("top1:output=845")  # numeric output names exist in real exports
    assert metric.params == (("output", "845"),)
    again = TaskMetric.from_dict(json.loads(json.dumps(metric.to_dict())))
    assert again == metric and again.fn is metric.fn
    assert metric.meets(0.995) and not metric.meets(0.98) and metric.meets(0.5, threshold=0.4)


@pytest.mark.parametrize("spec, message", [
    ("", "empty metric spec"),
    ("mask-iou:thresh=0.3", "no option 'thresh'.*output, threshold"),
    ("mask-iou:threshold=high", "should be a number"),
    ("top5:k=2.5", "should be an integer"),
    ("top1:output", "not key=value"),
    ("top1:axis=1,axis=2", "given twice"),
    ("mask_iou", "Did you mean 'mask-iou'"),
    ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
    ("json:no_such_function", "has no function 'no_such_function'.*dumps"),
    ("json:__doc__", "is a str, not a function"),
])
def test_bad_specs_raise_metric_error(spec, message):
    with pytest.raises(MetricError, match=message):
        get_metric(spec)


def test_user_function_from_file_with_params(tmp_path):
    f = tmp_path / "my_metrics.py"
    f.write_text(
        "import numpy as np\n"
        "def agree(reference, candidate, output='logits', scale=1.0):\n"
        "    '''Share of equal signs, scaled.'''\n"
        "    r, c = reference[output], candidate[output]\n"
        "    return float(np.mean(np.sign(r - 0.5) == np.sign(c - 0.5))) * scale\n"
        "def nan_metric(reference, candidate):\n"
        "    return float('nan')\n"
        "def array_metric(reference, candidate):\n"
        "    return np.ones(3)\n"
        "def boom(reference, candidate):\n"
        "    raise KeyError('logits_typo')\n", encoding="utf-8")
    metric = get_metric(f"{f}:agree:scale=2")
    assert metric.name == f"{f}:agree" and metric.default_threshold is None
    assert metric.description == "Share of equal signs, scaled."
    assert evaluate_metric(metric, REF, CAND) == pytest.approx(2 * 0.75)
    with pytest.raises(MetricError, match=r"nan_metric returned NaN"):
        evaluate_metric(get_metric(f"{f}:nan_metric"), REF, CAND)
    with pytest.raises(MetricError, match=r"array_metric returned ndarray"):
        evaluate_metric(get_metric(f"{f}:array_metric"), REF, CAND)
    with pytest.raises(MetricError, match=r"boom raised KeyError: 'logits_typo'"):
        evaluate_metric(get_metric(f"{f}:boom"), REF, CAND)


def test_user_module_from_working_directory_and_import_errors(tmp_path, monkeypatch):
    (tmp_path / "cwd_metric_mod.py").write_text(
        "def score(reference, candidate):\n    return 1\n", encoding="utf-8")
    (tmp_path / "broken.py").write_text("def oops(:\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "cwd_metric_mod", raising=False)
    assert evaluate_metric(get_metric("cwd_metric_mod:score"), REF, CAND) == 1.0
    assert str(tmp_path) not in sys.path or sys.path.count(str(tmp_path)) <= 1
    with pytest.raises(MetricError, match=r"importing broken\.py failed with SyntaxError"):
        get_metric("broken.py:oops")
    with pytest.raises(MetricError, match="does not exist"):
        get_metric("missing/metrics.py:fn")


def test_builtin_errors_name_the_metric_and_inf_is_allowed():
    with pytest.raises(MetricError, match=r"^top1: .*'nope' is not a model output"):
        evaluate_metric(get_metric("top1:output=nope"), REF, CAND)
    img = {"y": np.linspace(0, 1, 16).reshape(4, 4)}
    assert evaluate_metric(get_metric("psnr"), img, img) == math.inf
