"""The package layout as a test (docs/architecture.md): no import cycle, every import pointing
down the layer order, no module over 450 lines, no function over 80.

Counted as the architecture doc says: every ``import`` in ``ortft/`` counts, at module level,
inside functions and under ``TYPE_CHECKING``; ``from a.b import c`` is an edge to the module
``a.b``, or to ``a.b.c`` when that is a module. Parsing with ``ast`` runs nothing: this costs
milliseconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ortft"

# Low to high: a module may import its own layer's modules and any layer below. The same list
# stands in docs/architecture.md; the test below keeps the two equal.
LAYERS: list[tuple[str, ...]] = [
    ("ortft",),  # the root: __version__ only
    ("ortft.core",),
    ("ortft.env",),
    ("ortft.checkpoint",),
    ("ortft.data",),
    ("ortft.tasks",),
    ("ortft.recipe",),
    ("ortft.export",),
    ("ortft.backends",),
    ("ortft.run",),
    ("ortft.inference",),
    ("ortft.tools",),
    ("ortft.cli", "ortft.__main__", "ortft.cudalibs"),
]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
# Directly under ortft/: the package files and the documented shim (docs/architecture.md).
TOP_LEVEL = {"__init__.py", "__main__.py", "cudalibs.py"}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str:
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def edges(known: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {_target(a.name, known) for a in node.names if a.name.startswith("ortft")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                if not base.startswith("ortft"):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    out.add(sub if sub in known else _target(base, known))
        out.discard(name)
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank < 0:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return rank


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a)
    ]


def test_no_import_cycle():
    assert cycles(edges(modules())) == []


def test_every_import_points_down_the_layers():
    assert upward(edges(modules())) == []


def test_the_checks_catch_a_back_import(tmp_path):
    """The checks themselves, on a copy of the package with one import added that points up."""
    import shutil

    copy = tmp_path / "ortft"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    errors = copy / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _back():\n    from ortft.cli import app\n")
    graph = edges(modules(copy))
    assert "ortft.core.errors -> ortft.cli.app" in upward(graph)
    assert any("ortft.core.errors" in c for c in cycles(graph))


def test_layers_match_the_architecture_doc():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = doc.split("<!-- layers -->")[1]
    listed = [
        tuple(line.split("|")[1].strip().strip("`").split("`, `"))
        for line in block.strip().splitlines()
        if line.startswith("| ") and "`ortft" in line
    ]
    assert list(reversed(listed)) == LAYERS


def test_top_level_holds_no_modules():
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL


def test_every_subpackage_names_its_role():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 5, f"{init}: no docstring naming the package's role"


def test_sizes():
    too_big = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(PACKAGE.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{rel}: {len(text.splitlines())} lines")
        too_big += [
            f"{rel}: {node.name}() {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        ]
    assert too_big == [], f"modules <= {MAX_MODULE_LINES} lines, functions <= {MAX_FUNCTION_LINES}"


def test_the_cudalibs_shim_forwards():
    """Venvs set up before the move run `import ortft.cudalibs; ortft.cudalibs.install_hook()`
    from their ortft-cuda11.pth: the shim must hand over the real functions."""
    import ortft.cudalibs as shim
    import ortft.env.cudalibs as real

    assert shim.install_hook is real.install_hook and shim.main is real.main
