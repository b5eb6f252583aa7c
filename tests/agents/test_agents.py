"""Claude Code and Codex CLI, as published (tests/agents/package.json pins them), run against `cllm serve`.

Each completes a plain turn and a turn that asks for one of its own tools, as
a new user would run them: `claude -p` with ANTHROPIC_BASE_URL, `codex exec`
with a `model_providers` entry on the Responses API. Each request they send
carries their whole system prompt and every tool they offer (~12k tokens for
Claude Code), so the server holds 16k cells for one sequence and sets no
deadline; a run's second turn reads the first's prefix from the cache.

The answers do not matter: the server must have answered every request with
200, ending each with stop or length, and the run must end with exit 0. One
outcome is the model's, not the server's: the embedded 135M model often writes
no end past its 8k training context (4 of 6 samples of Claude Code's recorded
~12k-token turn ran to 256 tokens) and now and then within it (1 of 5 of
Codex's ~6k-token turn ran past 1,024). Claude Code asks
for at most CLAUDE_CODE_MAX_OUTPUT_TOKENS; a reply cut there it asks to go on,
up to three times, and when the last is cut too it exits 1 with "exceeded the
256 output token maximum" (as it does against llama-server). Codex names no
limit, so the server caps each reply (--max-tokens 512, else it would run for
the ~10k tokens left in the sequence), and a reply cut there ends its run with
exit 1, "Incomplete response returned, reason: max_output_tokens". Those exits
are accepted only after a last reply cut at length. `make test-agents`
installs the CLIs and runs this; without CLLM_TEST_AGENTS=1 it is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "node_modules", ".bin")
RUN_TIMEOUT = 1800  # one long prefill on a slow CPU

if not os.environ.get("CLLM_TEST_AGENTS"):
    pytest.skip("the coding agents run in `make test-agents`", allow_module_level=True)

# Nothing but the server: no telemetry, update checks or error reports (the network may be off).
CLAUDE_ENV = {
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "ANTHROPIC_API_KEY": "sk-local",
    "API_TIMEOUT_MS": str(RUN_TIMEOUT * 1000),
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",
}
# What each says, exiting 1, when its last reply was cut at its limit (stop_reason max_tokens, status incomplete).
CLAUDE_CUT = "Claude's response exceeded the 256 output token maximum"
CODEX_CUT = "Incomplete response returned, reason: max_output_tokens"
CODEX_CONFIG = """\
model = "smollm2"
model_provider = "cllm"
check_for_update_on_startup = false

[model_providers.cllm]
name = "cllm"
base_url = "{url}/v1"
wire_api = "responses"
stream_idle_timeout_ms = {idle_ms}

[analytics]
enabled = false

[feedback]
enabled = false
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home and a project directory of their own: nothing of the user's settings is read."""
    root = tmp_path_factory.mktemp("agents")
    (root / "home").mkdir()
    (root / "project").mkdir()
    (root / "project" / "notes.txt").write_text("a file for the agent to list\n")
    return root


def run(argv: list[str], home, env: dict) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(home / "home"), "LANG": "C.UTF-8"}
    return subprocess.run(
        argv,
        cwd=home / "project",
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def answered(server, route: str, before: int) -> list[str]:
    """How the requests to ``route`` logged since line ``before`` of the server's log ended: "200 stop", ...

    A request is logged once its response is sent, so the client may exit first: wait (bounded) for a quiet log.
    """
    seen, deadline = -1, time.monotonic() + 10
    while seen != len(server.stderr_lines) and time.monotonic() < deadline:
        seen = len(server.stderr_lines)
        time.sleep(1)
    pattern = re.compile(rf"route={re.escape(route)} status=(\d+) .*finish_reason=(\w+)")
    return [" ".join(m.groups()) for line in server.stderr_lines[before:] if (m := pattern.search(line))]


def check(done: subprocess.CompletedProcess, server, route: str, before: int, cut: str | None = None) -> None:
    """Every request answered 200 (stop or length), and exit 0, unless the client's ``cut`` message follows a last reply
    cut at length."""
    ends = answered(server, route, before)
    assert ends and all(e in ("200 stop", "200 length") for e in ends), (ends, done.stdout + done.stderr)
    if done.returncode != 0 and cut is not None and ends[-1] == "200 length":
        assert cut in done.stdout + done.stderr, done.stdout + done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr


def claude(server, home, *args: str) -> subprocess.CompletedProcess:
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": server.url, "CLAUDE_CONFIG_DIR": str(home / "home" / ".claude")}
    return run([os.path.join(BIN, "claude"), "-p", *args, "--model", "smollm2"], home, env)


def codex(server, home, prompt: str) -> subprocess.CompletedProcess:
    codex_home = home / "home" / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(url=server.url, idle_ms=RUN_TIMEOUT * 1000))
    return run(
        [os.path.join(BIN, "codex"), "exec", "--skip-git-repo-check", prompt], home, {"CODEX_HOME": str(codex_home)}
    )


@pytest.mark.parametrize(
    "args",
    [
        ("Say hello.", "--max-turns", "1"),
        ("List the files in this directory.", "--max-turns", "3", "--allowedTools", "Bash"),
    ],
    ids=["plain", "tools"],
)
def test_claude_code(server, home, args):
    before = len(server.stderr_lines)
    check(claude(server, home, *args), server, "/v1/messages", before, CLAUDE_CUT)


@pytest.mark.parametrize("prompt", ["Say hello.", "List the files in this directory."], ids=["plain", "tools"])
def test_codex(server, home, prompt):
    before = len(server.stderr_lines)
    check(codex(server, home, prompt), server, "/v1/responses", before, CODEX_CUT)
