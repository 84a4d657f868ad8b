"""The public functions that take a ``torch.nn.Module`` say so in their type hints
(``ModuleLike``), without importing torch at runtime
(``tests/graph/test_torch_export.py`` checks the import)."""

from __future__ import annotations

import inspect
import typing

import precision_doctor as pd
from precision_doctor import api
from precision_doctor.api import options


def test_module_taking_functions_name_torch_in_their_hints() -> None:
    for fn in (pd.diagnose, pd.diagnose_quantized, pd.fix_quantized):
        assert inspect.signature(fn).parameters["model"].annotation == "ModuleLike", fn
    for fn in (pd.compare_autocast, api.export_module):
        assert inspect.signature(fn).parameters["module"].annotation == "torch.nn.Module"
    args = typing.get_args(options.ModuleLike)
    assert typing.ForwardRef("torch.nn.Module") in args
    assert set(typing.get_args(options.ModelLike)) <= set(args)
