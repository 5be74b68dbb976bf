"""The house plan (docs/architecture.md), held by the code's own imports: each module imports
only from its own layer or those below it (and an engine room only from the rooms below it), no
modules import each other in a circle (imports for type checking count: they are the same
dependency), no module grows past 500 lines and no function past 80."""

import ast
from pathlib import Path

import kvinject

PACKAGE = Path(__file__).resolve().parent.parent / "kvinject"
# From the ground up. The foundation is the modules at the top of the package; the package's
# face (__init__, __main__) stands above every layer.
LAYERS = ["", "engine", "error_models", "lmeval", "benchmarks", "experiments", "analysis", "cli"]
FACE = {"kvinject", "kvinject.__main__"}
# The engine's rooms, from the ground up. Its top modules (the contract error models build on,
# the llama.cpp binding) are not a room: the rooms build on the contract, the context on the rooms.
ROOMS = ["callback", "gpu", "graph", "cache", "generation"]
MAX_LINES = 500
MAX_FUNCTION_LINES = 80  # a longer function does several jobs: name them as functions of their own


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The kvinject modules ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            found |= {_module_of(source, a.name) for a in node.names}
    return {m for m in found if m in MODULES and m != name}


def _module_of(source: str, name: str) -> str:
    """The module that ``from source import name`` depends on: a submodule, the module an API
    name of the package's face comes from, or ``source`` itself. The version is a constant of the
    face, which any layer may read."""
    if f"{source}.{name}" in MODULES:
        return f"{source}.{name}"
    if source == "kvinject" and name in kvinject._API:
        return kvinject._API[name]
    return "" if (source, name) == ("kvinject", "__version__") else source


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    if name in FACE:
        return len(LAYERS)  # above every layer
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else 0


def test_every_module_imports_only_its_layer_and_those_below():
    upward = [
        f"{name} ({LAYERS[layer(name)] or 'foundation'}) imports {dep} ({LAYERS[layer(dep)]})"
        for name, deps in GRAPH.items()
        if name not in FACE
        for dep in deps
        if layer(dep) > layer(name)
    ]
    assert not upward, "\n".join(upward)


def room(name: str) -> str | None:
    """The engine room ``name`` is in, or None for a module outside the rooms."""
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "engine" else None


def test_every_engine_room_imports_only_the_rooms_below_it():
    upward = [
        f"{name} ({room(name)}) imports {dep} ({room(dep)})"
        for name, deps in GRAPH.items()
        if room(name)
        for dep in deps
        if room(dep) and ROOMS.index(room(dep)) > ROOMS.index(room(name))
    ]
    assert not upward, "\n".join(upward)
    rooms = {room(name) for name in MODULES if room(name)}
    assert rooms == set(ROOMS), "a new room of the engine needs its place in ROOMS and docs/architecture.md"


def test_no_modules_import_each_other_in_a_circle():
    # Tarjan's strongly connected components: a component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted([v, *component]))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_no_module_is_longer_than_the_plan_allows():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_function_is_longer_than_the_plan_allows():
    long = [
        f"{name}.{node.name}: {n} lines"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, "\n".join(long)


def test_the_plan_names_every_package():
    packages = {name.split(".")[1] for name, path in MODULES.items() if path.name == "__init__.py" and name.count(".") == 1}
    assert packages == set(LAYERS) - {""}, "a new package needs its place in LAYERS and docs/architecture.md"
    # and the check reads real imports: the CLI's app stands on every layer below it
    assert {layer(dep) for dep in set().union(*(GRAPH[m] for m in MODULES if m.startswith("kvinject.cli")))} >= set(range(len(LAYERS)))
