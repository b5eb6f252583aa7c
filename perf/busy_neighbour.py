"""One stream at c=1 beside a busy program that is not the server's: what a server keeps of its idle speed.

The neighbour is `yes > /dev/null` in a session of its own, as a build in
another terminal or another service would be. Linux shares the CPUs between
sessions (autogroups; cgroups do the same for services and containers) before
it shares them between threads, so against one busy neighbour a server's
llama.cpp threads get about one CPU of two and must take turns on it. A
thread that spins at a barrier then burns the time slice its partner needed;
cllm's engine goes down to the one thread it gets CPU for (docs/internals.md: Threads).

Each server in turn, alone with the neighbour: its ~700-token prompt cached,
one streamed request before the neighbour starts (idle), then --requests
streamed ones beside it; output tok/s of each.

    .venv/bin/python -m perf.busy_neighbour [--requests 3] [--tokens 48] [--no-peer]
        [--also=--fixed-threads]         (another cllm server, on all its threads whatever the load)
        [--also GOMP_SPINCOUNT=1000]     (another cllm server, that variable in its environment)
        [--peer-env GOMP_SPINCOUNT=1000] (llama-server with that variable)
"""

from __future__ import annotations

import argparse
import subprocess

import httpx

from perf import servers
from perf.prefix_cache import handbook, stream

TIMEOUT = 1800.0  # a collapsed server makes a few tokens a second


def rates(server: servers.Server, prompt: str, requests: int, tokens: int) -> tuple[float, list[float]]:
    """Tok/s of one streamed request alone, then of each beside a busy neighbour in a session of its own."""
    body = {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        stream(client, "/v1/completions", {**body, "max_tokens": 4})  # graphs built, prompt cached
        r = stream(client, "/v1/completions", body)
        idle = r.completion_tokens / r.seconds
        neighbour = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            busy = []
            for _ in range(requests):
                r = stream(client, "/v1/completions", body)
                busy.append(r.completion_tokens / r.seconds)
        finally:
            neighbour.kill()
            neighbour.wait()
    return idle, busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=4096)
    ap.add_argument("--requests", type=int, default=3, help="streamed requests beside the neighbour, per server")
    ap.add_argument("--tokens", type=int, default=48, help="tokens a request")
    ap.add_argument("--no-peer", action="store_true", help="cllm servers only (llama-server makes ~0.5 tok/s here)")
    servers.add_variant_arguments(ap)
    args = ap.parse_args()
    runs = [r for r in servers.variants(ap, args) if not (args.no_peer and r[1] == "llama-server")]
    settings = servers.settings_of(args)
    prompt = handbook(3, 32)[:3000]
    print(
        f"# one busy neighbour, c=1, {args.tokens} tokens a streamed request; {args.threads} threads; "
        f"llama-server's environment: {' '.join(args.peer_env) or 'as is'}\n"
    )
    print("| server | idle tok/s | beside the neighbour, tok/s | share of idle |")
    print("|---|---|---|---|")
    for i, (name, system, words) in enumerate(runs):
        env, extra = servers.env_and_args(words)
        tree, extra = servers.tree_and_args(extra)
        with servers.start(system, settings, env=env, args=extra, tree=tree, label=f"{system}-{i}") as server:
            idle, busy = rates(server, prompt, args.requests, args.tokens)
        shares = ", ".join(f"{b / idle:.2f}" for b in busy)
        print(f"| {name} | {idle:.1f} | {', '.join(f'{b:.1f}' for b in busy)} | {shares} |", flush=True)


if __name__ == "__main__":
    main()
