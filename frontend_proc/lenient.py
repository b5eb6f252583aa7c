"""Lists whose entries name their kind in `type`, a set real clients extend faster than any docs: tools, content blocks.

An entry of a kind known here is decoded strictly, so a malformed one is
still a 400 that names it; an entry of a kind not known here is skipped with a
debug log. So a client release that adds a kind of tool or block (Codex CLI's
`namespace` and `web_search` tools, Claude Code's `tool_reference` blocks)
gets its answer instead of a 400.
"""

from __future__ import annotations

import logging

import msgspec

log = logging.getLogger("cllm.frontend")


def known(raw: list, types: dict[str, type], path: str, what: str, default: str | None = None) -> list:
    """The entries of ``raw`` of a kind in ``types``, decoded; ``path`` names the list in errors, ``default`` the kind of an entry without `type`."""
    out = []
    for i, entry in enumerate(raw):
        where = f"{path}[{i}]"
        kind = entry.get("type", default) if isinstance(entry, dict) else None
        if not isinstance(kind, str):
            raise ValueError(f"Expected an object with a string `type` - at `$.{where}`")
        type_ = types.get(kind)
        if type_ is None:
            log.debug("ignored a %s of a kind not known here", what, extra={"fields": {"type": kind, "at": where}})
            continue
        try:
            out.append(msgspec.convert(entry, type_))
        except msgspec.ValidationError as e:
            raise ValueError(at(str(e), where)) from None
    return out


def at(message: str, where: str) -> str:
    """msgspec's message about a part of the entry at ``where``, its path made whole ("... - at `$.where.part`")."""
    if " - at `$" in message:
        return message.replace(" - at `$", f" - at `$.{where}", 1)
    return f"{message} - at `$.{where}`"
