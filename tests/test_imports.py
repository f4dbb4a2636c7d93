"""The package's modules import each other without a cycle (counting imports inside functions
too): every module can be read, imported and tested on its own, from the bottom up."""

import ast
from pathlib import Path

import jaxrl_mgpu

PACKAGE = Path(jaxrl_mgpu.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (`from pkg import mod` names the module)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
        # A submodule that imports its own package back (a registry in the package's __init__)
        # is a cycle too: the package's __init__ imports its submodules.
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_submodule_importing_its_package_back_is_a_cycle():
    assert find_cycle({"p": {"p.a"}, "p.a": {"p"}}) == ["p", "p.a", "p"]


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "jaxrl_mgpu.runner" in graph["jaxrl_mgpu.train"]  # imported inside train.main
