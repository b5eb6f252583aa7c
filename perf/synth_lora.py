"""A made LoRA adapter for a GGUF model: random low-rank updates, strong enough to change greedy text at sight.

    python -m perf.synth_lora OUT.gguf [--base MODEL.gguf] [--rank 8] [--strength 0.3] [--seed 0]

llama.cpp's adapter format (convert_lora_to_gguf.py writes it; llama-adapter.cpp reads it): a GGUF with
``general.type`` = ``adapter``, ``general.architecture`` the base model's, ``adapter.type`` = ``lora`` and
``adapter.lora.alpha``; for each adapted weight W (ne = [n_in, n_out]) two tensors, ``W.lora_a`` (ne = [n_in,
rank]) and ``W.lora_b`` (ne = [rank, n_out]), and W x becomes W x + scale * alpha / rank * B (A x). Here alpha =
rank, so the scale a server applies (``--lora-scaled FILE:SCALE``, a request's ``lora``) is the update's own.

No adapter for the embedded SmolLM2 comes this small or is reachable from this machine, so one is made: for
``attn_v`` and ``ffn_down`` of every layer, B A with an RMS ``strength`` times the base weight's (read from the
base file, dequantized by the ``gguf`` package), random with a fixed seed: the same bytes every time. Random
updates test the path (loading, scales, batching by adapter, the prefix cache's keys, parity with llama-server),
never what an adapter teaches. ``cached()`` makes it once into perf/cache/models/.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import numpy as np

from perf import synth_model

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache", "models")
TARGETS = ("attn_v.weight", "ffn_down.weight")  # the weights adapted, in every layer


def write(path: str, base: str, rank: int = 8, strength: float = 0.3, seed: int = 0) -> str:
    """The adapter for ``base`` to ``path`` (written whole to a temporary name first)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(base)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    rng = np.random.default_rng(seed)
    part = f"{path}.{os.getpid()}.part"
    writer = gguf.GGUFWriter(part, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    writer.add_name("cllm synthetic LoRA (random low-rank updates, tests the adapter path)")
    for t in sorted(reader.tensors, key=lambda t: t.name):
        if not t.name.endswith(TARGETS):
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # ggml's ne order
        rms = float(np.sqrt(np.mean(np.square(dequantize(t.data, t.tensor_type).astype(np.float64)))))
        a = rng.standard_normal((rank, n_in)).astype(np.float32)  # numpy's order is ne reversed
        b = (rng.standard_normal((n_out, rank)) * (strength * rms / np.sqrt(rank))).astype(np.float32)
        writer.add_tensor(t.name + ".lora_a", a)
        writer.add_tensor(t.name + ".lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(part, path)
    return path


def cached(base: str | None = None, strength: float = 0.3) -> str:
    """The made adapter of ``base`` (the embedded model by default) in perf/cache/models/, made on first use."""
    if base is None:
        from cllm.core.model_file import embedded_model_path

        base = embedded_model_path()
    st = os.stat(base)
    key = hashlib.sha256(f"{os.path.realpath(base)}:{st.st_size}:{strength}".encode()).hexdigest()[:12]
    return synth_model.made(os.path.join(CACHE, f"lora-{key}.gguf"), lambda p: write(p, base, strength=strength))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--base", help="the base model (default: the embedded SmolLM2)")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--strength", type=float, default=0.3, help="the update's RMS over the base weight's")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.base is None:
        from cllm.core.model_file import embedded_model_path

        a.base = embedded_model_path()
    print(write(a.out, a.base, a.rank, a.strength, a.seed))


if __name__ == "__main__":
    main()
