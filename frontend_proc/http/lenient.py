"""What real clients add beyond what cllm reads: fields it does not know, and kinds of tools and blocks.

Real clients extend the APIs faster than any schema copied from docs: Claude
Code puts new top-level fields and block types in its requests, Codex CLI new
tool types. So what is merely new is dropped with a debug log naming it, and
only what is malformed is a 400: a field cllm reads with a wrong value, or an
entry of a known kind that does not fit it. A client release that adds
something gets its answer instead of a 400. Where a door asks for it (the
llama-server door's /completion and /infill), a top-level field whose name is
a near miss of a declared one (`n_prdict`) is a typo, not a new field: a 400
naming both, since dropping it would silently undo what the client asked for.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping

import msgspec

log = logging.getLogger("cllm.frontend")

# msgspec's message for a field a Struct does not declare (its name may hold any character, a backtick too),
# and where the path of the object holding it may begin.
_UNKNOWN = "Object contains unknown field `"
_AT = "` - at `$"
_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\[\.\.\.\]")
# How alike (difflib's ratio) an unknown name and a declared one are for the first to read as a typo of the second:
# n_prdict 0.94 to n_predict, temprature 0.95, grammars 0.93; other servers' fields stay below (min_tokens 0.80 to
# max_tokens, max_new_tokens 0.83, repetition_penalty 0.81 to repeat_penalty).
NEAR = 0.85


def decode(value, type_: type, near_misses: bool = False):
    """``value`` (JSON data as Python objects) as ``type_``, fields no Struct declares dropped from it.

    With ``near_misses``, a top-level one that is a near miss of a field ``type_`` declares is refused instead.
    """
    while True:
        try:
            return msgspec.convert(value, type_)
        except msgspec.ValidationError as e:
            field, path = _unknown(str(e), value)
            if field is None:
                raise
            if near_misses and not path and (meant := near_miss(field, type_)):
                raise msgspec.ValidationError(
                    f"Object contains unknown field `{field}`: a misspelling of `{meant}`?"
                ) from None
            log.debug("ignored a field not known here", extra={"fields": {"field": field, "at": "$" + path}})


def near_miss(field: str, type_: type) -> str | None:
    """The field ``type_`` declares that ``field`` is a near miss of, if any."""
    close = difflib.get_close_matches(field, [f.encode_name for f in msgspec.structs.fields(type_)], n=1, cutoff=NEAR)
    return close[0] if close else None


def _unknown(message: str, value) -> tuple[str | None, str]:
    """The unknown field the message names and the path of its object, once dropped from ``value``; (None, "") if
    none."""
    if not message.startswith(_UNKNOWN) or not message.endswith("`"):
        return None, ""
    rest = message[len(_UNKNOWN) : -1]
    # Read as "name" alone, or as "name` - at `$path" at each place the separator occurs: the one whose field exists.
    splits = [(rest, "")] + [(rest[:i], rest[i + len(_AT) :]) for i in range(len(rest)) if rest.startswith(_AT, i)]
    for field, path in splits:
        if _drop(value, path, field):
            return field, path
    return None, ""


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
    rest = path[step.end() :]
    if step.group(0) == "[...]":
        return isinstance(value, dict) and any(_drop(v, rest, field) for v in value.values())
    try:
        return _drop(value[key] if key is not None else value[int(index)], rest, field)
    except (KeyError, IndexError, TypeError):
        return False


def known(raw: list, types: Mapping[str, type], path: str, what: str, default: str | None = None) -> list:
    """The entries of ``raw`` of a kind in ``types``, decoded; ``path`` names the list in errors, ``default`` the kind
    of an entry without `type`."""
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
