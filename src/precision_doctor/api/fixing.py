"""``fix``: a verified, strongly typed mixed-precision model, held in memory until saved."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx

from precision_doctor.api.device import choose_device
from precision_doctor.api.options import (
    DataLike,
    ModuleLike,
    Progress,
    ToleranceLike,
    as_model,
    as_samples,
    build_objective,
    labelled_objective,
    parse_precision,
    progress_reporter,
)
from precision_doctor.api.pytorch import module_input
from precision_doctor.api.pytorch_recipe import torch_report
from precision_doctor.api.results import json_text
from precision_doctor.errors import InputError
from precision_doctor.formats import Precision
from precision_doctor.graph.load import input_metadata
from precision_doctor.graph.source import sources as node_sources
from precision_doctor.graph.upcast import upcast
from precision_doctor.inputs import PreprocessSpec, Sample
from precision_doctor.jsonable import dumps
from precision_doctor.precision.plan import PrecisionPlan
from precision_doctor.repair.holdout import split_holdout
from precision_doctor.repair.pipeline import fix as fix_model
from precision_doctor.repair.result import FixResult
from precision_doctor.report.files import (
    check_writable,
    model_files,
    write_model,
    write_text_atomic,
)
from precision_doctor.report.notebook import fix_summary
from precision_doctor.runners.device import use as use_device
from precision_doctor.runners.kernels.engines import engine_of_runner, parse_engine
from precision_doctor.runners.kernels.registry import refuse_cpu_bf16
from precision_doctor.runners.ort import OrtFactory
from precision_doctor.runners.ort_options import ort_providers
from precision_doctor.runners.sessions import switched
from precision_doctor.search.evalpool import resolve_jobs


def sidecar_paths(output: str | os.PathLike) -> dict[str, Path]:
    """Files written next to the fixed model: plan, recipes, JSON report, and the rewritten
    FP32 model (the base of the weakly typed TensorRT route: its node names are the plan's)."""
    stem = Path(output).with_suffix("")
    return {"plan": Path(f"{stem}.plan.json"), "recipes": Path(f"{stem}.recipes.md"),
            "report": Path(f"{stem}.report.json"),
            "rewritten": Path(f"{stem}.rewritten-fp32.onnx")}


@dataclass(frozen=True)
class Fix:
    """What ``fix`` produced; nothing is on disk until :meth:`save`.

    Attributes:
        model: The strongly typed mixed-precision model (explicit Casts at precision
            boundaries); None for a ``Fix`` rebuilt from JSON without it.
        plan: Every node kept in FP32, with the reason (``user``, ``hazard``, ``search``).
        report: The JSON report: verdict, objective, ``before``/``after`` errors per output
            (relative L2 vs the FP32 reference; ``after`` = the written model on the runner
            that verified it, named with the reason in ``verification``), ``fp32_share``
            (nodes, FLOPs, parameters), search trials, rewrites, writer details, warnings.
            ``model.input`` is the source path when known; :meth:`save` records the output
            path and the engine recipes here.
        rewritten: The FP32 model after the numerically safe rewrites (BatchNorm folding,
            LayerNorm fusion); the plan's node names are its names.
        result: The in-memory ``FixResult`` (search trials, scores); None from JSON.
        samples: The calibration samples (for the recipes' shapes and the HTML report).
        source: The FP32 input model (the reference of the HTML report).
    """

    model: onnx.ModelProto | None
    plan: PrecisionPlan
    report: dict[str, Any]
    rewritten: onnx.ModelProto | None = field(default=None, repr=False)
    result: FixResult | None = field(default=None, repr=False, compare=False)
    samples: tuple[Sample, ...] = field(default=(), repr=False, compare=False)
    source: onnx.ModelProto | None = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """Whether the written model meets the target on the runner that verified it."""
        return self.report.get("verdict") == "pass"

    @property
    def verdict(self) -> str:
        """``"pass"`` or ``"fail"``."""
        return str(self.report.get("verdict"))

    @property
    def fp32_nodes(self) -> list[str]:
        """Names of the nodes the plan keeps in FP32 (of ``rewritten``), sorted."""
        return sorted(self.plan.overrides)

    def to_dict(self) -> dict:
        """The JSON report (see ``report``); ``from_dict`` reads it back."""
        return dict(self.report)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], model: onnx.ModelProto | None = None,
                  rewritten: onnx.ModelProto | None = None) -> Fix:
        """A ``Fix`` from its JSON report (and optionally the fixed and rewritten models).

        Raises:
            ValueError: Not a precision-doctor fix report.
            PlanError: A malformed plan.
        """
        if data.get("schema") != "precision-doctor/fix":
            raise ValueError(f"not a precision-doctor fix report (schema={data.get('schema')!r})")
        return cls(model, PrecisionPlan.from_dict(data["plan"]), dict(data), rewritten)

    def to_json(self, path: str | os.PathLike | None = None, *, force: bool = False) -> str:
        """The stable JSON text of the report; also written to ``path`` when given.

        Raises:
            OutputPathError: The folder of ``path`` is missing or not writable, or it is a
                folder.
            OutputExistsError: ``path`` exists and ``force`` is False.
        """
        return json_text(self.to_dict(), path, force)

    def save(self, path: str | os.PathLike, *, force: bool = False,
             extra_recipes: str = "") -> dict[str, Path]:
        """Write the fixed model to ``path`` and, next to it, ``*.plan.json``,
        ``*.recipes.md`` (trtexec, Polygraphy and ONNX Runtime commands), ``*.report.json``
        and ``*.rewritten-fp32.onnx``; for a ``torch.nn.Module``, ``*.torch.py`` too (the
        hooks that keep the fix's FP32 modules in float32 under ``torch.autocast``). Every
        file is written atomically; all are checked before the first is written.

        Args:
            path: The ``.onnx`` file to write.
            force: Overwrite existing files.
            extra_recipes: Markdown appended to ``*.recipes.md`` (the CLI adds the TensorRT
                collect section, which needs the ``--data`` text).

        Returns:
            What was written: ``{"model", "plan", "recipes", "report", "rewritten"}`` (and
            ``"torch"``) -> path.

        Raises:
            OutputPathError: A file cannot be written: its folder is missing or not
                writable, or it is a folder (nothing written).
            OutputExistsError: A file exists and ``force`` is False (nothing written).
            InputError: ``path`` is the source model (never overwritten), or no model is held.
        """
        if self.model is None or self.rewritten is None:
            raise InputError("this Fix holds no model (rebuilt from JSON): nothing to save")
        output = Path(path)
        side = sidecar_paths(output)
        if "torch" in self.report:  # a module's autocast recipe (api.pytorch_recipe)
            side["torch"] = Path(f"{output.with_suffix('')}.torch.py")
        source = (self.report.get("model") or {}).get("input")
        if source and output.resolve() == Path(source).resolve():
            raise InputError(f"{output} is the input model: precision-doctor never overwrites "
                             "your model; choose another path", file=str(output))
        check_writable([*model_files(output, self.model), *side.values(),
                        *model_files(side["rewritten"], self.rewritten)], force)
        report = dict(self.report)
        report["model"] = {**(self.report.get("model") or {}), "input": source,
                           "output": str(output)}
        recipes_md = self._recipes(report, output, side) + extra_recipes
        write_model(output, self.model, force)  # + <name>.data with external data
        write_model(side["rewritten"], self.rewritten, force)
        write_text_atomic(side["plan"], dumps(self.plan.to_dict()), force)
        write_text_atomic(side["recipes"], recipes_md, force)
        write_text_atomic(side["report"], dumps(report), force)
        if "torch" in side:
            write_text_atomic(side["torch"], str(self.report["torch"]["snippet"]), force)
        self.report.update(model=report["model"], recipes=report["recipes"])
        return {"model": output, **side}

    def _recipes(self, report: dict, output: Path, side: dict[str, Path]) -> str:
        """Engine recipes as markdown; also stored in ``report["recipes"]``."""
        from precision_doctor.report.recipes import build_recipes

        shapes: dict[str, list[list[int]]] = {}
        for s in self.samples:
            for k, v in s.feeds.items():
                shapes.setdefault(k, []).append(list(v.shape))
        assert self.rewritten is not None
        dynamic = any(m.is_dynamic() for m in input_metadata(self.rewritten))
        recipes = build_recipes(fixed_model=str(output), original_model=str(side["rewritten"]),
                                plan=self.plan, target=Precision.parse(str(report["target"])),
                                tf32=False, input_shapes=shapes, dynamic=dynamic,
                                plan_json=str(side["plan"]))
        report["recipes"] = recipes.to_dict()
        return recipes.render_markdown()

    def to_html(self, path: str | os.PathLike | None = None, *, force: bool = False,
                command: str | None = None) -> str:
        """The HTML report: a diagnosis of the fixed model (on the runner that verified it)
        against the FP32 reference on the calibration samples, with the before/after table,
        the verifying runner, plan and recipes.

        Runs the fixed model and the reference once more on the samples.

        Raises:
            InputError: The ``Fix`` was rebuilt from JSON (no model or samples to diagnose).
            OutputPathError: The folder of ``path`` is missing or not writable, or it is a
                folder.
            OutputExistsError: ``path`` exists and ``force`` is False.
        """
        if self.model is None or self.result is None or self.source is None or not self.samples:
            raise InputError("the fix HTML report diagnoses the fixed model on its calibration "
                             "samples; a Fix rebuilt from JSON has neither")
        from precision_doctor.api.fix_page import fix_html

        page = fix_html(self, command)
        if path is not None:
            write_text_atomic(path, page, force)
        return page

    def _repr_html_(self) -> str:
        return fix_summary(self.report)


def fix(model: ModuleLike, data: DataLike, *, target: str = "fp16",
        preprocess: PreprocessSpec | str | None = None,
        tolerance: ToleranceLike = None, metric: str | None = None,
        threshold: float | None = None, keep: Sequence[str] = (),
        force_low: Sequence[str] = (), rewrites: bool = True, keep_io_types: bool = True,
        runner: str = "emulate", max_samples: int | None = None, max_evals: int = 150,
        progress: Progress | None = None, quiet: bool = False, jobs: int | str = 1,
        device: str = "auto", labels: str | os.PathLike | None = None,
        engine: str | None = None, holdout: int | None = None) -> Fix:
    """Find the fewest nodes to keep in FP32 so that the model meets an accuracy target in
    FP16/BF16, and build that strongly typed mixed-precision model (in memory).

    Steps: numerically safe rewrites (BatchNorm folded in float64, decomposed LayerNorm fused,
    bias Adds folded); nodes ranked by measured sensitivity, bisection and delta debugging
    (O(k log N) evaluations, each on all samples); the model written with Casts at precision
    boundaries only, validated (``onnx.checker``, shape inference, an ONNX Runtime session)
    and verified against the FP32 reference: with ``runner`` when given; otherwise with ONNX
    Runtime CPU, or for a BF16 model with ONNX Runtime CUDA when present, else by emulating the
    written model exactly (ONNX Runtime CPU has no BF16 Conv/MatMul kernels).
    ``report["verification"]`` names the runner and why.

    Args:
        model: The FP32 model: a ``.onnx`` path, an ``onnx.ModelProto`` (not modified) or an
            ``onnx_ir.Model``, or a ``torch.nn.Module`` with its samples as ``data`` (as for
            :func:`diagnose`). A model shipped in FP16/BF16 is fixed from its exact FP32
            upcast (``graph.upcast``; ``report["model"]["shipped_precision"]`` says so): the
            written model then has FP32 inputs and outputs, or ``target``'s with
            ``keep_io_types=False``.
        data: Calibration samples, as for :func:`diagnose` (paths, feed dicts or arrays).
        target: ``"fp16"`` or ``"bf16"``.
        preprocess: Image preprocessing, as for :func:`diagnose`.
        tolerance: Output tolerance target (as for :func:`diagnose`); default relative L2
            <= 1e-2 (FP16) / 8e-2 (BF16) on every output. Ignored with ``metric``.
        metric: Task metric target instead: ``top1``, ``top5``, ``mask-iou:threshold=0.3``,
            ``db-boxes``, ``box-match``, ``box-map``, ``ctc-string``, ``ctc-char``, ``psnr``,
            ``ssim`` or ``module:function`` (``fn(reference, candidate) -> float``).
        threshold: Pass mark of ``metric``, met on every sample (default: the metric's own).
        keep: Node names or op types forced to FP32.
        force_low: Node names or op types the search must leave in low precision.
        rewrites: Apply the numerically safe rewrites first.
        keep_io_types: Keep graph inputs and outputs FP32 (Casts inside the model), also for
            a model shipped with FP16/BF16 inputs and outputs.
        runner: Evaluate candidates with ``"emulate"`` (CPU emulation) or a real engine,
            ``"ort:cpu"``, ``"ort:cuda,tf32=0"`` (decision metrics at exact thresholds depend on
            the engine's rounding: search with the engine you deploy on); the written model is
            then verified with it too. ``"ort:cpu"`` with ``target="bf16"`` is refused (ONNX
            Runtime CPU has no BF16 Conv/MatMul kernels).
        max_samples: Use the first N samples.
        max_evals: Search budget in evaluations (a warning says when it was used up).
        progress: ``progress(stage, done, total)`` callback; default: a rich bar on a terminal.
        quiet: No progress output at all.
        jobs: Evaluate samples in this many processes (one ONNX Runtime session each; a
            process pool forked per search), or ``"auto"`` (cores / ORT threads). Results are
            identical for any value; it pays when the machine has cores to spare. On CUDA
            (``device``), N > 1 starts one worker process per visible GPU; ``"auto"`` is 1
            there (the pool was measured slower, ``search.evalpool.resolve_jobs``).
        device: Where the reference, the emulated search evaluations and the verification
            run: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (the first CUDA device
            when ``onnxruntime-gpu`` and a GPU are present and the workload pays for starting
            CUDA, else the CPU: ``api.device``); recorded in ``report["device"]``, with a
            ``note`` when ``auto`` kept the CPU.
        labels: Ground truth (COCO JSON for detection, ``file,class`` CSV for
            classification, matched to image samples by file name): the report's
            ``accuracy`` gives the task accuracy of the FP32 model, the naive low precision
            model and the fixed one (e.g. COCO mAP 70.7 -> 66.1 -> 70.6), and the
            ``coco-map-drop`` / ``accuracy-drop`` metrics can target the accuracy lost.
        engine: The engine you deploy on: ``"ort-cuda"`` (ONNX Runtime CUDA) keeps FP32 the
            nodes it has no kernel for in ``target`` (BF16: GlobalAveragePool, MaxPool, ...;
            ``runners.kernels.engines.CUDA_NO_BF16``, measured), so the written model loads
            there; reason ``engine`` in the plan, named in ``report["verification"]``.
            Default: ``"ort-cuda"`` when ``runner`` is ``ort:cuda...``, else none (a model for
            an engine with every kernel, such as TensorRT ``--stronglyTyped``).
        holdout: Keep this many samples out of the search and score the written model on
            them afterwards (``report["holdout"]``: samples, score, passed; the verdict is
            ``"overfits"`` when the plan passes the search samples and fails these). None:
            one in 10 from 8 samples up, none below (``repair.holdout.default_holdout``);
            0: no check. The choice is seeded by the samples' names.

    Returns:
        :class:`Fix`: ``.model`` (``onnx.ModelProto``), ``.plan``, ``.passed``, ``.report``
        (before/after errors, FP32 share; ``fp32_sources``: FP32 node -> its Python line and
        module when the model carries the exporter's metadata, else None; for a module,
        ``torch``: ``api.pytorch_recipe``).

    Raises:
        TargetNotMetError: Not even all-FP32 meets the target.
        PlanError: ``target`` is not FP16/BF16, ``keep``/``force_low`` name nothing, or
            ``engine`` is not a known engine.
        InputError: ``holdout`` is negative or leaves no sample for the search.
        MetricError: Unknown metric, a metric without a default and no ``threshold``; a
            labels metric (``coco-map-drop``) without ``labels``; pycocotools missing.
        ModelLoadError, InputError, BackendError: As for :func:`diagnose`; InputError also
            when ``jobs`` is neither a positive integer nor ``"auto"``.
        BackendUnavailable: ``runner="ort:cpu"`` with ``target="bf16"`` (the message says
            what to use instead).
    """
    precision = parse_precision(target)
    engine = engine if engine is not None else engine_of_runner(runner)
    parse_engine(engine)  # an unknown engine fails before the model is read
    torch_module, torch_samples = model, data  # for the PyTorch recipe below
    model, data, exported = module_input(model, data, max_samples)
    proto, path = as_model(model)
    proto, shipped = upcast(proto)  # a model shipped in FP16/BF16: searched on its FP32 upcast
    given = as_samples(data, proto, preprocess, max_samples)
    split = split_holdout(given, holdout)
    samples = list(split.search)  # the held-out ones are run only after writing
    base = build_objective(tolerance, metric, threshold, precision)
    objective, accuracy = labelled_objective(base, proto, samples, labels)
    held_objective = split.held_objective(
        labelled_objective(base, proto, given, labels)[0] if split.held and labels else base)
    where, device_note = choose_device(device, proto, samples)
    workers = resolve_jobs(jobs, len(samples), where)
    factory = None
    if precision is Precision.BF16:
        refuse_cpu_bf16(runner, proto, command="fix")
    if runner != "emulate":
        providers, options = ort_providers(runner)
        factory = OrtFactory(tuple(providers), tuple(options), runner)

    with progress_reporter(progress, quiet) as callback, use_device(where), switched.sessions():
        result = fix_model(proto, samples, precision, objective, keep, force_low,
                           None if rewrites else [], keep_io_types, factory, max_evals,
                           callback, workers, accuracy, engine or None, split,
                           held_objective)
    report = result.to_dict()
    report["model"] = {"input": path, "output": None, **(exported or {}),
                       **(shipped.model_info() if shipped is not None else {})}
    report["device"] = where.to_dict()
    if device_note:
        report["device"]["note"] = device_note
    known = node_sources(result.rewritten)  # the FP32 nodes' Python lines (graph.source)
    report["fp32_sources"] = {n: known[n].to_dict() for n in result.plan.fp32_nodes()
                              if n in known} or None
    if exported:  # its FP32 modules under torch.autocast, measured (api.pytorch_recipe)
        report["torch"] = torch_report(torch_module, torch_samples, max_samples, result,
                                       objective, proto)
    return Fix(result.model, result.plan, report, result.rewritten, result, tuple(samples),
               proto)
