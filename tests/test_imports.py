"""No import cycles in `src/` or `sdk/`, and the layers import downwards only.

The imports are read with `ast`, not by importing: module-level and function-level imports
count (a lazy import only hides a cycle until the function runs). Importing `a.b.c` also runs
the `__init__` of `a` and `a.b`, so those count as well — except a package the importing module
is itself inside (it is already being imported by then).

Imports under `if TYPE_CHECKING:` never run, so they cannot break an import; but two modules
that name each other's types still know each other, which is the coupling the layers exist to
prevent. So they are checked twice: without them (a cycle there breaks the import) and with
them (a cycle there is a design one: move the shared type down a layer).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
SDK = ROOT / "sdk" / "src"


def _modules(root: Path) -> dict[str, Path]:
    """Every module under `root` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    node: ast.AST, *, type_checking: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth: those that can run, and with `type_checking`
    also those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:  # the `else:` of TYPE_CHECKING runs
                yield from _import_nodes(branch)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _import_nodes(child, type_checking=type_checking)


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement asks for (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path, *, type_checking: bool = False) -> dict[str, set[str]]:
    """Module → the modules of the same tree its imports run (with `type_checking`, also
    those it imports for annotations only)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if is_package:
            own_packages.add(name)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _import_nodes(tree, type_checking=type_checking):
            for target in _imported(name, is_package, node):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    ancestor = ".".join(parts[:i])
                    if ancestor in modules and ancestor not in own_packages and ancestor != name:
                        graph[name].add(ancestor)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for target in sorted(graph[node]):
            if colour[target] == GREY:
                return [*stack[stack.index(target) :], target]
            if colour[target] == WHITE:
                found = visit(target)
                if found is not None:
                    return found
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            found = visit(node)
            if found is not None:
                return found
    return None


def _assert_acyclic(root: Path, *, type_checking: bool = False) -> None:
    cycle = find_cycle(import_graph(root, type_checking=type_checking))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_server_has_no_import_cycle() -> None:
    _assert_acyclic(SRC)


def test_the_sdk_has_no_import_cycle() -> None:
    _assert_acyclic(SDK)


@pytest.mark.parametrize("root", [SRC, SDK], ids=["server", "sdk"])
def test_no_cycle_hides_behind_type_checking_imports(root: Path) -> None:
    _assert_acyclic(root, type_checking=True)


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("undolog.mcp", "undolog.proxy"),
        ("undolog.services", "undolog.proxy"),
        ("undolog.services", "undolog.mcp"),
        ("undolog.engine", "undolog.services"),
        ("undolog.engine", "undolog.proxy"),
        # The runtime is built above the services, from the configuration: neither the
        # services nor the engine read configuration or know the runtime.
        *(
            (layer, above)
            for layer in ("undolog.services", "undolog.engine")
            for above in (
                "undolog.config",
                "undolog.config_tables",
                "undolog.webhook_config",
                "undolog.mcp",
                "undolog.runtime",
                "undolog.answer_watch",
            )
        ),
    ],
)
def test_a_layer_does_not_import_a_front_end_above_it(layer: str, forbidden: str) -> None:
    graph = import_graph(SRC)
    offending = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if target == forbidden or target.startswith(forbidden + ".")
    )
    assert offending == []


WEB_FRAMEWORKS = ("starlette", "fastapi", "uvicorn", "sse_starlette")


@pytest.mark.parametrize("layer", ["services", "engine", "store"])
def test_the_services_engine_and_store_know_no_web_framework(layer: str) -> None:
    """HTTP is the front ends' business (proxy, MCP gateway, answer_watch): below them no
    module imports Starlette, FastAPI or uvicorn, even for a type."""
    offending = []
    for path in sorted((SRC / "undolog" / layer).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _import_nodes(tree, type_checking=True):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            offending += [
                f"{path.name}: {name}" for name in names if name.split(".")[0] in WEB_FRAMEWORKS
            ]
    assert offending == []


# -- the checker itself ---------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_the_checker_names_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": "def thing():\n    from pkg import a\n    return a\n",
        },
    )
    assert find_cycle(import_graph(root)) == ["pkg.a", "pkg.b", "pkg.a"]


def test_the_checker_ignores_type_checking_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import thing\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.a import x\nthing = 1\n",
        },
    )
    assert find_cycle(import_graph(root)) is None
    assert find_cycle(import_graph(root, type_checking=True)) == ["pkg.a", "pkg.b", "pkg.a"]


def test_the_checker_counts_the_package_init_an_import_runs(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/web/__init__.py": "from app.web.server import serve\n",
            "app/web/server.py": "from app.gateway import Gateway\nserve = 1\n",
            "app/web/wire.py": "x = 1\n",
            "app/gateway.py": "from .web.wire import x\nGateway = 1\n",
        },
    )
    assert find_cycle(import_graph(root)) == [
        "app.gateway",
        "app.web",
        "app.web.server",
        "app.gateway",
    ]
