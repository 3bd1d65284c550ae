"""The SDK's modules import one another without a cycle, counting the imports made inside
functions (a lazy import only hides a cycle) and those made for type checking."""

from __future__ import annotations

import ast
from pathlib import Path

import undolog_sdk

PACKAGE = "undolog_sdk"
ROOT = Path(undolog_sdk.__file__).parent


def _modules() -> dict[str, Path]:
    return {
        f"{PACKAGE}.{path.stem}": path
        for path in sorted(ROOT.glob("*.py"))
        if path.stem != "__init__"
    }


def _imports(path: Path, known: set[str]) -> set[str]:
    """The SDK modules `path` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            found.add(node.module)
            # `from undolog_sdk import errors` imports the submodule.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & known


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            cycle = visit(target, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_sdk_module_imports_itself_back_even_lazily() -> None:
    modules = _modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    assert graph[f"{PACKAGE}.decorators"]  # the walk sees imports at all
    assert _cycle(graph) is None
