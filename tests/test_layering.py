"""No module imports a private module (``_name``) of another package.

A private module is any module whose dotted path has a component starting with ``_`` (not a
dunder): ``kvplan.integrations.vllm._refusals`` is private to ``kvplan.integrations.vllm``,
which it and its subpackages may import; everything else goes through a public module.
Checked on the source with ``ast``, so lazy imports inside functions count too. The same
goes for the repository's own folders: the tests and the benchmarks share code only through
``harness/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _owner(module: str) -> str | None:
    """The package a private module belongs to (``None``: the module is public)."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _is_module(dotted: str) -> bool:
    base = SRC.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imported_modules(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importer's package
                here = importer.split(".") if is_package else importer.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            for alias in node.names:  # `from pkg import _module`
                if _is_module(f"{base}.{alias.name}"):
                    found.append((node.lineno, f"{base}.{alias.name}"))
    return [(line, name) for line, name in found if name.split(".")[0] == "kvplan"]


def private_imports() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        importer = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, imported in _imported_modules(tree, importer, path.name == "__init__.py"):
            owner = _owner(imported)
            if owner is None or importer == owner or importer.startswith(owner + "."):
                continue
            out.append(f"{path.relative_to(SRC)}:{line}: {importer} imports {imported}")
    return out


def test_no_module_imports_a_private_module_of_another_package() -> None:
    assert private_imports() == []


def test_the_check_sees_private_imports() -> None:
    tree = ast.parse(
        "from kvplan.integrations.vllm.elastic._refusals import x\n"
        "import kvplan.executor._apply\n"
        "from kvplan.integrations.vllm.pipeline import _runtime\n"
        "from kvplan.planner import build_plan\n"
    )
    names = [name for _, name in _imported_modules(tree, "kvplan.cli.app", False)]
    owners = [_owner(name) for name in names]
    assert owners == [
        "kvplan.integrations.vllm.elastic",  # from ...elastic._refusals import x
        "kvplan.executor",  # import kvplan.executor._apply
        None,  # from kvplan.integrations.vllm.pipeline import ... (the package is public)
        "kvplan.integrations.vllm.pipeline",  # ... _runtime (a private module of it)
        None,  # from kvplan.planner import build_plan
    ]


def test_public_class_names_are_unique() -> None:
    """Each public class name means one class across ``src/kvplan``."""
    seen: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(_module_name(path))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


# -- rooms and cycles -------------------------------------------------------------------------
#
# Every import that runs counts: module level and inside functions (a lazy import that only
# hides a cycle is still a dependency); only ``if TYPE_CHECKING:`` blocks are left out. An
# import ``from pkg import name`` depends on ``pkg.name`` when that is a module, else on ``pkg``
# (its ``__init__``); the parent packages Python also runs are not counted (a package may
# import its own modules).

ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # lowest first: a room may import only from rooms before it (and from itself)
    ("schemas", ("kvplan.schemas", "kvplan.units")),
    ("planner", ("kvplan.planner",)),
    ("executor", ("kvplan.executor",)),
    ("elastic", ("kvplan.elastic",)),
    ("render", ("kvplan.render",)),
    ("catalog", ("kvplan.catalog",)),
    ("api", ("kvplan",)),  # the package's own __init__: the public Python API
    ("vllm.versions", ("kvplan.integrations.vllm.versions",)),
    ("vllm.environment", ("kvplan.integrations.vllm.environment",)),
    ("vllm.convert", ("kvplan.integrations.vllm.convert",)),
    ("vllm.inspect", ("kvplan.integrations.vllm.inspect",)),
    ("vllm.pipeline", ("kvplan.integrations.vllm.pipeline",)),
    ("vllm.elastic", ("kvplan.integrations.vllm.elastic",)),
    ("vllm.plugin", ("kvplan.integrations.vllm.plugin",)),
    ("vllm.metrics", ("kvplan.integrations.vllm.metrics",)),
    ("vllm.doctor", ("kvplan.integrations.vllm.doctor",)),
    ("vllm", ("kvplan.integrations.vllm", "kvplan.integrations")),  # the lazy public names
    ("cli", ("kvplan.cli", "kvplan.__main__")),
)


def room_of(module: str) -> int:
    """The index in :data:`ROOMS` of the room holding ``module`` (longest prefix wins)."""
    best, best_len = -1, -1
    for index, (_, prefixes) in enumerate(ROOMS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best < 0:
        raise AssertionError(f"{module} is in no room of tests/test_layering.py ROOMS")
    return best


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _running_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (not under ``if TYPE_CHECKING:``)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _dependencies(path: Path) -> list[tuple[int, str]]:
    importer = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: list[tuple[int, str]] = []
    for node in _running_imports(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
            continue
        if node.level:
            here = importer.split(".") if is_package else importer.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.append((node.lineno, sub if _is_module(sub) else base))
    return [(line, name) for line, name in out if name.split(".")[0] == "kvplan"]


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: first line}}`` over ``src/kvplan``."""
    graph: dict[str, dict[str, int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        edges = graph.setdefault(_module_name(path), {})
        for line, name in _dependencies(path):
            if _is_module(name):
                edges.setdefault(name, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strongconnect(w)
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
            if len(component) > 1 or v in graph.get(v, {}):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(out)


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports from a lower room into a higher one (see :data:`ROOMS`)."""
    out = []
    for importer, edges in sorted(graph.items()):
        for imported, line in sorted(edges.items()):
            here, there = room_of(importer), room_of(imported)
            if there > here:
                out.append(
                    f"{importer}:{line} ({ROOMS[here][0]}) imports {imported} ({ROOMS[there][0]})"
                )
    return out


def test_no_import_cycles() -> None:
    assert import_cycles(import_graph()) == []


def test_rooms_import_only_downwards() -> None:
    assert upward_imports(import_graph()) == []


def test_every_module_is_in_a_room() -> None:
    for module in import_graph():
        room_of(module)


def test_the_cycle_check_sees_lazy_imports_and_skips_type_checking() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from kvplan.cli import app\n"
        "def f():\n"
        "    from kvplan.planner import plan\n"
    )
    names = [node.module for node in _running_imports(tree) if isinstance(node, ast.ImportFrom)]
    assert names == ["typing", "kvplan.planner"]
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert room_of("kvplan.integrations.vllm.elastic._pool") > room_of(
        "kvplan.integrations.vllm.pipeline._settings"
    )
    assert upward_imports({"kvplan.planner": {"kvplan.cli.app": 7}}) == [
        "kvplan.planner:7 (planner) imports kvplan.cli.app (cli)"
    ]


# -- tests, benchmarks and the harness they share ----------------------------------------------

REPO = SRC.parent
SHARED_BY = {"harness": ("tests", "benchmarks"), "benchmarks": (), "tests": ()}
"""Who may import whom among the repository's top-level code folders: the tests and the
benchmarks share code only through ``harness/`` (the tests run a benchmark script's functions
by loading it from its path, ``tests/_scripts.py``, never by import)."""


def cross_imports(files: dict[str, str]) -> list[str]:
    """``path:line imports X`` for each import, lazy ones included, of a top-level folder of
    :data:`SHARED_BY` other than the importer's own and the harness (``files``: repository
    path -> source)."""
    out = []
    for path, source in sorted(files.items()):
        own = path.split("/", 1)[0]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in SHARED_BY and top != own and own not in SHARED_BY[top]:
                    out.append(f"{path}:{node.lineno} imports {name}")
    return out


def test_tests_and_benchmarks_share_code_only_through_the_harness() -> None:
    files = {
        str(path.relative_to(REPO)): path.read_text()
        for folder in SHARED_BY
        for path in sorted((REPO / folder).rglob("*.py"))
    }
    assert len(files) > 150
    assert cross_imports(files) == []


def test_the_harness_check_sees_every_direction() -> None:
    files = {
        "benchmarks/b.py": "def f():\n    from tests.engine import cases\n",
        "harness/h.py": "import tests._deadline\n",
        "tests/t.py": "from benchmarks import bench_elastic\nfrom harness import _builders\n",
        "tests/u.py": "from tests import _scripts\n",
        "benchmarks/c.py": "from harness.engine import harness\n",
    }
    assert cross_imports(files) == [
        "benchmarks/b.py:2 imports tests.engine",
        "harness/h.py:1 imports tests._deadline",
        "tests/t.py:1 imports benchmarks",
    ]
