"""``FixResult``: what ``fix`` returns, and its JSON report.

JSON schema (``schema`` = ``precision-doctor/fix``, ``schema_version`` = 1), written next to
the fixed model as ``*.report.json``:

    {
      "schema": "precision-doctor/fix", "schema_version": 1, "tool_version": "0.1.0",
      "verdict": "pass" | "fail" | "overfits",  # the fixed model, run by its verifier;
                                            # overfits: passes the search samples, fails
                                            # the held-out ones (``holdout``)
      "target": "fp16" | "bf16", "objective": str,
      "plan": {"schema_version", "default",
               "overrides": {node: {"precision", "reason", "detail"}}},
      "fp32_share": {"nodes", "flops", "params"},                      # shares in [0, 1]
      "before": {output: <metrics>},         # the naive all-low model (emulated)
      "after": {output: <metrics>},          # the fixed model, run by its verifier
      "after_emulated": {output: <metrics>}, # the emulated final plan
      "score_before": {"passed", "value", "detail"}, "score_after": {...},
      "search": {"evaluations", "kept": [node], "ranking_head": [node], "samples_run",
                 "trials": [{"stage", "fp32_nodes", "passed", "value", "seconds",
                             "samples"}],
                 "regions": null | {"regions", "kept": [name], "levels", "stopped": [name]}},
                                            # additive: the region search (search.regions)
      "rewrites": {"schema_version", "rules", "opset_before", "opset_after", "counts",
                   "records": [{"rule", "applied", "nodes", "new_nodes", "reason",
                                "details"}]},
      "writer": {"casts_inserted", "kept_fp32", "nodes_per_precision", "node_precisions",
                 "opset_before", "opset_after", "io_dtypes", "ort_validated", "warnings",
                 ...},                          # precision.writer.report.WriterReport
      "seconds": {stage: seconds}, "warnings": [str], "notes": [str],
      "near_ties": [{"sample", "index", "margin", "noise"}],
      "resources": {"evaluations", "samples_run", "wall_s", "cpu_s", "peak_rss_mb",
                    "peak_rss_workers_mb", "jobs"},
      "verification": {"runner", "spec", "reason", "skipped": [{"runner", "reason"}],
                       "engine"},
      "engine": null | "ort-cuda",          # the deployment engine written for (--engine)
      "range_bound": null | {"fp32_nodes", "in_overflow", "flops", "peak", "format_max",
                             "bf16": {"rel_l2", "output", "tolerance", "passed",
                                      "objective_passed", "score"}, "message"}
                                            # additive: repair.range_bound
      "holdout": null | {"samples", "indices", "names", "search_samples", "chosen", "seed",
                         "score", "passed", "search_score", "search_passed", "score_label",
                         "overfits", "message"}
                                            # additive: repair.holdout.HoldoutCheck
    }

``<metrics>`` is ``compare.metrics.OutputMetrics.to_dict`` (max/mean/median/p99 absolute
error, relative L2, cosine, SNR, NaN/Inf counts, argmax agreement). Non-finite floats are
written as the strings "inf", "-inf", "nan".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from precision_doctor import __version__
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.search.bisection import SearchResult
from precision_doctor.search.near_ties import NearTie
from precision_doctor.search.objective import Score


@dataclass(frozen=True)
class FixResult:
    """Everything ``fix`` did; ``to_dict`` is the JSON report (schema ``precision-doctor/fix``).

    Attributes:
        model: The fixed strongly typed model.
        rewritten: The FP32 model after the numerically safe rewrites (the plan's node names).
        plan: The final precision plan (every override with its reason).
        search: The search result (evaluations, trials).
        before: Output metrics (dicts) of the naive all-low model (emulated).
        after: Output metrics of the fixed model run by the runner that verified it
            (``verification``).
        after_emulated: Output metrics of the emulated final plan.
        score_before: Objective score of the naive all-low model (emulated).
        score_after: Objective score of the fixed model run by the runner that verified it.
        share: FP32 share by nodes / FLOPs / params.
        rewrites: Report of the rewrites (dict).
        writer: Report of the writer (dict).
        target: The low precision asked for (``fp16`` or ``bf16``).
        objective: The objective, in words.
        seconds: Wall time per stage.
        warnings: What the user should know and may act on (emulator vs ORT gap, budget).
        notes: Assumptions the fixed model relies on (engine settings).
        near_ties: Samples left out of a decision-metric target (see ``search.near_ties``).
        score_label: What the scores measure (``Objective.score_label``).
        pass_mark: ``(threshold, higher_is_better)`` the scores are compared with
            (``Objective.pass_mark``).
        resources: What the run cost: ``evaluations``, ``samples_run`` (sample runs of the
            search), ``wall_s`` (whole ``fix``), ``peak_rss_mb`` (this process, MiB, from
            ``resource.getrusage`` ``ru_maxrss``), ``peak_rss_workers_mb`` (largest worker of
            ``--jobs``, 0 without), ``jobs``.
        verification: Which runner verified the written model and why
            (``runners.verify.VerifiedBy.to_dict()``: ``runner``, ``spec``, ``reason``,
            ``skipped``): ONNX Runtime CPU, ONNX Runtime CUDA, the search's ``--runner``, or
            for a BF16 model ONNX Runtime CPU cannot run, its exact emulation.
        accuracy: With labels: the task accuracy of the FP32 reference, the naive low
            precision model and the fixed model (``compare.tasks.accuracy.task_accuracy``).
        engine: The deployment engine the model was written for (``ort-cuda``: nodes without
            a kernel there are FP32, reason ``engine``); "" for none.
        range_bound: Where the FP16 cure keeps many nodes FP32 for range, what it keeps and
            BF16's measured alternative (``repair.range_bound``); {} otherwise.
        holdout: The written model on samples the search never saw
            (``repair.holdout.HoldoutCheck.to_dict``); {} when ``fix`` was given no split.
    """

    model: onnx.ModelProto
    rewritten: onnx.ModelProto
    plan: PrecisionPlan
    search: SearchResult
    before: dict
    after: dict
    after_emulated: dict
    score_before: Score
    score_after: Score
    share: dict
    rewrites: dict
    writer: dict
    target: str
    objective: str
    seconds: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    near_ties: tuple[NearTie, ...] = ()
    score_label: str = "score"
    pass_mark: tuple[float, bool] = (1.0, False)
    resources: dict = field(default_factory=dict)
    verification: dict = field(default_factory=dict)
    accuracy: dict = field(default_factory=dict)
    engine: str = ""
    range_bound: dict = field(default_factory=dict)
    holdout: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether the fixed model, run by the runner that verified it, meets the objective,
        on the held-out samples too (``verdict``)."""
        return self.verdict == "pass"

    @property
    def verdict(self) -> str:
        """``pass``; ``fail`` (the search samples fail); ``overfits`` (they pass, the held-out
        samples fail: ``holdout``)."""
        if not self.score_after.passed:
            return "fail"
        return "overfits" if self.holdout.get("overfits") else "pass"

    def to_dict(self) -> dict:
        """The JSON report (schema ``precision-doctor/fix``, version 1)."""
        return {
            "schema": "precision-doctor/fix", "schema_version": 1, "tool_version": __version__,
            "verdict": self.verdict, "target": self.target,
            "objective": self.objective, "plan": self.plan.to_dict(),
            "fp32_share": self.share, "before": self.before, "after": self.after,
            "after_emulated": self.after_emulated,
            "score_before": _score_dict(self.score_before),
            "score_after": _score_dict(self.score_after),
            "search": {"evaluations": self.search.evaluations, "kept": list(self.search.kept),
                       "ranking_head": list(self.search.ranking[:20]),
                       "samples_run": sum(t.samples for t in self.search.trials),
                       "trials": [t.__dict__ for t in self.search.trials],
                       "regions": (self.search.regions.to_dict()
                                   if self.search.regions is not None else None)},
            "rewrites": self.rewrites, "writer": self.writer, "seconds": self.seconds,
            "warnings": list(self.warnings), "notes": list(self.notes),
            "near_ties": [t.to_dict() for t in self.near_ties],
            "resources": self.resources, "verification": self.verification,
            "accuracy": self.accuracy,
            "engine": self.engine or None,
            "range_bound": self.range_bound or None,
            "holdout": self.holdout or None,
        }


def _score_dict(s: Score) -> dict:
    return {"passed": s.passed, "value": s.value, "detail": s.detail}
