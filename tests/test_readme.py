"""The docs hold: the README's curl and SDK call run against a real server, every option is documented, links
resolve."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_URL = "http://127.0.0.1:8080"  # what the README's snippets call; the tests' server is elsewhere


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def _on(server, snippet: str) -> str:
    assert README_URL in snippet, "the README's snippets call the default address"
    return snippet.replace(README_URL, server.url)


def test_readme_curl_answers(server):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    (curl, *_) = [b for b in _blocks(_read(README), "sh") if b.lstrip().startswith("curl ")]
    done = subprocess.run(["bash", "-c", _on(server, curl)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"].strip()


def test_readme_sdk_call_answers(server):
    (snippet, *_) = [b for b in _blocks(_read(README), "python") if "from openai import OpenAI" in b]
    done = subprocess.run(
        [sys.executable, "-c", _on(server, snippet)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_every_serve_option_is_documented():
    help_text = subprocess.run(
        [sys.executable, "-m", "cllm.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    ).stdout
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", help_text)) - {"--help"}
    assert len(options) > 30
    documented = _read(os.path.join(DOCS, "configuration.md"))
    missing = sorted(o for o in options if f"`{o}" not in documented)
    assert not missing, f"docs/configuration.md does not name {missing}"


def _prose(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = _prose(markdown)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


def _pages() -> list[str]:
    return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_links_resolve(page):
    text = _prose(_read(page))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(file):
            broken.append(target)
        elif anchor and file.endswith(".md") and anchor not in _anchors(_read(file)):
            broken.append(target)
    assert not broken, f"{os.path.relpath(page, ROOT)}: {broken}"
