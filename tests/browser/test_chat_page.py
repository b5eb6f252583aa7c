"""The chat page in a real headless browser: Debian's chromium, driven by Playwright (no browser download).

`make test-browser` runs it (CI too). Screenshots at phone and desktop sizes
land in $ARTIFACTS_DIR (default tests/browser/artifacts/, ignored by git).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from perf import image_files
from tests.conftest import ROOT, start_server, wait_idle, wait_until

playwright = pytest.importorskip("playwright.sync_api", reason="make test-browser installs playwright")

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", os.path.join(ROOT, "tests", "browser", "artifacts")))
MODEL = "SmolLM2-135M-Instruct.Q4_1"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no browser at {CHROMIUM} (Debian: apt-get install chromium; or set CHROMIUM)")
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, headless=True, args=ARGS
        )
        yield context
        context.close()


@pytest.fixture
def page(browser, server):
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.evaluate("localStorage.clear()")
    page.reload()
    until(page, f"document.querySelector('#model').value === '{MODEL}'")
    page.errors = errors
    yield page
    page.close()


def until(page, js: str, timeout: float = WAIT_MS / 1000) -> None:
    """Poll a JS expression (page.wait_for_function evaluates strings, which the page's CSP forbids)."""
    wait_until(lambda: page.evaluate(js), timeout)


def settings(page, *, system: str, temperature: float, max_tokens: int) -> None:
    page.click("#toggle-settings")
    page.fill("#system", system)
    page.fill("#temperature", str(temperature))
    page.fill("#max-tokens", str(max_tokens))
    page.click("#toggle-settings")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def test_sends_a_message_and_shows_the_streamed_reply(page):
    settings(page, system="You are a helpful assistant.", temperature=0, max_tokens=40)
    send(page, "What is the capital of France?")
    page.wait_for_selector(".msg.assistant [data-act=regenerate]", timeout=WAIT_MS)
    reply = page.inner_text(".msg.assistant .body")
    assert "Paris" in reply
    stats = page.inner_text(".msg.assistant .stats")
    assert "TTFT" in stats and "tokens" in stats and "tok/s" in stats
    assert page.inner_text(".msg.user").endswith("What is the capital of France?")
    # The conversation survives a reload (local storage), and regenerate gives the same greedy reply.
    page.reload()
    page.wait_for_selector(".msg.assistant [data-act=regenerate]", timeout=WAIT_MS)
    assert page.inner_text(".msg.assistant .body") == reply
    page.click("[data-act=regenerate]")
    page.wait_for_selector(".msg.assistant [data-act=regenerate]", timeout=WAIT_MS)
    assert page.inner_text(".msg.assistant .body") == reply
    # A second turn, whose reply has a code block: docs/chat-page.png.
    settings(page, system="You are a helpful assistant.", temperature=0, max_tokens=150)
    send(page, "Write a Python function that adds two numbers.")
    page.wait_for_selector(".msg:nth-child(4) [data-act=regenerate]", timeout=WAIT_MS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-reply.png"))
    assert page.errors == []


def test_stop_button_aborts_a_long_reply(page, http):
    settings(page, system="", temperature=0.7, max_tokens=400)
    send(page, "Write a very long story about a dragon who learns to cook.")
    until(page, "document.querySelector('.msg.assistant .body')?.textContent.length > 20")
    assert page.inner_text("#send") == "Stop"
    page.click("#send")
    page.wait_for_selector(".msg.assistant [data-act=copy]", timeout=WAIT_MS)
    assert page.inner_text("#send") == "Send"
    # The engine freed the slot: nothing runs or waits, well before 400 tokens could have been written.
    idle = wait_idle(http, timeout=10)
    assert idle["queue"]["running"] == 0
    assert int(page.inner_text(".msg.assistant .stats").split(" · ")[1].split()[0]) < 400
    assert page.errors == []


def test_markdown_keyboard_and_screenshots(page, server):
    reply = "Here is **code**:\n\n```python\nprint('<hi>')\n```\n\n- one\n- two `x`"
    chat = [
        {"role": "user", "content": "Show me code"},
        {"role": "assistant", "content": reply, "stats": {"ttft": "0.12", "tokens": 20, "rate": "95.0"}},
    ]
    page.evaluate("c => localStorage.setItem('cllm-chat', JSON.stringify({chat: c}))", chat)
    page.reload()
    page.wait_for_selector(".msg.assistant pre code")
    assert page.inner_text(".msg.assistant pre code") == "print('<hi>')"
    assert page.inner_text(".msg.assistant strong") == "code"
    assert page.locator(".msg.assistant li").count() == 2
    # Shift+Enter breaks the line, Enter would send.
    page.fill("#input", "line one")
    page.press("#input", "Shift+Enter")
    page.keyboard.type("line two")
    assert page.input_value("#input") == "line one\nline two"
    assert page.locator(".msg").count() == 2
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, size in (("phone", {"width": 390, "height": 844}), ("desktop", {"width": 1280, "height": 800})):
        page.set_viewport_size(size)
        page.screenshot(path=str(ARTIFACTS / f"chat-{name}.png"))
        assert (ARTIFACTS / f"chat-{name}.png").stat().st_size > 5000
    # The phone layout has no sideways scrolling.
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.errors == []


def test_api_key_field(browser):
    with start_server("--parallel", "2", "--ctx-size", "1024", env={"CLLM_API_KEY": "sesame"}) as srv:
        page = browser.new_page()
        try:
            page.goto(srv.url + "/")
            page.wait_for_selector("#notice.show", timeout=WAIT_MS)
            assert "API key" in page.inner_text("#notice")
            page.fill("#api-key", "sesame")
            page.dispatch_event("#api-key", "change")
            until(page, f"document.querySelector('#model').value === '{MODEL}'")
            assert not page.is_visible("#notice")
        finally:
            page.close()


# ---- images ------------------------------------------------------------------------------------------------------

PNG = image_files.png(image_files.picture(64, 48, seed=5))


def paste(page, data: bytes, kind: str = "image/png") -> None:
    """A paste into the message box carrying one image file, as a browser fires it."""
    page.evaluate(
        """([bytes, kind]) => {
            const dt = new DataTransfer();
            dt.items.add(new File([new Uint8Array(bytes)], "pasted", { type: kind }));
            document.querySelector("#input").dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt }));
        }""",
        [list(data), kind],
    )


def test_an_attached_and_a_pasted_image_go_as_image_url_parts(page, tmp_path):
    """On a server without a projector the images reach it (its 400 names --mmproj) and the page shows why."""
    (tmp_path / "cat.png").write_bytes(PNG)
    page.set_input_files("#file", str(tmp_path / "cat.png"))
    paste(page, PNG)
    until(page, "document.querySelectorAll('#attached img').length === 2")
    page.click("#attached [data-remove='1']")  # the pasted one taken off again
    until(page, "document.querySelectorAll('#attached img').length === 1")
    send(page, "What is this?")
    page.wait_for_selector(".msg.assistant .error", timeout=WAIT_MS)
    assert "--mmproj" in page.inner_text(".msg.assistant .error")
    assert page.locator(".msg.user img").count() == 1 and page.locator("#attached img").count() == 0
    src = page.get_attribute(".msg.user img", "src")
    assert src == "data:image/png;base64," + base64.b64encode(PNG).decode()
    page.reload()  # the conversation, image and all, survives a reload
    page.wait_for_selector(".msg.user img", timeout=WAIT_MS)


@pytest.fixture(scope="module")
def vision_server(mmproj):
    with start_server("--parallel", "2", "--ctx-size", "1024", "--mmproj", mmproj) as srv:
        yield srv


def test_a_chat_about_an_image_is_answered_with_a_projector(browser, vision_server, tmp_path):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(vision_server.url + "/")
        until(page, f"document.querySelector('#model').value === '{MODEL}'")
        settings(page, system="", temperature=0, max_tokens=8)
        paste(page, PNG)
        until(page, "document.querySelectorAll('#attached img').length === 1")
        page.press("#input", "Enter")  # an image alone, no text, is a message too
        page.wait_for_selector(".msg.assistant [data-act=regenerate]", timeout=WAIT_MS)
        assert page.locator(".msg.assistant .error").count() == 0
        assert page.inner_text(".msg.assistant .body").strip()
        assert errors == []
    finally:
        page.close()
