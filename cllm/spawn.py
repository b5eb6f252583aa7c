"""How the launchers start the two processes: `python -m engine_proc` or `python -m frontend_proc`, each with its
Launch in argv. It lives up here, not in cllm/core, because naming the process packages is the launchers' business."""

from __future__ import annotations

import os
import subprocess

from cllm.core.launch import EngineRings, Launch
from cllm.core.registry import ModelSpec


def child_env(api_key: str | None = None) -> dict[str, str]:
    """A child process's environment: never the API key, but for the frontend that checks it (``api_key``)."""
    env = {k: v for k, v in os.environ.items() if k != "CLLM_API_KEY"}
    if api_key is not None:
        env["CLLM_API_KEY"] = api_key
    return env


def spawn_engine(spec: ModelSpec, rings: EngineRings, replica: int, lifeline: int, generation: int) -> subprocess.Popen:
    """Start one engine process on its rings, in its own session (a terminal's Ctrl-C is for its parent)."""
    launch = Launch(
        config=spec.config,
        model_path=spec.path,
        rings=rings,
        model_id=spec.id,
        replica=replica,
        lifeline=lifeline,
        generation=generation,
    )
    return subprocess.Popen(launch.argv("engine_proc"), pass_fds=launch.fds(), env=child_env(), start_new_session=True)


def spawn_frontend(launch: Launch, api_key: str | None) -> subprocess.Popen:
    """Start the frontend process, the only one that gets the API key (in its environment, never in argv)."""
    env = child_env(api_key)
    return subprocess.Popen(launch.argv("frontend_proc"), pass_fds=launch.fds(), env=env, start_new_session=True)
