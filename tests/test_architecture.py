"""The layout reads like the architecture: layer order, no import cycles, file and package
size, no printing in the library.

Layers, lowest first (a module may import from its own layer and the layers below it only;
function-level imports count too). Between modules there is no import cycle, not even through
a function-level import. A package holds at most ``MAX_MODULES`` modules (a subpackage counts
as one). CONTRIBUTING.md explains the order.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "precision_doctor"

# Module prefixes per layer; a package lies in one layer (the most specific prefix decides).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("precision_doctor", "precision_doctor.errors", "precision_doctor.formats",
              "precision_doctor.jsonable", "precision_doctor.numbers")),
    ("graph", ("precision_doctor.graph",)),
    ("precision", ("precision_doctor.precision",)),
    # inputs/ turns data into validated feeds for runners (it uses the runners' TensorMeta);
    # autocast/ runs a torch.nn.Module under torch.autocast (runners/ holds 12 modules).
    ("runners", ("precision_doctor.runners", "precision_doctor.inputs",
                 "precision_doctor.autocast")),
    ("compare", ("precision_doctor.compare",)),
    # audit/ reads an engine's layer information; forensics/ compares two input tensors.
    ("engine", ("precision_doctor.audit", "precision_doctor.forensics")),
    # Every intermediate tensor compared; candidate runners cut like the model.
    ("layerwise", ("precision_doctor.layerwise",)),
    # Objective, sensitivity ranking, bisection, evaluation pool, cost.
    ("search", ("precision_doctor.search",)),
    # INT8/FP8: placement, calibration, Q/DQ emulation, per-layer measurements, quantized fix.
    ("quant", ("precision_doctor.quant",)),
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

# Modules of one package (its .py files besides __init__.py, plus its subpackages, one each).
MAX_MODULES = 12
# The package root is exempt: its subpackages are the layers themselves (CONTRIBUTING.md draws
# them); its own modules (cli, errors, formats, ...) still count against the limit.
ROOT_COUNTS_FILES_ONLY = "precision_doctor"

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
MODULES = {module_name(p): p for p in SOURCES}


def import_graph(sources: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` it imports (any nesting level). ``from pkg import x``
    points at ``pkg.x`` when that is a module, else at ``pkg``. The facade's lazy imports of
    the API (PEP 562, ``FACADE``) are left out: nothing inside the package imports the API
    through the facade."""
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base
                               for a in node.names)
        if module == FACADE:
            targets = {t for t in targets if not t.startswith("precision_doctor.api")}
        graph[module] = {t for t in targets if t in sources and t != module}
    return graph


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted: every module of one imports every other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


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


def test_no_import_cycles():
    cycles = import_cycles(import_graph(MODULES))
    assert not cycles, f"import cycles (function-level imports count): {cycles}"


def test_cycle_check_sees_cycles(tmp_path: Path):
    """The checker itself: a cycle through a function-level import is found, a chain is not."""
    files = {"precision_doctor.report.a": "from precision_doctor.report.b import f\n",
             "precision_doctor.report.b": "def f():\n    from precision_doctor.report import a\n",
             "precision_doctor.report.c": "from precision_doctor.report.a import f\n"}
    sources = {}
    for name, text in files.items():
        path = tmp_path / f"{name.rpartition('.')[2]}.py"
        path.write_text(text)
        sources[name] = path
    assert import_cycles(import_graph(sources)) == [
        ["precision_doctor.report.a", "precision_doctor.report.b"]]


def package_sizes() -> dict[str, int]:
    """Package -> its modules (``.py`` files besides ``__init__.py``) plus its subpackages."""
    sizes = {}
    for init in PACKAGE.rglob("__init__.py"):
        folder = init.parent
        files = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        subpackages = [d for d in folder.iterdir() if (d / "__init__.py").exists()]
        name = module_name(init)
        sizes[name] = len(files) + (0 if name == ROOT_COUNTS_FILES_ONLY else len(subpackages))
    return sizes


def test_no_package_over_the_module_limit():
    sizes = package_sizes()
    assert sizes["precision_doctor.report"] >= 5  # the count sees the package's modules
    large = {name: n for name, n in sizes.items() if n > MAX_MODULES}
    assert not large, f"packages over {MAX_MODULES} modules (a subpackage counts as one): {large}"


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
