"""What real clients add beyond what cllm reads: fields it does not know, and kinds of tools and blocks.

Real clients extend the APIs faster than any schema copied from docs: Claude
Code puts new top-level fields and block types in its requests, Codex CLI new
tool types. So what is merely new is dropped with a debug log naming it, and
only what is malformed is a 400: a field cllm reads with a wrong value, or an
entry of a known kind that does not fit it. A client release that adds
something gets its answer instead of a 400.
"""

from __future__ import annotations

import logging
import re

import msgspec

log = logging.getLogger("cllm.frontend")

# msgspec's message for a field a Struct does not declare, and the path of the object holding it.
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`(?: - at `\$([^`]*)`)?")
_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\[\.\.\.\]")


def decode(value, type_: type):
    """``value`` (JSON data as Python objects) as ``type_``, fields no Struct declares dropped from it."""
    while True:
        try:
            return msgspec.convert(value, type_)
        except msgspec.ValidationError as e:
            found = _UNKNOWN.fullmatch(str(e))
            if found is None or not _drop(value, found.group(2) or "", found.group(1)):
                raise
            log.debug("ignored a field not known here", extra={"fields": {"field": found.group(1), "at": "$" + (found.group(2) or "")}})


def _drop(value, path: str, field: str) -> bool:
    """Delete ``field`` from the object at ``path`` in ``value``; False where the path cannot be followed.

    msgspec writes a dict's key as `[...]`: each of the dict's values is tried.
    """
    if not path:
        if isinstance(value, dict) and field in value:
            del value[field]
            return True
        return False
    step = _STEP.match(path)
    if step is None:
        return False
    key, index = step.groups()
    rest = path[step.end():]
    if step.group(0) == "[...]":
        return isinstance(value, dict) and any(_drop(v, rest, field) for v in value.values())
    try:
        return _drop(value[key] if key is not None else value[int(index)], rest, field)
    except (KeyError, IndexError, TypeError):
        return False


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
            out.append(decode(entry, type_))
        except msgspec.ValidationError as e:
            raise ValueError(at(str(e), where)) from None
    return out


def at(message: str, where: str) -> str:
    """msgspec's message about a part of the entry at ``where``, its path made whole ("... - at `$.where.part`")."""
    if " - at `$" in message:
        return message.replace(" - at `$", f" - at `$.{where}", 1)
    return f"{message} - at `$.{where}`"
