"""The launchers and optional integrations (cllm/cli.py, supervisor.py, spawn.py, docs_config.py, ray_serve/,
bench/) sit above the processes, which sit above cllm/core: the package `cllm` holds both the bottom and the
top, so these rules keep its two halves apart (tests/unit/test_layers.py reads the imports)."""

from __future__ import annotations

import ast
import os

from tests.conftest import ROOT
from tests.unit.test_layers import graph, sources, under

BOTTOM = ("cllm.core",)
PROCESSES = ("engine_proc", "frontend_proc")


def test_importing_the_bottom_loads_no_launcher():
    """`import cllm.core.x` runs cllm/__init__.py first: it imports nothing."""
    with open(os.path.join(ROOT, "cllm", "__init__.py")) as f:
        tree = ast.parse(f.read())
    assert [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] == []


def test_the_processes_import_only_the_bottom_of_cllm():
    edges = graph()
    upward = sorted(
        (m, t) for m in edges if under(m, PROCESSES) for t in edges[m] if under(t, ("cllm",)) and not under(t, BOTTOM)
    )
    assert upward == []


def test_the_bottom_starts_no_process_by_name():
    """Which module a child process runs (`python -m engine_proc`) is the launchers' choice (cllm/spawn.py)."""
    named = []
    for module, path in sources(os.path.join("cllm", "core")).items():
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and under(node.value, PROCESSES):
                named.append((module, node.value))
    assert named == []
