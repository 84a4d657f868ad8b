"""Terminal tables that stay readable at any width: a table when it fits, key: value blocks
when it does not.

rich shrinks a table that is wider than the console by cutting cells with ``…`` (its default
``overflow="ellipsis"``): on an 80-column terminal a metric table then prints ``0.00…`` and
headers like ``outp…``. ``MetricTable`` avoids that by construction:

- Each column has a kind. ``num`` and ``tag`` cells (numbers, short words such as ``fail``)
  never wrap and never shrink below their longest cell or header word; ``key`` cells (tensor,
  node and output names) and ``text`` cells (sentences) fold onto more lines instead of being
  cut (``overflow="fold"``).
- At render time (``__rich_console__``, so the width is the one actually available, also inside
  a panel) the table is drawn only if every column fits at its minimum width; otherwise each row
  becomes a block: its key (and tags) on one line, then ``header value`` pairs laid out by
  ``rich.columns.Columns`` as many per line as fit, then the ``text`` cells as wrapped lines.

Nothing is ever cut: the narrow layout degrades to one pair per line below 80 columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich import box
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

Kind = Literal["key", "name", "num", "tag", "text"]
Cell = str | Text
KEY_MIN = 40  # a name column keeps its longest cell up to this width (longer names fold):
# a name folded into a narrow column is the wrapping the list layout exists to avoid
NAME_MIN = 24  # a short-name column (op type) keeps its longest cell up to this width: an op
# type such as DynamicQuantizeLinear folded into 8-character pieces reads worse than blocks
TEXT_MIN = 24  # a sentence column below this is harder to read than a block
_GAP = 2  # between two columns: 1 character of left padding + the box's 1-space divider
# box.SIMPLE_HEAD with an ASCII rule under the header ("-", not U+2500): every line is as many
# bytes as columns, so a log or a pipe measured in bytes sees the same 80 columns
SIMPLE_HEAD_ASCII = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


@dataclass(frozen=True)
class Col:
    """One column.

    Attributes:
        header: Short header (one or two words; a two-word header may wrap, never be cut).
        kind: ``key`` (the row's name: folds), ``name`` (a short name such as an op type:
            folds, shown beside the key in blocks), ``num`` (a number: never wraps or shrinks),
            ``tag`` (a short word: never wraps), ``text`` (a sentence: folds).
        label: The name used in the narrow layout (default: the header).
    """

    header: str
    kind: Kind = "num"
    label: str | None = None

    @property
    def justify(self) -> Literal["left", "right"]:
        return "right" if self.kind == "num" else "left"


def _text(cell: Cell) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)


def _words(cell: Cell) -> int:
    return max((len(w) for w in _text(cell).plain.split()), default=0)


class MetricTable:
    """A rich renderable: a table if it fits the width, else one key: value block per row.

    Args:
        title: Title printed above (left aligned) in both layouts.
        columns: The columns (``Col``); the first ``key`` column names the row in blocks.
        rows: One sequence of cells per row (``str`` is plain text, never rich markup; pass
            ``Text`` for colour).
        caption: Optional line printed under the table (e.g. what abbreviations mean).
        row_styles: Optional style per row (e.g. ``"red"`` for the first divergence).
    """

    def __init__(self, title: str | None, columns: Sequence[Col], rows: Sequence[Sequence[Cell]],
                 caption: str | None = None, row_styles: Sequence[str | None] | None = None):
        self.title = title
        self.columns = tuple(columns)
        self.rows = [tuple(_text(c) for c in r) for r in rows]
        for r in self.rows:
            if len(r) != len(self.columns):
                raise ValueError(f"row has {len(r)} cells for {len(self.columns)} columns")
        self.caption = caption
        self.row_styles = list(row_styles) if row_styles is not None else [None] * len(rows)

    # ------------------------------------------------------------------ widths
    def min_widths(self) -> list[int]:
        """The narrowest each column may be (content only, without padding)."""
        widths = []
        for i, col in enumerate(self.columns):
            cells = [r[i] for r in self.rows]
            header = _words(col.header)
            if col.kind in ("num", "tag"):  # no_wrap: the header stays on one line too
                widths.append(max([Text(col.header).cell_len, *(c.cell_len for c in cells)]))
            elif col.kind in ("key", "name"):
                longest = max((c.cell_len for c in cells), default=0)
                widths.append(max(header, min(KEY_MIN if col.kind == "key" else NAME_MIN,
                                              longest)))
            else:
                widths.append(max(header, TEXT_MIN))
        return widths

    def table_min_width(self) -> int:
        """Columns at their minimum plus the gaps between them (nothing at the edges)."""
        widths = self.min_widths()
        return sum(widths) + _GAP * max(0, len(widths) - 1)

    def fits(self, width: int) -> bool:
        """Whether the table layout fits ``width`` columns without cutting anything."""
        return self.table_min_width() <= width

    # ------------------------------------------------------------------ layouts
    def as_table(self) -> Table:
        """The wide layout (without the title, which ``__rich_console__`` prints above)."""
        table = Table(box=SIMPLE_HEAD_ASCII,
                      show_edge=False, padding=(0, 0, 0, _GAP - 1), pad_edge=False,
                      header_style="bold")
        for col, width in zip(self.columns, self.min_widths()):
            fixed = col.kind in ("num", "tag")
            table.add_column(col.header, justify=col.justify, no_wrap=fixed,
                             overflow="fold", min_width=width if fixed else None)
        for row, style in zip(self.rows, self.row_styles):
            table.add_row(*row, style=style)
        return table

    def as_blocks(self) -> Group:
        """The narrow layout: one block per row."""
        key = next((i for i, c in enumerate(self.columns) if c.kind == "key"), None)
        parts: list[RenderableType] = []
        if self.title:
            parts.append(Text(self.title, style="italic"))
        for row, style in zip(self.rows, self.row_styles):
            head = Text(style=style or "")
            for i, col in enumerate(self.columns):
                if (col.kind in ("tag", "name") or i == key) and row[i].plain:
                    if head.plain:
                        head.append("  ")
                    start = len(head)
                    head.append_text(row[i])
                    if i == key:
                        head.stylize("bold", start, len(head))
            head.overflow = "fold"
            parts.append(head)
            pairs = [Text.assemble((f"{c.label or c.header} ", "dim"), row[i])
                     for i, c in enumerate(self.columns) if c.kind == "num"]
            if pairs:
                parts.append(Padding(Columns(pairs, padding=(0, 3)), (0, 0, 0, 2)))
            for i, c in enumerate(self.columns):
                if c.kind == "text" and row[i].plain:
                    line = Text.assemble((f"{c.label or c.header}: ", "dim"), row[i])
                    line.overflow = "fold"
                    parts.append(Padding(line, (0, 0, 0, 2)))
        if self.caption:
            parts.append(Text(self.caption, style="dim"))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.fits(options.max_width):
            if self.title:  # not Table.title: rich wraps that to the table's own width
                yield Text(self.title, style="italic")
            yield self.as_table()
            if self.caption:
                yield Text(self.caption, style="dim")
        else:
            yield self.as_blocks()


def metric_table(title: str | None, columns: Sequence[Col], rows: Sequence[Sequence[Cell]],
                 caption: str | None = None,
                 row_styles: Sequence[str | None] | None = None) -> MetricTable:
    """Build a ``MetricTable`` (see the class); print it with ``console.print``."""
    return MetricTable(title, columns, rows, caption, row_styles)

