"""The embedded model in parts that fit beside a GPU run's other cargo: .gpu/model-1, -2, ... next to the bundle.

A device call carries the working tree and the ignored paths it names, 64 MiB in all. The speculation part of
the GPU run needs a model that copies (synthetic weights copy nothing): the embedded model, ~95 MiB, more than
one call carries. So it goes in parts, one a call: part 1 in what the build call has left beside the bundle
(which grows by the prebuilt CUDA libraries: perf/gpu_prebuild.sh runs this again), each later part as much as
a call carries beside the tree: call k carries .gpu/model-k. Each part's folder has the whole file's sha256 and
every part's size; perf/gpu_model_join.sh keeps the parts as they arrive and joins them once all are there.

Usage: python -m perf.gpu_model_parts BUNDLE_DIR   (GPU_CARRY_MIB: the limit a call, default 64)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

MIB = 1 << 20
MARGIN = 1 * MIB  # what the sizes here do not see: file system overheads, a results folder
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_bytes() -> int:
    """What every call carries: the files git tracks, and the untracked ones it does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    paths = (os.path.join(ROOT, p) for p in out.decode().split("\0") if p)
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def sizes(total: int, first_room: int, room: int) -> list[int]:
    """The parts' sizes: the first in ``first_room`` (none if it has no room), every later one up to ``room``."""
    if room <= 0:
        raise SystemExit(f"a call carries no more than the tree itself: nothing left for the model (room {room})")
    parts = [min(total, first_room)] if first_room > 0 else [0]
    while sum(parts) < total:
        parts.append(min(room, total - sum(parts)))
    return parts


def split(model: str, out: str, first_room: int, room: int) -> list[int]:
    """Write the parts under ``out`` (model-1/part, ...), each folder with the whole file's sha256 and every part's
    size; the sizes (the first may be 0: part 1 then has no folder)."""
    with open(model, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    parts = sizes(len(data), first_room, room)
    at = 0
    for k, n in enumerate(parts, 1):
        if not n:
            continue
        folder = os.path.join(out, f"model-{k}")
        os.makedirs(folder)
        with open(os.path.join(folder, "part"), "wb") as f:
            f.write(data[at : at + n])
        with open(os.path.join(folder, "sha256"), "w") as f:
            f.write(f"{digest}\n")
        with open(os.path.join(folder, "sizes"), "w") as f:
            f.write(" ".join(map(str, parts)) + "\n")
        at += n
    return parts


def main() -> None:
    bundle = sys.argv[1]
    out = os.path.dirname(os.path.abspath(bundle))
    for name in os.listdir(out):
        if name.startswith("model-"):
            shutil.rmtree(os.path.join(out, name))
    try:
        from cllm.core.model_file import embedded_model_path

        model = embedded_model_path()
    except Exception:  # noqa: BLE001 - no embedded model here: the run goes without its speculation part
        print("no embedded model here: the GPU run's speculation part will be skipped")
        return
    limit = int(os.environ.get("GPU_CARRY_MIB", "64")) * MIB
    tree, cargo = tree_bytes(), folder_bytes(bundle)
    room = limit - tree - MARGIN
    if cargo > room:
        raise SystemExit(
            f"{bundle} ({cargo / MIB:.1f} MiB) beside the tree ({tree / MIB:.1f} MiB) is more than a device call "
            f"carries ({limit // MIB} MiB, less {MARGIN // MIB} to spare)"
        )
    print(f"call 1 with {bundle}: {(tree + cargo) / MIB:.1f} MiB with the tree")
    parts = split(model, out, room - cargo, room)
    where = os.path.relpath(out, ROOT)
    calls = [f"call {k} with {where}/model-{k} ({n / MIB:.1f} MiB)" for k, n in enumerate(parts, 1) if n]
    print(f"embedded model in {len([n for n in parts if n])} parts (call 1 also carries {bundle}): " + ", ".join(calls))


if __name__ == "__main__":
    main()
