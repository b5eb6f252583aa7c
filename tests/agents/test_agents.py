"""Claude Code and Codex CLI, as published (tests/agents/package.json pins them), run against `cllm serve`.

Each completes a plain turn and a turn that asks for one of its own tools, as
a user scripting them would run them: `claude -p --bare --tools Bash` with
ANTHROPIC_BASE_URL, `codex exec` with a `model_providers` entry on the
Responses API, one line of instructions and fewer tools. Their prompts are
then ~0.5k and ~2.5k tokens, inside the 135M model's 8k training context
(their default ~12k and ~10k lie past it, where greedy decoding wrote no end,
and took ~15 min of prefill on two busy cores); tests/agents/test_recorded.py
replays their default requests whole.

They talk to the server through a recording proxy (tests/agents/proxy.py)
that makes every turn greedy (temperature 0, a seed, one fixed date and fixed
directories in their prompts), so a run is the same every time, and keeps
each request and reply. A plain turn must exit 0, every request answered 200,
its last reply ended by the model (end of sequence, not its length limit), and
the CLI must print that reply. In a tools turn the proxy asks for one tool
call (tool_choice), then for an answer; the reply must call a tool, a later
request carry that call's result (the `ls` it ran, naming the project's one
file), and the server read that result: emptied, the same request counts fewer
prompt tokens. The answer to that result must be the greedy reply to that
request, clear of near ties (tests/near_tie.py, asked again as the chat request
it means), ended by the model and printed, and the CLI exit 0. `make
test-agents` installs the CLIs and runs this; without CLLM_TEST_AGENTS=1 it is
skipped.
"""

from __future__ import annotations

import contextlib
import os
import subprocess

import httpx
import pytest

from tests.agents.chat_bodies import anthropic_chat_body, chat_body
from tests.agents.proxy import Exchange, Proxy, tool_results, without_results
from tests.near_tie import Greedy, greedy

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
ANSWER_LIMIT = 256  # tokens: Claude Code's limit above, within the server's --max-tokens 512
# Its scripted mode (--bare: no hooks, plugins or CLAUDE.md, a one-line system prompt) with Bash its one tool: a
# ~700-token prompt where the default one is ~12k, past the 135M model's 8k training context (where greedy decoding
# wrote no end) and a prefill of ~15 min on two busy cores.
CLAUDE_ARGS = ("--bare", "--tools", "Bash")
PLAIN = "Say hello."
# After the `ls` result, greedy SmolLM2 writes the call again as text (tool_choice "none": text) and ends there, each
# token ahead by >= 0.84 nats for either CLI; after "Run the command ls." it wrote about ls to the output limit (Claude
# Code then exits 1), and each free-text answer tried had a near tie on its way.
TOOLS = "Run ls. Answer in one word."
# Its own instructions in a file of one line, and no web search, sub-agents or goals: ~2.5k tokens where its default
# prompt is ~10k, past the model's training context.
CODEX_INSTRUCTIONS = "You are Codex, a coding agent. Answer briefly.\n"
CODEX_CONFIG = """\
model = "smollm2"
model_provider = "cllm"
check_for_update_on_startup = false
model_instructions_file = "{instructions}"
web_search = "disabled"

[model_providers.cllm]
name = "cllm"
base_url = "{url}/v1"
wire_api = "responses"
stream_idle_timeout_ms = {idle_ms}

[features]
multi_agent = false
goals = false

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


def check_tools(done: subprocess.CompletedProcess, proxy: Proxy, route: str, before: int, listed: str) -> None:
    """A reply that called a tool, then a request carrying that call's result (holding ``listed``), that result in
    the prompt the server read (emptied, the same request counts fewer prompt tokens), and the answer to it: the
    greedy one, clear of near ties, ended by the model, printed, the CLI exiting 0."""
    seen = exchanges(proxy, route, before)
    output = done.stdout + done.stderr
    called = [(i, call) for i, e in enumerate(seen) for call in e.reply().calls]
    assert called, ([(r.end, r.text[:100]) for r in map(Exchange.reply, seen)], output)
    i, call = called[0]
    carried = [(e, text) for e in seen[i + 1 :] for id, text in tool_results(e.body) if id == call.id]
    assert carried and carried[0][1].strip() and listed in carried[0][1], (call, carried, output)
    follow_up = carried[0][0].body
    read, emptied = prompt_size(proxy, route, follow_up), prompt_size(proxy, route, without_results(follow_up))
    assert read > emptied, (read, emptied)
    answer, expected = carried[0][0].reply(), greedy_answer(proxy, route, follow_up)
    assert expected.ended and answer.text == expected.text, (answer, expected, output)
    assert done.returncode == 0, output
    assert answer.end == "stop" and answer.text.strip() in done.stdout, (answer, done.stdout)


def greedy_answer(proxy: Proxy, route: str, body: dict) -> Greedy:
    """The greedy reply to ``body`` asked as the chat request it means (tool_choice "none", as the proxy asked), each
    token to its end clear of a near tie."""
    chat = (anthropic_chat_body if route == "/v1/messages" else chat_body)(body)
    with httpx.Client(base_url=proxy.upstream, timeout=RUN_TIMEOUT) as http:
        return greedy(http, {**chat, "tool_choice": "none", "max_tokens": ANSWER_LIMIT})


def prompt_size(proxy: Proxy, route: str, body: dict) -> int:
    """How many tokens the server read as the prompt of ``body`` (generating a token or a few)."""
    limit = {"max_tokens": 1} if route == "/v1/messages" else {"max_output_tokens": 16}
    r = httpx.post(proxy.upstream + route, json={**body, **limit, "stream": False}, timeout=RUN_TIMEOUT)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    cached = ("cache_read_input_tokens", "cache_creation_input_tokens") if route == "/v1/messages" else ()
    return usage["input_tokens"] + sum(usage.get(k) or 0 for k in cached)


def claude(server, home, *args: str) -> subprocess.CompletedProcess:
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": server.url, "CLAUDE_CONFIG_DIR": str(home / "home" / ".claude")}
    return run([os.path.join(BIN, "claude"), "-p", *args, *CLAUDE_ARGS, "--model", "smollm2"], home, env)


def codex(server, home, prompt: str) -> subprocess.CompletedProcess:
    codex_home = home / "home" / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "instructions.md").write_text(CODEX_INSTRUCTIONS)
    config = CODEX_CONFIG.format(
        instructions=codex_home / "instructions.md", url=server.url, idle_ms=RUN_TIMEOUT * 1000
    )
    (codex_home / "config.toml").write_text(config)
    return run(
        [os.path.join(BIN, "codex"), "exec", "--skip-git-repo-check", prompt], home, {"CODEX_HOME": str(codex_home)}
    )


@contextlib.contextmanager
def calling(proxy: Proxy):
    """A turn in which the proxy asks for a tool call."""
    proxy.call_tool = True
    try:
        yield
    finally:
        proxy.call_tool = False


@pytest.fixture(scope="module")
def proxy(server, home):
    with Proxy(server.url, {str(home): "/agents"}) as p:
        yield p


def test_claude_code_plain(proxy, home):
    before = len(proxy.exchanges)
    check_plain(claude(proxy, home, PLAIN, "--max-turns", "1"), proxy, "/v1/messages", before)


def test_claude_code_tools(proxy, home):
    before = len(proxy.exchanges)
    with calling(proxy):
        done = claude(proxy, home, TOOLS, "--max-turns", "3", "--allowedTools", "Bash")
    check_tools(done, proxy, "/v1/messages", before, "notes.txt")  # the `ls` it ran, on the project's one file


def test_codex_plain(proxy, home):
    before = len(proxy.exchanges)
    check_plain(codex(proxy, home, PLAIN), proxy, "/v1/responses", before)


def test_codex_tools(proxy, home):
    before = len(proxy.exchanges)
    with calling(proxy):
        done = codex(proxy, home, TOOLS)
    check_tools(done, proxy, "/v1/responses", before, "notes.txt")  # the `ls` it ran, on the project's one file
