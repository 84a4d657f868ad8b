"""``diagnose`` as named stages, each a function from frozen dataclasses to a frozen dataclass.

The pipeline (``diagnosis.diagnose.diagnose`` chains them; ``fix`` has the same shape in
``repair.stages``)::

    DiagnoseRequest
      -> run_reference       Reference   the FP32 reference's outputs (NaN/Inf refused)
      -> run_candidate       CandidateRun the candidate's outputs (live or recorded)
      -> compare             Compared    FP32 noise floor, metrics and verdict per output
      -> read_decisions      Read        decision outputs, their flips, detection heads
      -> localize            Localized   the layerwise comparison (or the recorded one)
      -> find_causes         Causes      the all-FP32 invariant, hazards, transformer headroom,
                                         findings with measured cures, attribution, joint
                                         causes, the largest error jump
      -> assess_stage        Assessed    the rewritten model's emulation and the assessment
      -> build_report        DiagnosisReport
      -> engine_stage        DiagnosisReport with what each engine makes of an out-of-range
                                         constant (``diagnosis.causes.engine_constants``)

Each stage records its own wall time (``timings_s`` keeps the order above).
"""

from precision_doctor.diagnosis.stages.assessing import Assessed, assess_stage
from precision_doctor.diagnosis.stages.causes import Causes, engine_stage, find_causes
from precision_doctor.diagnosis.stages.comparing import Compared, Read, compare, read_decisions
from precision_doctor.diagnosis.stages.localizing import Localized, localize
from precision_doctor.diagnosis.stages.reporting import build_report
from precision_doctor.diagnosis.stages.request import DiagnoseRequest, Progress, SampleLike
from precision_doctor.diagnosis.stages.runs import (
    CandidateRun,
    Reference,
    run_candidate,
    run_reference,
)

__all__ = ["Assessed", "CandidateRun", "Causes", "Compared", "DiagnoseRequest", "Localized",
           "Progress", "Read", "Reference", "SampleLike", "assess_stage", "build_report",
           "compare", "engine_stage", "find_causes", "localize", "read_decisions", "run_candidate",
           "run_reference"]
