"""The container image: built from the Dockerfile, started, healthy, and answering one request.

Needs a Docker daemon and a Debian base image (no registry may be reachable: `make test-docker`
says how to make one with debootstrap). Skipped otherwise; the build compiles llama.cpp, so it is
not part of `make test`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import httpx
import pytest

from tests.conftest import ROOT, free_port

BASE = os.environ.get("CLLM_DOCKER_BASE", "debian:bookworm-slim")
IMAGE = "cllm:test"


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _usable() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command"
    if docker("info").returncode != 0:
        return "no Docker daemon answers"
    if docker("image", "inspect", BASE).returncode != 0:
        return f"no base image {BASE} (make test-docker builds one)"
    return None


pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def image():
    why = _usable()
    if why:
        pytest.skip(why)
    build = docker(
        "build",
        "--network",
        "host",
        "-t",
        IMAGE,
        "--build-arg",
        f"BUILD_BASE={BASE}",
        "--build-arg",
        f"RUNTIME_BASE={BASE}",
        ROOT,
        timeout=3600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE


def test_the_image_runs_as_a_user_reports_healthy_and_answers(image):
    port = free_port()
    # Host networking: the daemon here may run without a bridge; the port option follows the entry point's.
    run = docker(
        "run",
        "-d",
        "--rm",
        "--network",
        "host",
        "-e",
        f"CLLM_HEALTH_URL=http://127.0.0.1:{port}/health",
        image,
        "--port",
        str(port),
    )
    assert run.returncode == 0, run.stderr
    container = run.stdout.strip()
    try:
        assert docker("exec", container, "id", "-u").stdout.strip() != "0"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=60,
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        # Docker's own health check (HEALTHCHECK on /health) turns healthy at its first run, 15 s in.
        deadline = time.monotonic() + 90
        status = ""
        while time.monotonic() < deadline and status != "healthy":
            status = docker("inspect", "-f", "{{.State.Health.Status}}", container).stdout.strip()
            time.sleep(1)
        assert status == "healthy"
    finally:
        docker("rm", "-f", container)
