"""The packages' layers, read from the source: every import (type-only ones under TYPE_CHECKING and those
inside functions included), no circle among the project's modules, nothing in the shared bottom reaching
up or into a web framework, neither process package reaching into the other, the frontend's layers each
importing only those below it (and a door no other door), no door file too long to read in one sitting,
the frontend built from one table of doors that names no door's module, and no unit test loading the model.

Each rule is a function of the import graph, tried on a made-up graph too, so that an empty answer on the
real one means something."""

from __future__ import annotations

import ast
import os

from tests.conftest import ROOT

PACKAGES = ("cllm", "engine_proc", "frontend_proc", "perf")
BOTTOM = "cllm.core"
ABOVE_THE_BOTTOM = (
    "engine_proc",
    "frontend_proc",
    "cllm.cli",
    "cllm.supervisor",
    "cllm.children",
    "cllm.ray_serve",
    "cllm.bench",
)
WEB_FRAMEWORKS = ("starlette", "uvicorn", "fastapi", "httptools", "uvloop")
# The frontend's layers, bottom up: a module imports its own layer and those below. chat and http are side by
# side: neither imports the other. Each door (frontend_proc.doors.<api>) is a layer of its own above them.
FRONTEND_LAYERS = {
    ("frontend_proc.engine",): 0,
    ("frontend_proc.core",): 1,
    ("frontend_proc.chat",): 2,
    ("frontend_proc.http",): 2,
    ("frontend_proc.doors",): 3,
    ("frontend_proc.main", "frontend_proc.__main__"): 4,  # the process
}
DOORS = "frontend_proc.doors"
DOOR_LINES = 250  # a door is read in one sitting
# What loads the model or starts a server: tests/unit/ imports none of it.
MODEL_LOADERS = {
    "llama_cpp": None,
    "engine_proc.engine": None,
    "engine_proc.run.model_runner": None,
    "engine_proc.run.embedder": None,
    "cllm.core.model_file": {"resolve_model"},
    "frontend_proc.core.tokenizer": None,
    "tests.conftest": {"start_server"},
    "conftest": {"start_server"},
}


def module_name(path: str) -> str:
    parts = os.path.relpath(path, ROOT)[: -len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(*tops: str) -> dict[str, str]:
    """Module name -> file, for every .py file under the given top folders (not perf/cache/: the peers' venvs)."""
    found = {}
    for top in tops:
        for folder, subfolders, files in os.walk(os.path.join(ROOT, top)):
            subfolders[:] = [d for d in subfolders if d not in ("cache", "__pycache__", "node_modules")]
            for f in files:
                if f.endswith(".py"):
                    found[module_name(os.path.join(folder, f))] = os.path.join(folder, f)
    return found


def imports(module: str, path: str) -> set[tuple[str, str | None]]:
    """(module, name) for every import anywhere in the file; name is None for `import module`."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name, None) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {(base, alias.name) for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    """The project's modules and the project modules each imports (`from a import b` names a.b if a.b is a module)."""
    modules = sources(*PACKAGES)
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for base, name in imports(module, path):
            target = f"{base}.{name}" if name and f"{base}.{name}" in modules else base
            if target in modules and target != module:
                targets.add(target)
        edges[module] = targets
    return edges


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_circles_are_found():
    """The finder on a made-up graph, so that an empty answer below means something."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert sorted(map(sorted, circles(edges))) == [["a", "b", "c"], ["e", "f"]]
    assert "engine_proc.engine" in graph()["engine_proc.main"]


def test_no_import_circle():
    assert [sorted(c) for c in circles(graph())] == []


def test_the_shared_bottom_imports_nothing_above_it():
    edges = graph()
    upward = {m: sorted(t for t in edges[m] if under(t, ABOVE_THE_BOTTOM)) for m in edges if under(m, (BOTTOM,))}
    assert {m: t for m, t in upward.items() if t} == {}


def test_neither_process_package_imports_the_other():
    edges = graph()
    crossing = [
        (m, t)
        for m in edges
        for t in edges[m]
        if (under(m, ("engine_proc",)) and under(t, ("frontend_proc",)))
        or (under(m, ("frontend_proc",)) and under(t, ("engine_proc",)))
    ]
    assert crossing == []


def test_unit_tests_load_no_model():
    """tests/unit/ runs alone in seconds: none of its files imports what loads the model or starts a server."""
    loading = []
    for module, path in sources(os.path.join("tests", "unit")).items():
        for base, name in imports(module, path):
            for loader, names in MODEL_LOADERS.items():
                if (names is None and under(base, (loader,))) or (base == loader and names and name in names):
                    loading.append((module, base, name))
    assert loading == []


def third_party(module: str, path: str) -> set[str]:
    """The top-level names of what a module imports from outside the project."""
    return {base.split(".")[0] for base, _ in imports(module, path) if base and not under(base, PACKAGES)}


def layer(module: str) -> tuple[tuple[str, ...], int] | None:
    for prefixes, rank in FRONTEND_LAYERS.items():
        if under(module, prefixes):
            return prefixes, rank
    return None


def door(module: str) -> str | None:
    """The door a module belongs to (frontend_proc.doors.<api>), if any."""
    parts = module.split(".")
    return ".".join(parts[:3]) if under(module, (DOORS,)) and len(parts) > 2 else None


def against_the_layers(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Frontend imports that reach a layer above, a side-by-side layer, or another door."""
    wrong = []
    for m in sorted(edges):
        here = layer(m)
        if here is None:
            continue
        for t in sorted(edges[m]):
            there = layer(t)
            if there is None:
                continue
            upward = there[1] > here[1] or (there[1] == here[1] and there[0] != here[0])
            if upward or (door(m) and door(t) and door(m) != door(t)):
                wrong.append((m, t))
    return wrong


def test_the_layer_rules_find_what_they_should():
    edges = {
        "frontend_proc.doors.a.x": {"frontend_proc.doors.b.y", "frontend_proc.doors.a.z", "frontend_proc.chat.c"},
        "frontend_proc.doors.a.z": {"frontend_proc.core.g", "frontend_proc.http.h"},
        "frontend_proc.core.g": {"frontend_proc.engine.e", "frontend_proc.chat.c"},
        "frontend_proc.chat.c": {"frontend_proc.http.h", "frontend_proc.core.g"},
        "frontend_proc.http.h": {"frontend_proc.core.g"},
        "frontend_proc.engine.e": set(),
    }
    assert against_the_layers(edges) == [
        ("frontend_proc.chat.c", "frontend_proc.http.h"),
        ("frontend_proc.core.g", "frontend_proc.chat.c"),
        ("frontend_proc.doors.a.x", "frontend_proc.doors.b.y"),
    ]


def test_the_frontend_imports_only_the_layers_below():
    assert against_the_layers(graph()) == []


def test_the_shared_bottom_imports_no_web_framework():
    found = {
        module: sorted(third_party(module, path) & set(WEB_FRAMEWORKS))
        for module, path in sources("cllm").items()
        if under(module, (BOTTOM,))
    }
    assert {m: f for m, f in found.items() if f} == {}
    assert "starlette" in third_party("frontend_proc.http.app", sources("frontend_proc")["frontend_proc.http.app"])


def read_lines(path: str) -> int:
    """The lines a reader reads: those holding code or comments, the imports at the top aside (ruff's format gives
    each imported name a line of its own)."""
    with open(path) as f:
        source = f.read()
    imports = {
        n
        for node in ast.parse(source).body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    return sum(1 for i, line in enumerate(source.splitlines(), 1) if line.strip() and i not in imports)


def test_no_door_file_is_over_its_length():
    long = {}
    for module, path in sources("frontend_proc").items():
        if door(module):
            n = read_lines(path)
            if n > DOOR_LINES:
                long[module] = n
    assert long == {}


def doors_in(folder: str) -> set[str]:
    """The door packages: the folders under frontend_proc/doors/ with an __init__.py."""
    return {d for d in os.listdir(folder) if os.path.isfile(os.path.join(folder, d, "__init__.py"))}


def against_the_door_table(main_source: str, doors: set[str]) -> list[str]:
    """What frontend_proc/main.py does against its table of doors: an import that names a door or a door's module
    (the table names them, as strings), or a table that is not every door exactly once."""
    tree = ast.parse(main_source)
    wrong = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        wrong += [f"imports {n}" for n in names if under(n, (DOORS,))]
    tables = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DOORS" for t in node.targets)
    ]
    if len(tables) != 1:
        return [*wrong, "no one DOORS table"]
    table = list(ast.literal_eval(tables[0]))
    wrong += [f"{name} twice in DOORS" for name in sorted(set(table)) if table.count(name) > 1]
    wrong += [f"{name} in DOORS is no door" for name in sorted(set(table) - doors)]
    wrong += [f"door {name} not in DOORS" for name in sorted(doors - set(table))]
    return wrong


def test_the_door_table_rule_finds_what_it_should():
    source = """
from frontend_proc.doors.a import routes
from frontend_proc.doors import b
import frontend_proc.doors.c.writer
from frontend_proc.http.app import Door
DOORS = ("a", "b", "a", "x")
"""
    assert against_the_door_table(source, {"a", "b", "c"}) == [
        "imports frontend_proc.doors.a.routes",
        "imports frontend_proc.doors.b",
        "imports frontend_proc.doors.c.writer",
        "a twice in DOORS",
        "x in DOORS is no door",
        "door c not in DOORS",
    ]
    assert against_the_door_table('DOORS = ("a", "b")', {"a", "b"}) == []
    assert against_the_door_table("import os", set()) == ["no one DOORS table"]


def test_the_frontend_is_built_from_one_table_of_doors():
    """An added door is its own package and a name in frontend_proc/main.py's DOORS: main.py imports no door's
    module, and each door exports its routes as `door` from its package."""
    folder = os.path.join(ROOT, "frontend_proc", "doors")
    with open(os.path.join(ROOT, "frontend_proc", "main.py")) as f:
        assert against_the_door_table(f.read(), doors_in(folder)) == []
    exporting = set()
    for name in doors_in(folder):
        with open(os.path.join(folder, name, "__init__.py")) as f:
            body = ast.parse(f.read()).body
        if any(isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["door"] for n in body):
            exporting.add(name)
    assert exporting == doors_in(folder)
