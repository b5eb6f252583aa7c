"""The engine process: owns the llama.cpp model and runs the decode loop."""

import os

# llama.cpp's CPU backend runs every op of a graph on an OpenMP team whose
# threads meet at a barrier after each op. libgomp lets a waiting thread
# spin for about 3 ms (300,000 spins) before it sleeps. On idle cores the
# wait is a few microseconds, but when the cores are shared (the frontend,
# the HTTP clients, other processes) the partner thread is often not
# running, and each barrier burns a time slice: on two cores under load
# decoding ran 2-5x slower. Beside one busy program in another session
# (the scheduler then gives this session one CPU for both threads) a stream
# kept 1% of its idle speed, against 25% with a short spin
# (perf/results/2026-11-26-busy-neighbour.md). A short spin gives the core
# away under load, at ~2-3% of one sequence's speed on an otherwise idle
# machine (threads sleep at ~11 barriers a step;
# perf/results/2026-11-25-omp-spin.md). It must be in the environment before
# libgomp loads (before llama_cpp is imported); a value the user set wins:
# 300000, libgomp's default, for a dedicated machine.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
