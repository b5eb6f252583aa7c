"""Claude Code and Codex CLI, as published (tests/agents/package.json pins them), run against `cllm serve`.

Each completes a plain turn and a turn that asks for one of its own tools, as
a new user would run them: `claude -p` with ANTHROPIC_BASE_URL, `codex exec`
with a `model_providers` entry on the Responses API. Each request they send
carries their whole system prompt and every tool they offer (~12k tokens for
Claude Code), so the server holds 16k cells for one sequence and sets no
deadline; a run's second turn reads the first's prefix from the cache.

They talk to the server through a recording proxy (tests/agents/proxy.py)
that makes every turn greedy (temperature 0, a seed, one fixed date in their
prompts), so a run is the same every time, and keeps each request and reply.
A plain turn must exit 0, every request answered 200, its last reply ended by
the model (end of sequence, not its length limit), and the CLI must print
that reply. A tools turn must get a reply that calls a tool, and a later
request must carry that call's result: the `ls` the agent ran, naming the
project's one file. `make test-agents` installs the CLIs and runs this;
without CLLM_TEST_AGENTS=1 it is skipped.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.agents.proxy import Exchange, Proxy

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
PLAIN = "Say hello."
TOOLS = "List the files in this directory."
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


def exchanges(proxy: Proxy, route: str, before: int) -> list[Exchange]:
    """The requests to ``route`` since exchange ``before``: each answered 200."""
    seen = [e for e in proxy.exchanges[before:] if e.path == route]
    assert seen and all(e.status == 200 for e in seen), [(e.status, e.content[:300]) for e in seen]
    return seen


def check_plain(done: subprocess.CompletedProcess, proxy: Proxy, route: str, before: int) -> None:
    """Exit 0, a reply that ended at end of sequence, and the CLI printing that reply."""
    output = done.stdout + done.stderr
    replies = [e.reply() for e in exchanges(proxy, route, before)]
    assert done.returncode == 0, output
    assert any(r.end == "stop" for r in replies), [(r.end, r.text[:100]) for r in replies]
    last = replies[-1]
    assert last.end == "stop" and last.text.strip() and last.text.strip() in done.stdout, (last, done.stdout)


def check_tools(done: subprocess.CompletedProcess, proxy: Proxy, route: str, before: int, results) -> None:
    """A reply that called a tool, then a request carrying that call's result: the tool ran, on the project's files."""
    seen = exchanges(proxy, route, before)
    output = done.stdout + done.stderr
    called = [(i, call) for i, e in enumerate(seen) for call in e.reply().calls]
    assert called, ([(r.end, r.text[:100]) for r in map(Exchange.reply, seen)], output)
    i, call = called[0]
    carried = [result for e in seen[i + 1 :] for result in results(e.body, call.id)]
    assert carried and "notes.txt" in carried[0], (call, carried, output)


def tool_results(body: dict, call_id: str) -> list[str]:
    """Anthropic: the text of each tool_result block naming ``call_id``."""
    out = []
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_result" and block["tool_use_id"] == call_id:
                content = block.get("content", "")
                out.append(content if isinstance(content, str) else "".join(b.get("text", "") for b in content))
    return out


def call_outputs(body: dict, call_id: str) -> list[str]:
    """The Responses API: the output of each function_call_output item naming ``call_id``."""
    items = body["input"] if isinstance(body["input"], list) else []
    return [str(i["output"]) for i in items if i.get("type") == "function_call_output" and i["call_id"] == call_id]


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


@pytest.fixture(scope="module")
def proxy(server):
    with Proxy(server.url) as p:
        yield p


def test_claude_code_plain(proxy, home):
    before = len(proxy.exchanges)
    check_plain(claude(proxy, home, PLAIN, "--max-turns", "1"), proxy, "/v1/messages", before)


def test_claude_code_tools(proxy, home):
    before = len(proxy.exchanges)
    done = claude(proxy, home, TOOLS, "--max-turns", "3", "--allowedTools", "Bash")
    check_tools(done, proxy, "/v1/messages", before, tool_results)


def test_codex_plain(proxy, home):
    before = len(proxy.exchanges)
    check_plain(codex(proxy, home, PLAIN), proxy, "/v1/responses", before)


def test_codex_tools(proxy, home):
    before = len(proxy.exchanges)
    check_tools(codex(proxy, home, TOOLS), proxy, "/v1/responses", before, call_outputs)
