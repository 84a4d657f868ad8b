"""The benchmark suite and BENCHMARKS.md stay what they promise: one entry point over scripts that
exist, a BENCHMARKS.md of at most 400 lines whose results files exist, and no file of the project
that cites development sessions or issue numbers instead of dates, scripts and results files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
RESULTS = BENCH / "results"

# the word session(s) or issue(s) before a whole number, as a lab journal numbers them; an
# external tracker's numbered issue (with "#") is a citation, and "session 0.2 s" a duration
_DEV_REFERENCE = re.compile(r"\b(sess" r"ions?|iss" r"ues?) \d+\b(?![.,]\d)", re.IGNORECASE)
_TEXT_SUFFIXES = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".html", ".j2", ".cfg", ".txt"}


def _suite() -> dict:
    sys.path.insert(0, str(REPO))
    try:
        from benchmarks.__main__ import BENCHMARKS, HELPERS
    finally:
        sys.path.remove(str(REPO))
    return {"benchmarks": BENCHMARKS, "helpers": HELPERS}


def test_every_listed_benchmark_and_helper_exists() -> None:
    suite = _suite()
    for name in [*suite["benchmarks"], *suite["helpers"]]:
        assert (BENCH / f"{name}.py").is_file(), f"benchmarks/{name}.py is listed but missing"
    for probe in (BENCH / "probes").glob("*.py"):
        readme = (BENCH / "probes" / "README.md").read_text()
        assert f"`{probe.name}`" in readme, f"add {probe.name} to benchmarks/probes/README.md"


def test_no_benchmark_file_over_the_line_limit() -> None:
    """The benchmark scripts keep the package's rule (``tests/test_architecture.py``,
    ``MAX_LINES``): a script over it is split by concern (protocol, runners, table...)."""
    long = {str(p.relative_to(BENCH)): n for p in BENCH.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, f"benchmark files over 400 lines: {long}"


def test_entry_point_lists_and_refuses_unknown_names() -> None:
    listed = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=REPO,
                            capture_output=True, text=True, check=True, timeout=60)
    assert "layerwise" in listed.stdout and "probes/" in listed.stdout
    unknown = subprocess.run([sys.executable, "-m", "benchmarks", "run", "no-such-benchmark"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "no-such-benchmark" in unknown.stderr


def _cited_results(text: str) -> set[str]:
    """Results file names cited in backticks, ``{a,b}`` alternatives expanded; names written as
    a suffix of the row's pattern (``_h100_...``) or elided (``...``) are skipped."""
    names: set[str] = set()
    for token in re.findall(r"`([^`\s]+\.(?:json|jsonl|txt|log))`", text):
        if token.startswith(("_", ".", "<")) or "*" in token or "<" in token:
            continue
        token = token.removeprefix("benchmarks/results/")
        match = re.search(r"\{([^}]*)\}", token)
        alternatives = match.group(1).split(",") if match else [""]
        for alt in alternatives:
            names.add(token[:match.start()] + alt + token[match.end():] if match else token)
    return names


def test_benchmarks_md_is_short_and_its_results_files_exist() -> None:
    text = (REPO / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 400, "BENCHMARKS.md keeps the current figures only"
    cited = _cited_results(text)
    assert cited, "BENCHMARKS.md cites no results file"
    missing = sorted(name for name in cited if not (RESULTS / name).is_file())
    assert not missing, f"BENCHMARKS.md cites results files not in benchmarks/results: {missing}"


def test_no_file_cites_development_sessions_or_issue_numbers() -> None:
    roots = [REPO / "src", REPO / "docs", REPO / "tests", BENCH]
    top = ("README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "mkdocs.yml")
    files = [REPO / name for name in top]
    for root in roots:
        files += [p for p in root.rglob("*") if p.suffix in _TEXT_SUFFIXES and p.is_file()
                  and RESULTS not in p.parents and "__pycache__" not in p.parts]
    offenders = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _DEV_REFERENCE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:80]}")
    assert not offenders, ("cite a date, a script or a results file instead:\n"
                           + "\n".join(offenders))
