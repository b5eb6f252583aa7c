"""What each process imports before it serves: every module costs each server start its CPU (~70 starts in
`make test`), so the heavy ones nothing at start-up uses stay out (perf/results/2026-11-28-startup-imports.md).

Each check runs a fresh interpreter, as the processes start; none loads a model. What start-up then runs (main(),
the tokenizer, the engine's load) is checked on a served server's memory maps, in
tests/test_lifecycle.py::test_the_processes_start_without_the_heavy_modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# module -> (what it must have imported, so the check means something; what it must not have)
PROCESSES = {
    # llama-cpp-python's high-level layer (numpy, jinja2, its chat formats), numpy, importlib.metadata
    "frontend_proc.main": (
        ["llama_cpp.llama_cpp", "jinja2"],
        ["llama_cpp.llama", "numpy", "importlib.metadata", "psutil"],
    ),
    "engine_proc.main": (["llama_cpp.llama_cpp", "numpy"], ["llama_cpp.llama", "jinja2", "importlib.metadata"]),
    "cllm.supervisor": (["msgspec"], ["llama_cpp", "numpy", "importlib.metadata"]),
    "cllm.cli": (["msgspec"], ["llama_cpp", "numpy", "importlib.metadata"]),
}


def imported(code: str) -> list[str]:
    """sys.modules after ``code`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", PROCESSES)
def test_a_process_imports_nothing_heavy_it_does_not_start_on(module):
    loaded = set(imported(f"import {module}"))
    needed, heavy = PROCESSES[module]
    assert set(needed) <= loaded
    assert not set(heavy) & loaded


def test_the_bare_llama_cpp_package_still_gives_every_name():
    code = """
import sys
import frontend_proc, llama_cpp
from importlib.metadata import version
assert llama_cpp.llama_tokenize and llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO == -1
assert llama_cpp.__version__ == version("llama_cpp_python"), llama_cpp.__version__
assert "llama_cpp.llama" not in sys.modules  # the version is read, not run
assert llama_cpp.Llama.__name__ == "Llama" and llama_cpp.LlamaGrammar  # the rest of the __init__, on first use
"""
    assert "llama_cpp.llama" in imported(code)


def test_the_frontends_uvicorn_loads_no_websocket_library():
    code = """
from starlette.applications import Starlette
from cllm.core.config import ServeConfig
from frontend_proc.main import uvicorn_config
uvicorn_config(Starlette(), ServeConfig()).load()
"""
    loaded = imported(code)
    assert "uvicorn.protocols.http.httptools_impl" in loaded  # load() ran
    assert not [m for m in loaded if m.startswith(("websockets", "wsproto", "uvicorn.protocols.websockets"))]
