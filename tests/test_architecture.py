"""The layout reads like the architecture: layer order, file size, no printing in the library.

Layers, lowest first (a module may import from its own layer and the layers below it only;
function-level imports count too). CONTRIBUTING.md explains the order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "precision_doctor"

# Module prefixes per layer; a package lies in one layer (the most specific prefix decides).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("precision_doctor", "precision_doctor.errors", "precision_doctor.formats",
              "precision_doctor.jsonable", "precision_doctor.numbers")),
    ("graph", ("precision_doctor.graph",)),
    ("precision", ("precision_doctor.precision",)),
    # inputs/ turns data into validated feeds for runners (it uses the runners' TensorMeta).
    ("runners", ("precision_doctor.runners", "precision_doctor.inputs")),
    ("compare", ("precision_doctor.compare",)),
    # audit/ reads an engine's layer information; forensics/ compares two input tensors.
    ("engine", ("precision_doctor.audit", "precision_doctor.forensics")),
    # Every intermediate tensor compared; candidate runners cut like the model.
    ("layerwise", ("precision_doctor.layerwise",)),
    # Objective, sensitivity ranking, bisection, evaluation pool, cost.
    ("search", ("precision_doctor.search",)),
    # Assessment, decisions, root causes, hazards, noise, transformer headroom.
    ("diagnosis", ("precision_doctor.diagnosis",)),
    # fix: rewrite, rank, search, write, verify; the review of the fixed model.
    ("repair", ("precision_doctor.repair",)),
    # Terminal, HTML, JSON files and engine recipes.
    ("report", ("precision_doctor.report",)),
    ("workflows", ("precision_doctor.workflows", "precision_doctor.api")),
    ("cli", ("precision_doctor.cli", "precision_doctor.__main__")),
]

# The package root is the public facade: besides the base layer it imports the API, lazily
# (PEP 562 ``__getattr__``), and nothing imports the API through it inside the package.
FACADE = "precision_doctor"

MAX_LINES = 400
OVERSIZE_EXEMPT: set[str] = set()

# The only places that may create a rich Console (everything else receives one).
CONSOLE_MAKERS = {"cli.py", "report/notebook.py", "api/options.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module) of every precision_doctor import in ``path`` (any nesting level)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append((node.lineno, base))
    return [(line, name) for line, name in found
            if name == "precision_doctor" or name.startswith("precision_doctor.")]


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_from_a_higher_layer(path: Path):
    module = module_name(path)
    own = layer_of(module)
    bad = []
    for line, name in imported_modules(path, module):
        if module == FACADE and name.startswith("precision_doctor.api"):
            continue
        if layer_of(name) > own:
            bad.append(f"line {line}: {name} ({LAYERS[layer_of(name)][0]})")
    assert not bad, f"{module} ({LAYERS[own][0]}) imports from a higher layer: {bad}"


def test_layer_check_sees_violations(tmp_path: Path):
    """The checker itself: a function-level upward import is found."""
    fake = PACKAGE / "graph" / "load.py"
    source = "def f():\n    from precision_doctor.report.html import render_html\n"
    probe = tmp_path / "load.py"
    probe.write_text(source)
    names = [n for _, n in imported_modules(probe, module_name(fake))]
    assert names == ["precision_doctor.report.html"]
    assert layer_of(names[0]) > layer_of(module_name(fake))


def test_no_file_over_the_line_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in SOURCES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(long) <= OVERSIZE_EXEMPT, f"files over {MAX_LINES} lines: {long}"


def test_library_never_prints():
    offenders = []
    for path in SOURCES:
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(
                fn, ast.Attribute) else ""
            if name == "print" and isinstance(fn, ast.Name):
                offenders.append(f"{rel}:{node.lineno} print()")
            if name == "Console" and rel not in CONSOLE_MAKERS:
                offenders.append(f"{rel}:{node.lineno} Console()")
    assert not offenders, offenders
