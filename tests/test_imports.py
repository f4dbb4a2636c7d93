"""The package's modules import each other without a cycle (counting imports inside functions
too), and only from their own layer or those below it (LAYERS): every module can be read,
imported and tested on its own, from the bottom up."""

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


# The package's layers, lowest first: a module of one (jaxrl_mgpu.X or jaxrl_mgpu.X.anything is
# in X's) imports from its own layer and those below it, never from one above.
LAYERS = [
    # the words and records everything shares: errors and the command line's parser, the
    # compilation cache, profiles, a run's result, the loop's data sources (no JAX)
    ("cli", "compile_cache", "tracing", "result", "sources"),
    ("config", "parallel"),                                  # the options; devices and hosts
    ("checkpoint", "data", "stop", "log", "tracking", "asynchronous"),  # what a run saves, reads, logs, shares
    ("nets", "envs"),                                        # networks; environments
    ("algos",),                                              # the algorithms, each a package
    ("episodes", "chunks", "multirun"),                      # evaluation episodes; the compiled chunk; many runs
    ("loop", "session", "rundir", "autoscale"),              # the host loop, its modes; the run directory; sizing
    ("plan",),                                               # a run resolved once
    ("runner", "runs"),                                      # a run, start to end; a finished run's directory
    ("tools",),                                              # bench, histories, in-context evaluation, video, launch
    # the front ends: the commands, the Python API, the package itself and its command shims
    ("train", "evaluate", "api", "bench", "histories", "incontext", "launch", "jaxrl_mgpu"),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of a module's layer (its unit: jaxrl_mgpu.X... -> X)."""
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else parts[0]
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise AssertionError(f"{module} is in no layer: add {unit} to tests/test_imports.py's LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own, as 'importer -> imported'."""
    return [f"{module} -> {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if layer_of(target) > layer_of(module)]


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


def test_every_module_imports_only_from_its_layer_or_below():
    upward = upward_imports(import_graph())
    assert not upward, "imports from a higher layer: " + "; ".join(upward)


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"jaxrl_mgpu.config.options": {"jaxrl_mgpu.algos.ppo.ppo"}}) == [
        "jaxrl_mgpu.config.options -> jaxrl_mgpu.algos.ppo.ppo"]
    assert upward_imports({"jaxrl_mgpu.algos.ppo.ppo": {"jaxrl_mgpu.config.options"}}) == []


def test_the_cycle_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_submodule_importing_its_package_back_is_a_cycle():
    assert find_cycle({"p": {"p.a"}, "p.a": {"p"}}) == ["p", "p.a", "p"]


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "jaxrl_mgpu.runner" in graph["jaxrl_mgpu.train"]  # imported inside train.main


def test_the_base_modules_load_no_algorithm_and_no_dataset_library():
    """The registry loads an algorithm when a run first names it: importing algos.base (what an
    outside algorithm imports) loads neither an algorithm nor TFDS."""
    import subprocess
    import sys
    code = ("import sys, jaxrl_mgpu.algos.base; "
            "print(sorted(m for m in sys.modules if m.startswith(('tensorflow_datasets', 'jaxrl_mgpu.algos.ppo', "
            "'jaxrl_mgpu.algos.dqn', 'jaxrl_mgpu.algos.sac', 'jaxrl_mgpu.algos.ad', 'jaxrl_mgpu.algos.mappo'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
