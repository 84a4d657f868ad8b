from precision_doctor.diagnosis.causes.findings import build_findings
from precision_doctor.formats import Precision
from precision_doctor.layerwise.compare import LayerRecord, LayerwiseResult


def test_one_finding_per_node_keeps_the_strongest_cause():
    # peaks 1.5 bits below the FP16 max (headroom) and flushes 5% of its values (underflow)
    r = LayerRecord("t", "n_t", "Mul", 0, 100, 23000.0, 23000.0, 1.0, 0.1, 0.05, 0, 0, 0, 0,
                    5, 0, 5, 1.5)
    lw = LayerwiseResult("fp16", 1e-2, (r,), "t", None, 1)
    (f,) = build_findings([], lw, Precision.FP16, True, {})
    assert f.kind == "underflow" and f.evidence["also"] == "headroom"
