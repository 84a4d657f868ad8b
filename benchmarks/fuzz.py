"""The graph fuzzer's long run: the invariants of ``tests/fuzz/test_invariants.py`` on many
random graphs.

The test file runs a fixed, derandomized budget within 60 s; this script runs the same checks
(``check_fp32_plan``, ``check_writer``, ``check_fix``, ``check_diagnose``, ``check_lengths``)
with a large budget
and a seed, and prints every failure hypothesis found, shrunk to its smallest graph (printed
as ONNX text). A failure found here becomes a named regression test in
``tests/fuzz/test_regressions.py``.

Usage (repository root)::

    python -m benchmarks run fuzz [--seed 0] [--examples 500] [--slow-examples 50]
                                  [--only fp32_plan,writer,fix,fix_bf16,diagnose,lengths]
                                  [--known]
                                  [--max-pieces N]

``--known`` also draws the pieces that trigger the open bugs (``OPEN_BUGS`` of the test file,
left out by default so that a run finds new bugs) and fails on the checks of open bugs
(``OPEN_CHECKS``, counted otherwise).

Exit status: 0 when every property held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))

import test_invariants  # noqa: E402
from graphs import cases  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_invariants import (  # noqa: E402
    EVENTS,
    OPEN_BUGS,
    check_diagnose,
    check_fix,
    check_fp32_plan,
    check_lengths,
    check_writer,
    random_plan,
)


def _writer(avoid: frozenset[str]):
    def check(data) -> None:
        case = data.draw(cases(avoid=avoid))
        check_writer(case, random_plan(data.draw, case.model))
    return check


# name -> (graphs' max pieces or None for the writer's own draw, check, slow: small budget)
PROPERTIES = {
    "fp32_plan": (3, check_fp32_plan, False),
    "writer": (None, None, False),
    "fix": (2, lambda case: check_fix(case, "fp16"), True),
    "fix_bf16": (2, lambda case: check_fix(case, "bf16"), True),
    "diagnose": (2, check_diagnose, True),
    "lengths": (3, check_lengths, True),  # graphs with integer decisions (LENGTH_PIECES)
}
LENGTH_PIECES = ("decision", "decision", "linear", "elementwise", "layernorm")


def run_property(name: str, examples: int, at_seed: int, known: bool,
                 max_pieces: int | None = None) -> str | None:
    """Run one property; the failure report (hypothesis's, shrunk) or None.

    ``known``: also draw the pieces that trigger the open bugs (``OPEN_BUGS``).
    """
    pieces, check, _ = PROPERTIES[name]
    if pieces is not None and max_pieces is not None:
        pieces = max_pieces
    avoid = frozenset() if known else OPEN_BUGS.get(name.removesuffix("_bf16"), frozenset())
    drawn = {"pieces": LENGTH_PIECES} if name == "lengths" else {}
    strategy = st.data() if pieces is None else cases(max_pieces=pieces, avoid=avoid, **drawn)
    check = _writer(avoid) if check is None else check
    test = seed(at_seed)(settings(max_examples=examples, deadline=None, database=None,
                                  suppress_health_check=list(HealthCheck),
                                  print_blob=True)(given(strategy)(check)))
    try:
        test()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the next
        if isinstance(exc, KeyboardInterrupt):
            raise
        return "".join(traceback.format_exception(exc))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", type=int, default=500,
                        help="examples of the fast properties (fp32_plan, writer)")
    parser.add_argument("--slow-examples", type=int, default=50,
                        help="examples of the properties that run diagnose or fix")
    parser.add_argument("--max-pieces", type=int, default=None,
                        help="pieces per graph of fp32_plan, fix and diagnose (default 3, 2, 2)")
    parser.add_argument("--known", action="store_true",
                        help="also draw what triggers the open bugs (OPEN_BUGS)")
    parser.add_argument("--only", default=",".join(PROPERTIES),
                        help="comma-separated properties: " + ", ".join(PROPERTIES))
    args = parser.parse_args(argv)
    test_invariants.KNOWN = args.known
    failed = 0
    for name in args.only.split(","):
        examples = args.slow_examples if PROPERTIES[name][2] else args.examples
        t0 = time.perf_counter()
        report = run_property(name, examples, args.seed, args.known, args.max_pieces)
        status = "ok" if report is None else "FAILED"
        print(f"{name}: {status} ({examples} examples, seed {args.seed}, "
              f"{time.perf_counter() - t0:.1f} s)", flush=True)
        for what, count in sorted(EVENTS.items()):
            print(f"  {count:5d}  {what}")
        EVENTS.clear()
        if report is not None:
            failed += 1
            print(report, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
