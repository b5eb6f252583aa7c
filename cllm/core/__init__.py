"""The shared bottom: what the supervisor, the engine and the frontend all use.

Messages that cross a process boundary (protocol), the rings they cross
(ring), configuration, launching, logging, model files, the replica-picking
rule and the error shapes. Nothing here imports engine_proc, frontend_proc
or the launchers above it.
"""
