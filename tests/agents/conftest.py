"""The server the coding agents and their recorded requests share: one sequence that holds a whole agent prompt."""

from __future__ import annotations

import pytest

from tests.conftest import start_server


@pytest.fixture(scope="session")
def server():
    """~12k tokens of Claude Code's prompt in one sequence, and no deadline: a long prefill on a slow CPU.

    At most 512 tokens a reply: Codex names no limit, and a reply that never ends would run to the sequence's end.
    """
    with start_server("--ctx-size", "16384", "--parallel", "1", "--request-timeout", "0", "--max-tokens", "512") as srv:
        yield srv
