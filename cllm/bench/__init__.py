"""`cllm bench`: the engine's step loop in-process (engine_bench) and HTTP load on a server (http_load).

The side-by-side comparisons with other servers live in the repository's perf/ folder and build on these.
"""
