"""No module imports a private module (``_name``) of another package.

A private module is any module whose dotted path has a component starting with ``_`` (not a
dunder): ``kvplan.integrations.vllm._refusals`` is private to ``kvplan.integrations.vllm``,
which it and its subpackages may import; everything else goes through a public module.
Checked on the source with ``ast``, so lazy imports inside functions count too.
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
        "from kvplan.integrations.vllm._refusals import x\n"
        "import kvplan.executor._apply\n"
        "from kvplan.integrations.vllm import _pipeline\n"
        "from kvplan.planner import build_plan\n"
    )
    names = [name for _, name in _imported_modules(tree, "kvplan.cli.app", False)]
    owners = [_owner(name) for name in names]
    assert owners == [
        "kvplan.integrations.vllm",  # from kvplan.integrations.vllm._refusals import x
        "kvplan.executor",  # import kvplan.executor._apply
        None,  # from kvplan.integrations.vllm import ... (the package is public)
        "kvplan.integrations.vllm",  # ... _pipeline (a private module of it)
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
