"""The embedded model's parts for a GPU run: sized to the device's carry limit, joined only once all have come."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from perf.gpu_model_parts import ROOT, sizes, split


def test_parts_fill_each_call_and_part_one_only_what_the_bundle_leaves():
    assert sizes(95, 40, 55) == [40, 55]
    assert sizes(95, 10, 55) == [10, 55, 30]
    assert sizes(95, -5, 55) == [0, 55, 40]  # the bundle fills call 1: the model starts with call 2
    assert sizes(30, 40, 55) == [30]


def joined(work: str, bundle: str) -> str:
    """What perf/gpu_model_join.sh names after a call with what is under bundle's folder now ('' if nothing)."""
    script = f'WORK={work} BUNDLE={bundle}; . perf/gpu_model_join.sh; printf %s "$GPU_REAL_MODEL"'
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_the_parts_are_joined_once_every_one_has_come_with_its_call(tmp_path):
    model = tmp_path / "model.gguf"
    data = os.urandom(5000)
    model.write_bytes(data)
    out = tmp_path / "gpu"
    out.mkdir()
    assert split(str(model), str(out), first_room=0, room=2000) == [0, 2000, 2000, 1000]
    assert not (out / "model-1").exists()
    work = tmp_path / "work"
    work.mkdir()
    bundle = out / "bundle"
    held = tmp_path / "held"
    shutil.move(out, held)  # each call brings its own part, as the device's calls do
    for k in (2, 3, 4):
        out.mkdir(exist_ok=True)
        shutil.copytree(held / f"model-{k}", out / f"model-{k}")
        got = joined(str(work), str(bundle))
        if k < 4:
            assert got == "" and not (work / "real-model.gguf").exists(), k
        shutil.rmtree(out)
    assert got.endswith("/real-model.gguf") and Path(got).read_bytes() == data
    assert (work / "sha256").read_text().split()[0] == hashlib.sha256(data).hexdigest()
