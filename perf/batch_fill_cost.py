"""What writing a step's batch costs the text path: Batch.fill of this tree against a revision's, side by side.

    python -m perf.batch_fill_cost [--rev main] [--rounds 6] [--fills 20000]

Batch.fill runs once a step: a decode batch of 16 sequences (one token each, the plain path) and a prefill of 4
chunks of 32 tokens. The revision's engine_proc/run/batch.py (git show) and this tree's fill the same chunks of
text-only sequences in alternating rounds; each round's figure is the CPU time of one fill (process_time over
--fills fills). Prints a markdown table of medians and spreads.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

from cllm.core.protocol import SamplingParams
from engine_proc.run.batch import Batch
from engine_proc.sequence import Chunk, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def batch_at(rev: str, folder: str) -> type:
    """The Batch class of engine_proc/run/batch.py at ``rev``."""
    path = os.path.join(folder, "batch_at_rev.py")
    with open(path, "w") as f:
        f.write(subprocess.check_output(["git", "-C", ROOT, "show", f"{rev}:engine_proc/run/batch.py"], text=True))
    spec = importlib.util.spec_from_file_location("batch_at_rev", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Batch


def per_fill(batch_class: type, chunks: list[Chunk], plain: bool, fills: int) -> float:
    """Microseconds of CPU one fill takes."""
    batch, positions = batch_class(512), np.arange(4096, dtype=np.int32)
    t = time.process_time()
    for _ in range(fills):
        batch.fill(chunks, positions, plain)
    return (time.process_time() - t) / fills * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="main")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--fills", type=int, default=20000)
    args = ap.parse_args()
    seqs = []
    for i in range(16):
        seq = Sequence(i, np.arange(100, dtype=np.int32), SamplingParams(), None, slot=i)  # type: ignore[arg-type]
        seq.output.append(5)
        seq.n_cached = 100
        seqs.append(seq)
    cases = (
        ("decode, 16 sequences (plain)", [Chunk(s, 100, 101) for s in seqs], True),
        ("prefill, 4 chunks of 32", [Chunk(s, 0, 32) for s in seqs[:4]], False),
    )
    with tempfile.TemporaryDirectory() as folder:
        theirs = batch_at(args.rev, folder)
        print(f"| Batch.fill, CPU us a fill (median, spread of {args.rounds} rounds) | {args.rev} | this tree |")
        print("|---|---|---|")
        for label, chunks, plain in cases:
            a, b = [], []
            for _ in range(args.rounds):  # alternating: A B A B
                a.append(per_fill(theirs, chunks, plain, args.fills))
                b.append(per_fill(Batch, chunks, plain, args.fills))
            print(
                f"| {label} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) "
                f"| {statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) |"
            )


if __name__ == "__main__":
    main()
