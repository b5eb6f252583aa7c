"""The shared bottom: what the supervisor, the engine and the frontend all use.

Messages that cross a process boundary (protocol), the rings they cross
(ring), configuration, launching, logging, model files, the replica-picking
rule and the error every layer raises (its shape per API is the frontend's
HTTP layer's). Nothing here imports engine_proc, frontend_proc, the launchers
above it, or a web framework.
"""
