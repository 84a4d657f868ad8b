"""The public API: ``diagnose``, ``fix``, ``diagnose_quantized``, ``fix_quantized`` (INT8/FP8),
``audit``, ``compare_inputs`` and their results; ``export_module``, ``sources``,
``torch_recipe`` and ``compare_autocast`` for a PyTorch module.

Re-exported at the package root (``precision_doctor.diagnose`` ...). The CLI and the workflows
are thin layers over these functions.
"""

import precision_doctor
from precision_doctor.api.autocast import AutocastComparison, compare_autocast
from precision_doctor.api.checks import audit, compare_inputs
from precision_doctor.api.diagnosing import diagnose
from precision_doctor.api.fixing import Fix, fix
from precision_doctor.api.options import DataLike, ModelLike, ModuleLike, Progress, ToleranceLike
from precision_doctor.api.pytorch import export_module, sources
from precision_doctor.api.pytorch_recipe import TorchRecipe, torch_recipe
from precision_doctor.api.quantizing import (
    QuantizedDiagnosis,
    QuantizedFix,
    diagnose_quantized,
    fix_quantized,
)
from precision_doctor.api.results import Audit, Diagnosis, InputComparison

# ``precision_doctor.audit`` is a subpackage and the public function: loading the subpackage
# binds the module as ``precision_doctor.audit``; the root's public name is the function.
precision_doctor.audit = audit

__all__ = [
    "Audit", "AutocastComparison", "DataLike", "Diagnosis", "Fix", "InputComparison",
    "ModelLike", "ModuleLike", "Progress", "QuantizedDiagnosis", "QuantizedFix", "ToleranceLike",
    "TorchRecipe", "audit", "compare_autocast", "compare_inputs", "diagnose",
    "diagnose_quantized", "export_module", "fix", "fix_quantized", "sources", "torch_recipe",
]
