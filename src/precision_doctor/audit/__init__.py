"""Engine precision audit: read TensorRT layer information (``trtexec --exportLayerInfo
--profilingVerbosity=detailed`` / IEngineInspector, TensorRT 8.x, 8.6 and 10.x), say which
precision every layer actually ran in and why we think so, map layers back to ONNX nodes,
flag FP32 requests that fusion did not honor, TF32 tactics, sensitive ops in FP16 and
precision-converting reformats, and compare two builds of the same model.

    report = audit_engine("layers.json", profile_path="profile.json", onnx_model="model.onnx",
                          expect_fp32=["*LayerNorm*"])
    render_audit(report, rich.console.Console())   # from precision_doctor.report.terminal.audit
    diff = compare_builds(report_fp32, report_fp16)
    log = read_build_log("build.log", onnx_model="model.onnx")  # trtexec/Polygraphy --verbose
"""

from precision_doctor.audit.buildlog import BuildLog, LogEntry, link_to_audit, read_build_log
from precision_doctor.audit.diff import BuildDiff, LayerChange, compare_builds
from precision_doctor.audit.engine_audit import audit_engine, precision_summary
from precision_doctor.audit.layers import LayerInfo, parse_layer_info
from precision_doctor.audit.precision import infer_precision, parse_format, tf32_tactic
from precision_doctor.audit.profile import LayerTime, Profile, attach_profile, read_profile
from precision_doctor.audit.records import (
    AuditFinding,
    AuditReport,
    EngineLayer,
    Fp32Check,
    FusedRegion,
    SensitiveNode,
    TensorInfo,
)

__all__ = [
    "AuditFinding", "AuditReport", "BuildDiff", "BuildLog", "LogEntry", "link_to_audit",
    "read_build_log", "EngineLayer", "Fp32Check", "FusedRegion",
    "LayerChange", "LayerInfo", "LayerTime", "Profile", "SensitiveNode", "TensorInfo",
    "attach_profile", "audit_engine", "compare_builds", "infer_precision", "parse_format",
    "parse_layer_info", "precision_summary", "read_profile", "tf32_tactic",
]
