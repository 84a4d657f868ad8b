"""A rich progress bar that fits the library's ``progress(stage, done, total)`` callbacks."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


@contextmanager
def progress_bar(console: Console, enabled: bool = True
                 ) -> Iterator[Callable[[str, int, int], None] | None]:
    """Yield a ``progress(stage, done, total)`` callback drawing one bar per stage.

    Yields None when ``enabled`` is False (``--quiet`` or a non-terminal console).
    """
    if not enabled:
        yield None
        return
    bars: dict[str, TaskID] = {}
    with Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as prog:
        def update(stage: str, done: int, total: int) -> None:
            if stage not in bars:
                bars[stage] = prog.add_task(stage, total=total)
            prog.update(bars[stage], completed=done, total=total)

        yield update
