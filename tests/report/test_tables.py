"""Numbers and width-adaptive tables: 3 significant digits, nothing ever cut with an ellipsis."""

from __future__ import annotations

import math
import random

import pytest
from rich.console import Console
from rich.text import Text

from precision_doctor.numbers import WIDTH, fmt3, fmt_share, fmt_vs
from precision_doctor.report.terminal.tables import Col, MetricTable, metric_table


@pytest.mark.parametrize("value, text", [
    (0.0114, "1.14e-02"), (0.0595, "5.95e-02"), (0.999, "0.999"), (24.5, "24.5"),
    (145.0, "145"), (6.0, "6.00"), (0.5, "0.500"), (9.79e7, "9.79e+07"), (-3.2e-9, "-3.20e-09"),
    (0.09996, "0.100"), (999.6, "1.00e+03"), (0.0, "0"), (1, "1.00"), (None, "-"),
    (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), (True, "yes")])
def test_fmt3(value, text):
    assert fmt3(value) == text


def test_fmt3_is_never_wider_than_width_and_keeps_3_digits():
    rng = random.Random(0)
    for _ in range(5000):
        v = rng.choice([-1, 1]) * 10 ** rng.uniform(-40, 40)
        s = fmt3(v)
        assert len(s) <= WIDTH, s
        assert math.isclose(float(s), v, rel_tol=5e-3), (v, s)


def test_fmt_vs_keeps_the_side_of_the_threshold():
    assert fmt_vs(0.9954, 0.99) == "0.995"
    assert fmt_vs(0.98996, 0.99) == "0.98996"  # 3 digits would print 0.990, a pass
    assert float(fmt_vs(1.00004, 1.0, higher_is_better=False)) > 1.0
    assert fmt_vs(0.0, 0.99) == "0" and fmt_vs(None, 0.99) == "-"
    assert fmt_share(0.0213) == "2%" and fmt_share(None) == "-"


def _render(renderable, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.export_text()


def _random_table(rng: random.Random) -> tuple[MetricTable, list[str]]:
    kinds = [rng.choice(["key", "name", "num", "num", "tag", "text"]) for _ in
             range(rng.randint(2, 10))]
    headers = ["#", "rel L2", "max abs", "x noise", "op", "evidence", "NaN/Inf", "1-cos"]
    cols = [Col(f"{rng.choice(headers)}{i}", k) for i, k in enumerate(kinds)]
    rows, fixed = [], []
    for _ in range(rng.randint(1, 5)):
        row = []
        for k in kinds:
            if k == "num":
                row.append(fmt3(rng.choice([-1, 1]) * 10 ** rng.uniform(-9, 9)))
            elif k == "tag":
                row.append(rng.choice(["fail", "pass", "#12"]))
            elif k == "text":
                row.append(" ".join("w" * rng.randint(1, 9) for _ in range(rng.randint(1, 30))))
            else:
                row.append("n" * rng.randint(1, 40))
        fixed += [c for k, c in zip(kinds, row) if k in ("num", "tag")]
        rows.append(row)
    return MetricTable("t", cols, rows), fixed


def test_random_tables_never_cut_a_number_at_any_width():
    rng = random.Random(1)
    for _ in range(40):
        table, fixed = _random_table(rng)
        need = table.table_min_width()
        for width in sorted({max(20, need - 1), need, need + 5, 40, 80, 160}):
            out = _render(table, width)
            assert "…" not in out
            assert all(len(line.rstrip()) <= width for line in out.splitlines())
            for cell in fixed:
                assert cell in out, (cell, width, out)
            for col in table.columns:
                if col.kind in ("num", "tag") and table.fits(width):
                    assert col.header in out  # a header is never cut either


def test_table_when_it_fits_blocks_when_it_does_not():
    cols = [Col("output", "key"), Col("verdict", "tag"), Col("rel L2"), Col("max abs"),
            Col("x noise", label="x noise floor")]
    table = metric_table("Outputs", cols, [["softmax_11.tmp_0", Text("fail", style="red"),
                                            fmt3(0.0595), fmt3(0.999), fmt3(1.06e5)]],
                         caption="rel L2 = |c - r| / |r|")
    wide = _render(table, 100)
    assert "rel L2" in wide.splitlines()[1] and "5.95e-02" in wide
    narrow = _render(table, 30)
    assert "softmax_11.tmp_0  fail" in narrow and "x noise floor 1.06e+05" in narrow
    assert "…" not in wide + narrow and "rel L2 = |c - r| / |r|" in narrow


def test_row_length_must_match_the_columns():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        MetricTable(None, [Col("a"), Col("b"), Col("c")], [["1", "2"]])
