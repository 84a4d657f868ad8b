"""Keep chosen submodules of a ``torch.nn.Module`` in float32 under ``torch.autocast``.

A module path pattern names submodules as ``named_modules()`` does (``encoder.layer.3.output``),
with ``*`` standing for any one path component (``encoder.layer.*.output.LayerNorm``) and
``""`` for the top-level module. Each matching module gets a forward pre-hook that disables
autocast and casts its floating inputs (float16/bfloat16) to float32, and a forward hook that
restores autocast (run also when ``forward`` raises). Its submodules run inside that scope,
so they are in float32 too. The hooks are removed when the context ends.

The pattern functions need no torch; torch is imported when the hooks are installed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from precision_doctor.errors import BackendUnavailable, InputError
from precision_doctor.graph.torch_export import import_torch as graph_import_torch

AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


def import_torch() -> Any:
    """``torch``, or ``BackendUnavailable`` with the install hint.

    Raises:
        BackendUnavailable: torch is not installed.
    """
    return graph_import_torch("torch.autocast", BackendUnavailable)


def matches(name: str, pattern: str) -> bool:
    """Whether the module path ``name`` is ``pattern`` (``*``: any one component; ``""``: only
    the top-level module)."""
    want, have = pattern.split(".") if pattern else [], name.split(".") if name else []
    return len(want) == len(have) and all(w in ("*", h) for w, h in zip(want, have))


def within(name: str, pattern: str) -> bool:
    """Whether the module path ``name`` is ``pattern`` or inside a module it matches."""
    want, have = pattern.split(".") if pattern else [], name.split(".") if name else []
    return len(have) >= len(want) and all(w in ("*", h) for w, h in zip(want, have))


def outermost(patterns: Iterable[str]) -> list[str]:
    """The patterns not inside another one (``["var.proj", "var"]`` -> ``["var"]``), in order,
    without repeats: keeping ``var`` in float32 keeps everything it calls in float32."""
    given = list(dict.fromkeys(patterns))
    return [p for p in given if not any(q != p and within(p, q) for q in given)]


def matching_modules(module: Any, patterns: Iterable[str]) -> list[tuple[str, Any]]:
    """The submodules ``(path, module)`` of ``module`` that any pattern matches, in
    ``named_modules()`` order.

    Raises:
        InputError: A pattern matches no submodule (the message lists some that exist).
    """
    named = list(module.named_modules())
    wanted = list(patterns)
    for pattern in wanted:
        if not any(matches(name, pattern) for name, _ in named):
            known = ", ".join(repr(n) for n, _ in named[:8])
            raise InputError(f"no submodule of {type(module).__name__} is {pattern!r} "
                             f"(its modules: {known}{' ...' if len(named) > 8 else ''})",
                             module=pattern)
    return [(name, sub) for name, sub in named if any(matches(name, p) for p in wanted)]


def _to_float32(torch: Any, value: Any) -> Any:
    """float16/bfloat16 tensors of a nested structure as float32; everything else as given."""
    low = (torch.float16, torch.bfloat16)
    return torch.utils._pytree.tree_map(
        lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype in low else v, value)


@contextmanager
def keep_fp32(module: Any, patterns: Iterable[str]) -> Iterator[list[str]]:
    """Install the float32 hooks on the submodules ``patterns`` match, for the ``with`` block.

    Outside ``torch.autocast`` the hooks change nothing but the dtype of float16/bfloat16
    inputs of those modules.

    Args:
        module: A ``torch.nn.Module``.
        patterns: Module path patterns (``*``: one component; ``""``: the top-level module).

    Yields:
        The paths of the hooked submodules.

    Raises:
        BackendUnavailable: torch is not installed.
        InputError: A pattern matches no submodule.
    """
    torch = import_torch()
    targets = matching_modules(module, outermost(patterns))
    handles = []

    def install(sub: Any) -> None:
        scopes: list[list[Any]] = []  # one entry per call in progress (recursion included)

        def before(_: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            off = [torch.autocast(d, enabled=False) for d in AUTOCAST_DEVICES
                   if torch.is_autocast_enabled(d)]
            for scope in off:
                scope.__enter__()
            scopes.append(off)
            return _to_float32(torch, args), _to_float32(torch, kwargs)

        def after(*_: Any) -> None:
            for scope in reversed(scopes.pop()):
                scope.__exit__(None, None, None)

        handles.append(sub.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(sub.register_forward_hook(after, always_call=True))

    try:
        for _, sub in targets:
            install(sub)
        yield [name for name, _ in targets]
    finally:
        for handle in handles:
            handle.remove()
