"""Make `import llama_cpp` give llama-cpp-python's ctypes bindings without its high-level layer.

The package's __init__ runs `from .llama_cpp import *` (the bindings cllm calls) and `from .llama import *`:
the Llama class with its chat formats, which imports numpy and jinja2 and cost each process that imports it
~0.17 CPU s (perf/results/2026-11-28-startup-imports.md), though no cllm process uses it. bare() puts the package
in sys.modules with the bindings' names alone; a name only the high-level layer has (`llama_cpp.Llama`) runs the
rest of the __init__ on first use, so any code still finds what it looked for (`__version__` is read from it).
The engine and frontend packages call it before anything of theirs imports llama_cpp.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

PACKAGE = "llama_cpp"


def bare() -> None:
    """Once per process, before llama_cpp's first import; a no-op when it was imported already."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None:
        return  # not installed: the import that needs it says so
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    try:
        bindings = importlib.import_module(PACKAGE + ".llama_cpp")
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    package.__dict__.update(_public(bindings))
    package.__dict__["__getattr__"] = _rest_of_init(package, spec)


def _public(module: ModuleType) -> dict[str, object]:
    """What `from module import *` takes."""
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    return {n: getattr(module, n) for n in names}


def _rest_of_init(package: ModuleType, spec):
    def rest(name: str):
        if name == "__version__" and (
            found := re.search(r'^__version__ = "([^"]+)"', spec.loader.get_source(PACKAGE), re.M)
        ):
            package.__dict__["__version__"] = found[1]  # read, not run: the engine's cache files and /props name it
            return found[1]
        if name.startswith("__"):
            raise AttributeError(name)  # Python's own probes (__wrapped__ ...) need nothing more
        del package.__dict__["__getattr__"]
        exec(spec.loader.get_code(PACKAGE), package.__dict__)  # the __init__ itself, its first line now a no-op
        return getattr(package, name)

    return rest
