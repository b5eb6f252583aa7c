"""The engine's floors, read from the source as tests/unit/test_layers.py reads the frontend's: every import
(type-only ones under TYPE_CHECKING and those inside functions included) goes to the module's own package or a
floor below it, so nothing below reaches the scheduler or the engine and no two packages import each other; and
vision/ is optional: what a text model's engine runs imports none of it (only a projector's engine imports it,
inside a function).

Each rule is a function of the import graph, tried on a made-up graph too, so that an empty answer on the
real one means something."""

from __future__ import annotations

import ast

from tests.unit.test_layers import graph, sources, under

# The engine's floors, bottom up: a module imports its own package and the floors below. kv and run are side by
# side: neither imports the other. The engine's top folder holds only the modules named here.
ENGINE_FLOORS = {
    ("engine_proc.sampling",): 0,  # tokens from logits
    ("engine_proc.sequence",): 1,  # a request as the engine sees it
    ("engine_proc.kv",): 2,  # the KV cells' life
    ("engine_proc.run",): 2,  # llama.cpp: model, context, batches, threads
    ("engine_proc.vision",): 3,  # images, optional
    ("engine_proc.scheduler",): 4,
    ("engine_proc.step",): 5,  # the step's parts around the scheduler
    ("engine_proc.engine",): 6,
    ("engine_proc.main", "engine_proc.__main__"): 7,  # the process
}
ENGINE = "engine_proc"
VISION = "engine_proc.vision"
# What a text model's engine process runs: the process's entry point.
TEXT_PATH_ROOT = "engine_proc.__main__"


def floor(module: str) -> tuple[tuple[str, ...], int] | None:
    for prefixes, rank in ENGINE_FLOORS.items():
        if under(module, prefixes):
            return prefixes, rank
    return None


def against_the_floors(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Engine imports that reach a floor above, or a package side by side on the same floor."""
    wrong = []
    for m in sorted(edges):
        here = floor(m)
        if here is None:
            continue
        for t in sorted(edges[m]):
            there = floor(t)
            if there is not None and (there[1] > here[1] or (there[1] == here[1] and there[0] != here[0])):
                wrong.append((m, t))
    return wrong


def without_a_floor(modules: set[str]) -> list[str]:
    """Engine modules on no floor: a module added at the engine's top must be given one."""
    return sorted(m for m in modules if under(m, (ENGINE,)) and m != ENGINE and floor(m) is None)


def runtime_imports(module: str, path: str, modules: set[str]) -> set[str]:
    """The project modules a module imports when it is itself imported: statements at its top (and in its
    classes' bodies, and under if/try), not inside functions nor under ``if TYPE_CHECKING``."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.ClassDef, ast.With)):
                visit(node.body)

    visit(tree.body)
    # importing a.b.c runs a/__init__.py and a/b/__init__.py first
    parents = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)}
    return {m for m in found | parents if m in modules and m != module}


def loaded_from(root: str, edges: dict[str, set[str]]) -> set[str]:
    """Every module importing ``root`` loads, following ``edges``."""
    seen, todo = {root}, [root]
    while todo:
        for t in edges[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def runtime_graph() -> dict[str, set[str]]:
    found = sources(ENGINE, "cllm")
    return {m: runtime_imports(m, path, set(found)) for m, path in found.items()}


def test_the_floor_rules_find_what_they_should():
    edges = {
        "engine_proc.kv.slots": {"engine_proc.kv.prefix_cache", "engine_proc.sequence", "engine_proc.scheduler"},
        "engine_proc.kv.prefix_cache": {"engine_proc.run.model_runner"},
        "engine_proc.run.model_runner": {"engine_proc.vision.projector", "engine_proc.run.batch"},
        "engine_proc.step.recorder": {"engine_proc.scheduler", "engine_proc.sampling.sampler"},
        "engine_proc.sequence": {"engine_proc.sampling.sampler", "engine_proc.engine"},
        "engine_proc.tools": set(),
    }
    assert against_the_floors(edges) == [
        ("engine_proc.kv.prefix_cache", "engine_proc.run.model_runner"),
        ("engine_proc.kv.slots", "engine_proc.scheduler"),
        ("engine_proc.run.model_runner", "engine_proc.vision.projector"),
        ("engine_proc.sequence", "engine_proc.engine"),
    ]
    assert without_a_floor(set(edges)) == ["engine_proc.tools"]


def test_the_engine_imports_only_the_floors_below():
    assert against_the_floors(graph()) == []


def test_every_engine_module_is_on_a_floor():
    assert without_a_floor(set(graph())) == []


def test_what_is_loaded_is_found(tmp_path):
    """The runtime reading on made-up modules: a TYPE_CHECKING import and one inside a function load nothing."""
    modules = {"p", "p.a", "p.b", "p.c", "p.d"}
    tree = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": set(), "p.d": set(), "p": set()}
    assert loaded_from("p.a", tree) == {"p.a", "p.b", "p.c"}
    source = (
        "from typing import TYPE_CHECKING\nfrom p import b\nif TYPE_CHECKING:\n    from p import c\n"
        "try:\n    import p.d\nexcept ImportError:\n    pass\ndef f():\n    from p import c\n"
    )
    path = tmp_path / "a.py"
    path.write_text(source)
    assert runtime_imports("p.a", str(path), modules) == {"p", "p.b", "p.d"}


def test_a_text_model_engine_loads_no_vision():
    """engine_proc/vision/ is imported only where a projector is loaded: nothing the engine process imports at
    its start reaches it (a fresh interpreter agrees: tests/test_first_tokens.py)."""
    edges = runtime_graph()
    assert sorted(m for m in loaded_from(TEXT_PATH_ROOT, edges) if under(m, (VISION,))) == []
    assert "engine_proc.engine" in loaded_from(TEXT_PATH_ROOT, edges)
