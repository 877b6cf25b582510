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
    ("ortft.families",),
    ("ortft.tools",),
    ("ortft.cli", "ortft.__main__", "ortft.cudalibs"),
]
MAX_MODULE_LINES = 450
# a cohesive module may run to this many lines when its docstring says why, in a line that
# starts with OVERSIZE (what splitting it would cut apart)
MAX_EXPLAINED_LINES = 600
OVERSIZE = "Over 450 lines:"
MAX_FUNCTION_LINES = 80
# `# fmt: skip` keeps aligned tables; it is not a way to pack statements under the sizes
MAX_FMT_SKIPS = 10
# A task family is one package under ortft/families/, reached only through the task registry's
# table (ortft.tasks.BUILTIN). The core asks a family through ortft.tasks.protocols and never
# compares these attributes of a task (or their readers in ortft.tasks.traits) with a name.
FAMILIES = "ortft.families"
REGISTRY = PACKAGE / "tasks" / "__init__.py"
FAMILY_FIELDS = {"modality", "export_kind", "model_family", "predicts"}
FAMILY_CALLS = {"export_kind", "predicts"}  # the readers of those fields
# What the core still compares (issue 47 moved every family into ortft/families/): none.
MAX_FAMILY_BRANCHES = 0
# Names the Task base class defines (attributes and methods): what every task has. A hook that
# serves a few tasks is a protocol they implement (ortft.tasks.protocols). Only down (issue 47
# aims at 12).
MAX_TASK_NAMES = 12
# The modules that import by name (importlib.import_module), and why: the two registries import
# what their tables name; the others import a third-party module.
STRING_IMPORTS = {
    "ortft.tasks": "the task registry: BUILTIN's families and task modules",
    "ortft.backends": "the backend registry: REGISTRY's engines",
    "ortft.backends.ortmodule.patches": "the torch and transformers modules it patches",
    "ortft.backends.ortmodule.allocator": "ORT's CUDA allocator extension",
    "ortft.backends.ondevice.engine": "onnxruntime.training.api",
    "ortft.backends.torch.hf_config": "a transformers model module",
}
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


def size_problems(root: Path = PACKAGE) -> list[str]:
    """Modules over MAX_MODULE_LINES (or MAX_EXPLAINED_LINES with an OVERSIZE line in their
    docstring), functions over MAX_FUNCTION_LINES, and more `# fmt: skip` than MAX_FMT_SKIPS."""
    problems, skips = [], 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(root.parent)
        tree = ast.parse(text)
        doc = ast.get_docstring(tree) or ""
        explained = any(line.startswith(OVERSIZE) for line in doc.splitlines())
        limit = MAX_EXPLAINED_LINES if explained else MAX_MODULE_LINES
        if len(text.splitlines()) > limit:
            problems.append(f"{rel}: {len(text.splitlines())} lines (at most {limit})")
        problems += [
            f"{rel}: {node.name}() {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
        ]
        skips += sum(line.rstrip().endswith("# fmt: skip") for line in text.splitlines())
    if skips > MAX_FMT_SKIPS:
        problems.append(f"{skips} `# fmt: skip` lines (at most {MAX_FMT_SKIPS})")
    return problems


def test_sizes():
    assert size_problems() == [], (
        f"modules <= {MAX_MODULE_LINES} lines ({MAX_EXPLAINED_LINES} with a reason), functions "
        f"<= {MAX_FUNCTION_LINES}, `# fmt: skip` <= {MAX_FMT_SKIPS}"
    )


def test_the_size_check_bites(tmp_path):
    """A long module passes with a reason, not without one nor past the explained limit; a long
    function and packed `# fmt: skip` lines fail."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "x = 1\n" * 470
    (pkg / "long.py").write_text(f'"""A module.\n\n{OVERSIZE} one table."""\n{body}')
    assert size_problems(pkg) == []
    (pkg / "long.py").write_text(f'"""A module."""\n{body}')
    assert size_problems(pkg) == ["pkg/long.py: 471 lines (at most 450)"]
    (pkg / "long.py").write_text(f'"""{OVERSIZE} one table."""\n' + "x = 1\n" * 600)
    assert size_problems(pkg) == ["pkg/long.py: 601 lines (at most 600)"]
    lines = "".join(f"    y = {i}\n" for i in range(80))
    (pkg / "long.py").write_text(f"def f():\n{lines}")
    assert size_problems(pkg) == ["pkg/long.py: f() 81 lines"]
    (pkg / "long.py").write_text("z = (1,)  # fmt: skip\n" * 11)
    assert size_problems(pkg) == ["11 `# fmt: skip` lines (at most 10)"]


def registry_table(path: Path = REGISTRY) -> dict[str, str]:
    """``BUILTIN`` of the task registry, read with ``ast``: task name -> module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "BUILTIN":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no BUILTIN table")


def family_tasks(init: Path) -> list[str] | None:
    """The task names of a family package's ``TASKS`` table (a family of several tasks), read
    with ``ast``; None when its ``__init__.py`` has none (one task: ``Options`` and ``build``)."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TASKS":
            assert isinstance(node.value, ast.Dict), f"{init}: TASKS is not a dict literal"
            return [ast.literal_eval(k) for k in node.value.keys if k is not None]
    return None


def family_problems(root: Path = PACKAGE) -> list[str]:
    """A module outside the families that imports one; a family package the registry does not
    name; a family of several tasks whose ``TASKS`` and the registry disagree on a task; a
    module that imports by name without a reason in STRING_IMPORTS."""
    known = modules(root)
    graph = edges(known)
    problems = [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if not _in(a, FAMILIES) and _in(b, FAMILIES)
    ]
    table = registry_table(root / "tasks" / "__init__.py")
    named = set(table.values())
    problems += [
        f"{name}: a family the registry (ortft.tasks.BUILTIN) does not name"
        for name in known
        if name.count(".") == 2 and _in(name, FAMILIES) and name not in named
    ]
    for name, path in known.items():
        held = family_tasks(path) if _in(name, FAMILIES) and path.name == "__init__.py" else None
        if held is None:
            continue
        named_here = {task for task, module in table.items() if module == name}
        problems += [
            f"{name}: TASKS holds {task}, which the registry does not name to it"
            for task in held
            if task not in named_here
        ]
        problems += [
            f"{name}: the registry names it for {task}, which its TASKS does not hold"
            for task in sorted(named_here - set(held))
        ]
    for name, path in known.items():
        calls = [
            node
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
        ]
        if calls and name not in STRING_IMPORTS:
            problems.append(f"{name}: imports by name (importlib), outside the registries")
    return problems


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _names_a_field(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in FAMILY_FIELDS
    if isinstance(node, ast.Name):
        return node.id in FAMILY_FIELDS
    if isinstance(node, ast.Call):
        func = node.func
        return getattr(func, "id", getattr(func, "attr", "")) in FAMILY_CALLS
    return False


def _is_names(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_names(e) for e in node.elts)
    return False


def family_branches(root: Path = PACKAGE) -> list[str]:
    """Each comparison, outside the families, of a task's modality, export kind, model family
    or predict kind with a name (``task.modality == "audio"``, ``traits.predicts(t) in (...)``)."""
    found = []
    for name, path in modules(root).items():
        if _in(name, FAMILIES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(_names_a_field, sides)) and any(map(_is_names, sides)):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return sorted(found)


def test_families_are_reached_through_the_registry():
    assert family_problems() == []


def test_the_core_branches_less_on_families():
    branches = family_branches()
    assert len(branches) <= MAX_FAMILY_BRANCHES, "\n".join(branches)


def test_the_family_checks_bite(tmp_path):
    """On a copy of the package: a core module importing a family, a family package the
    registry leaves out, a string import elsewhere and a new comparison are each caught."""
    import shutil

    copy = tmp_path / "ortft"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = len(family_branches(copy))
    evaluate = copy / "inference" / "evaluate.py"
    evaluate.write_text(
        evaluate.read_text() + "\n\ndef _planted(task):\n"
        "    from ortft.families.speech import card\n"
        "    import importlib\n"
        "    importlib.import_module('ortft.families.speech')\n"
        "    return task.modality == 'audio'\n"
    )
    (copy / "families" / "stray").mkdir()
    (copy / "families" / "stray" / "__init__.py").write_text('"""A stray family."""\n')
    assert family_problems(copy) == [
        "ortft.inference.evaluate -> ortft.families.speech.card",
        "ortft.families.stray: a family the registry (ortft.tasks.BUILTIN) does not name",
        "ortft.inference.evaluate: imports by name (importlib), outside the registries",
    ]
    assert len(family_branches(copy)) == before + 1


def task_base_names(path: Path = PACKAGE / "tasks" / "base.py") -> list[str]:
    """The names ``class Task`` defines in its body: attributes and methods."""
    tree = ast.parse(path.read_text())
    task = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Task")
    names = []
    for node in task.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def test_the_task_base_shrinks():
    names = task_base_names()
    assert len(names) <= MAX_TASK_NAMES, names


def test_the_task_count_bites(tmp_path):
    base = tmp_path / "base.py"
    base.write_text(
        "class Task:\n    name = ''\n    flag: bool = False\n\n    def hook(self):\n        pass\n"
    )
    assert task_base_names(base) == ["name", "flag", "hook"]


def test_the_tasks_table_check_bites(tmp_path):
    """On a copy of the package: a family of several tasks whose TASKS holds a task the
    registry does not name to it, and one the registry names it for that its TASKS lacks."""
    import shutil

    copy = tmp_path / "ortft"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "families" / "pair").mkdir()
    (copy / "families" / "pair" / "__init__.py").write_text(
        '"""A family of two tasks."""\n\nTASKS = {"pair-a": (None, None), "pair-b": (None, None)}\n'
    )
    registry = copy / "tasks" / "__init__.py"
    text = registry.read_text()
    registry.write_text(
        text.replace(
            "BUILTIN = {\n",
            'BUILTIN = {\n    "pair-a": "ortft.families.pair",\n'
            '    "pair-c": "ortft.families.pair",\n',
            1,
        )
    )
    assert family_problems(copy) == [
        "ortft.families.pair: TASKS holds pair-b, which the registry does not name to it",
        "ortft.families.pair: the registry names it for pair-c, which its TASKS does not hold",
    ]


def test_the_cudalibs_shim_forwards():
    """Venvs set up before the move run `import ortft.cudalibs; ortft.cudalibs.install_hook()`
    from their ortft-cuda11.pth: the shim must hand over the real functions."""
    import ortft.cudalibs as shim
    import ortft.env.cudalibs as real

    assert shim.install_hook is real.install_hook and shim.main is real.main
