"""The GPU run's pieces: synthetic models (always), and the whole prepared run dry on this CPU (`make test-gpu-dry`).

The dry run is the device's own sequence, scripts unchanged: perf/gpu_bundle.sh (wheels for this interpreter),
perf/gpu_build.sh (a CPU build of the same llama.cpp source: long), perf/gpu_run.sh with GPU_RUN_DRY=1.
It runs only with CLLM_GPU_DRY=1, so `make test` leaves the build out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import psutil
import pytest

from cllm.core.model_file import embedded_model_path
from perf import gguf_io, gpu_report, synth_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = b"<|im_start|>user\nHello world, caf\xc3\xa9 \xe2\x82\xac 12345<|im_end|>"


def _load(path: str):
    import llama_cpp as L

    from cllm.core.llama_log import silence_llama_logs

    silence_llama_logs()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    assert model, f"llama.cpp could not load {path}"
    return L, model


def _tokens(L, model) -> list[int]:
    vocab = L.llama_model_get_vocab(model)
    buf = (L.llama_token * 256)()
    n = L.llama_tokenize(vocab, TEXT, len(TEXT), buf, 256, False, True)
    return list(buf[:n])


def _logits(L, model, tokens: list[int]) -> np.ndarray:
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 256, 256, 1, 1
    ctx = L.llama_init_from_model(model, params)
    try:
        arr = (L.llama_token * len(tokens))(*tokens)
        assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(tokens))) == 0
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    finally:
        L.llama_free(ctx)


@pytest.mark.parametrize("quant", ["q4_k_m", "q8_0", "f16"])
def test_synthetic_model_runs_with_the_embedded_tokenizer(tmp_path, quant):
    path = synth_model.synthesize("tiny", str(tmp_path / "tiny.gguf"), quant, jobs=2)
    L, model = _load(path)
    L_, embedded = _load(embedded_model_path())
    try:
        tokens = _tokens(L, model)
        assert tokens == _tokens(L_, embedded)  # the same vocabulary, merges and special tokens
        assert L.llama_model_n_embd(model) == synth_model.PRESETS["tiny"].n_embd
        assert L.llama_model_n_layer(model) == synth_model.PRESETS["tiny"].n_layer
        logits = _logits(L, model, tokens)
        assert np.isfinite(logits).all() and 0.1 < logits.std() < 100  # random, but a usable distribution
    finally:
        L.llama_model_free(model)
        L.llama_model_free(embedded)


def test_synthetic_model_is_the_same_file_every_time(tmp_path):
    a = synth_model.synthesize("tiny", str(tmp_path / "a.gguf"), jobs=1)
    b = synth_model.synthesize("tiny", str(tmp_path / "b.gguf"), jobs=2)
    c = synth_model.synthesize("tiny", str(tmp_path / "c.gguf"), seed=1, jobs=2)
    with open(a, "rb") as fa, open(b, "rb") as fb, open(c, "rb") as fc:
        da, db, dc = fa.read(), fb.read(), fc.read()
    assert da == db and da != dc
    meta = gguf_io.read_metadata(a)
    assert "for speed only" in meta["general.name"][1]
    assert meta["general.file_type"][1] == synth_model.FILE_TYPE["q4_k_m"]


def test_presets_have_the_shapes_they_are_named_for():
    def params(preset: str) -> float:
        shape = synth_model.PRESETS[preset]
        return sum(int(np.prod(d)) for _, d, _ in synth_model.tensors(shape, shape.quant)) / 1e9

    assert 0.13 < params("smollm2") < 0.14  # SmolLM2-135M
    assert 1.0 < params("1b") < 1.3  # llama-3.2-1B's layers, the smaller vocabulary
    assert 7.0 < params("8b") < 7.6  # llama-3-8B's layers, the smaller vocabulary
    types = {n: t for n, _, t in synth_model.tensors(synth_model.PRESETS["8b"], "q4_k_m")}
    assert types["output.weight"] == synth_model.Q6_K and types["blk.5.attn_q.weight"] == synth_model.Q4_K
    assert types["blk.0.ffn_down.weight"] == synth_model.Q6_K and types["blk.5.ffn_down.weight"] == synth_model.Q4_K


def test_report_table_divides_the_right_cells(tmp_path):
    rows = [
        {"system": "raw", "concurrency": 32, "sampled": False, "tokens_per_second": 1000.0},
        {"system": "llama-server", "concurrency": 32, "sampled": False, "tokens_per_second": 800.0, "errors": 0},
        {"system": "llama-server -bs", "concurrency": 32, "sampled": False, "tokens_per_second": 900.0, "errors": 0},
        {"system": "cllm", "concurrency": 32, "sampled": False, "tokens_per_second": 950.0, "errors": 0},
        {
            "system": "cllm",
            "memory": {"rss_mib": 700, "vram_mib": 5000, "reported_mib": {"model": 4, "kv": 3, "compute": 2}},
        },
    ]
    doc = {
        "device": "test",
        "dry": False,
        "date": "today",
        "command": "x",
        "prompt_tokens": 26,
        "gen_tokens": 64,
        "parallel": 64,
        "seq_ctx": 122,
        "threads": 8,
        "models": {"8b": {"results": rows}},
        "skipped": [],
        "notes": [],
    }
    (tmp_path / "results.json").write_text(json.dumps(doc))
    gpu_report.render(str(tmp_path))
    md = (tmp_path / "results.md").read_text()
    assert "| 32 | greedy | 1,000 | 800 | 900 | 950 | 0.95 | 1.06 | 1.19 |" in md
    assert "| cllm | 700 | 5000 | 4 / 3 / 2 |" in md
    assert "SPEED only" in md


@pytest.mark.skipif(
    os.environ.get("CLLM_GPU_DRY") != "1", reason="the dry GPU run compiles llama.cpp: make test-gpu-dry"
)
def test_gpu_run_dry_on_this_cpu(tmp_path):
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "GPU_RUN_DRY": "1",
        "GPU_BUNDLE": ".gpu/dry/bundle",
        "GPU_WORK": ".gpu/dry/work",
        "GPU_PYVER": f"{sys.version_info.major}.{sys.version_info.minor}",
        "JOBS": os.environ.get("JOBS", "2"),
    }
    for script, timeout in (("perf/gpu_bundle.sh", 600), ("perf/gpu_build.sh", 3600)):
        done = subprocess.run(["bash", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{script}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "llama_cpp loads" in done.stdout and "gpu_build:" in done.stdout
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "perf/gpu_run.sh", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    models = os.path.join(ROOT, ".gpu", "dry", "work")
    left = [
        p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if any(models in w for w in p.info["cmdline"] or ())
    ]
    assert not left, left  # every server it started was stopped

    doc = json.loads((out / "results.json").read_text())
    assert doc["dry"] and not doc["notes"], doc["notes"]
    rows = doc["models"]["tiny"]["results"]
    for system in ("raw", "llama-server", "cllm", "cllm device sampling"):
        cells = {(r["concurrency"], r["sampled"]) for r in rows if r["system"] == system and "tokens_per_second" in r}
        want = {(1, False), (4, False)} | (set() if system == "raw" else {(4, True)})
        assert cells == want, (system, cells)
        if system != "raw":
            assert any(r["system"] == system and r.get("memory", {}).get("rss_mib", 0) > 0 for r in rows)
        if system.startswith("cllm"):  # and what its engine's llama.cpp says it holds
            assert any(
                r.get("memory", {}).get("reported_mib", {}).get("compute", 0) > 0 for r in rows if r["system"] == system
            )
    assert all(not r.get("errors") and r.get("short", 0) == 0 for r in rows if "tokens_per_second" in r)
    spec = doc["speculation"]["results"][0]["table"]  # the carried model, joined and checked
    assert spec.startswith("| workload |") and "cllm ÷ best llama-server | cllm ÷ cllm-nospec |" in spec
    sweep = doc["models"]["tiny"]["engine"]  # cllm bench engine --sweep: host us per step beside llama_decode's
    assert {(r["arrivals"], r["steady"], r["device_sampling"], r["concurrency"], r["sampled"]) for r in sweep} == {
        (a, on, device, c, s)
        for a, on, device in (("lockstep", False, False), ("lockstep", False, True), ("staggered", True, False))
        for c in (1, 8, 32, 64)
        for s in (False, True)
    }  # a CPU build: auto is off
    assert all(r["host_us_per_step"]["cpu"]["host"] > 0 and r["decode_ms"] > 0 and r["decode_steps"] > 0 for r in sweep)
    (turn,) = doc["models"]["tiny"]["restart"]  # the next turn after a restart: served from the file
    assert turn["after restart"]["cached"] > 0 and turn["disk_hits"] == 1, turn
    with tarfile.open(out / "logs.tgz") as logs:  # the servers' logs in one file: a device call returns 8 at most
        assert any(n.endswith("cllm.log") for n in logs.getnames()), logs.getnames()
    assert not (out / "logs").exists()
    md = (out / "results.md").read_text()
    assert "| after ÷ no restart |" in md
    assert "| 4 | 0.7 / 0.9 |" in md and "SPEED only" in md and "host share" in md
