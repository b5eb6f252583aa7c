"""How a settings declaration is read: each field of a msgspec Struct annotated with `setting(...)` is one option.

From one field come its command-line option (`--ctx-size`, cllm/cli.py), its key in the YAML file (`ctx-size`),
its environment variable (`CLLM_CTX_SIZE`) and its row in docs/configuration.md (cllm/docs_config.py); msgspec
checks the value whichever way it came. The declarations themselves are cllm/core/config.py's.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec
from msgspec import Meta


class ConfigError(ValueError):
    """A setting that cannot be used, said in one line that names it."""


def setting(
    help: str,
    group: str,
    *,
    metavar: str | None = None,
    flags: tuple[str, ...] = (),
    default_text: str | None = None,
    per_model: bool = False,
    file_only: bool = False,
    **constraints: Any,
) -> Meta:
    """A field's declaration, as the metadata of its `Annotated` type.

    help: one text for --help and the docs (`backticks` for code; "docs/internals.md: Threads" becomes a link);
    group: the heading it is listed under; metavar: the value's name in --help; flags: further option strings
    (as "-hf"); default_text: the default in words, where the value alone would mislead (0 meaning "one per core");
    per_model: an entry of the `models:` list may set it too; file_only: no option and no variable (a list of
    structs); constraints: msgspec's (ge=, le=, pattern=...).
    """
    extra = {
        "group": group,
        "metavar": metavar,
        "flags": flags,
        "default_text": default_text,
        "per_model": per_model,
        "file_only": file_only,
    }
    return Meta(description=help, extra=extra, **constraints)


Kind = type | tuple[str, ...]  # bool, int, float, str, list, or a Literal's choices
_UNIONS = (Union, types.UnionType)  # Optional[int] and int | None


@dataclass(frozen=True)
class Setting:
    attr: str  # the field: ctx_size
    name: str  # the file's key and the option without its dashes: ctx-size
    type: Any  # the field's whole type, constraints included (what msgspec converts to)
    kind: Kind
    default: Any
    help: str
    group: str
    metavar: str | None
    flags: tuple[str, ...]
    default_text: str | None
    per_model: bool
    file_only: bool
    env: str | None  # the environment variable; None where the struct has no prefix or the setting is file-only
    bounds: str  # the range msgspec holds it to, in words ("1 to 255"), or ""

    @property
    def options(self) -> tuple[str, ...]:
        """Its option strings (a flag's --no-NAME comes with it: cllm/cli.py)."""
        if self.file_only:
            return ()
        return (*self.flags, f"--{self.name}")


def _bounds(tp: Any) -> str:
    """The numeric constraints of a type, through its Annotated and Optional layers."""
    found: dict[str, Any] = {}
    while True:
        if get_origin(tp) is Annotated:
            tp, *metas = get_args(tp)
            for m in (m for m in metas if isinstance(m, Meta)):
                found.update({k: getattr(m, k) for k in ("ge", "gt", "le") if getattr(m, k) is not None})
        elif get_origin(tp) in _UNIONS:
            (tp,) = [a for a in get_args(tp) if a is not type(None)]
        else:
            break
    low = f"more than {found['gt']}" if "gt" in found else f"at least {found['ge']}" if found.get("ge") else ""
    if "le" in found:
        return f"{found.get('ge', found.get('gt'))} to {found['le']}"
    return low


def _kind(tp: Any) -> Kind:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in _UNIONS:
        (tp,) = [a for a in get_args(tp) if a is not type(None)]
        return _kind(tp)
    if get_origin(tp) is Literal:
        return get_args(tp)
    if get_origin(tp) is list:
        return list
    return tp


@functools.cache
def settings(struct: type[msgspec.Struct]) -> tuple[Setting, ...]:
    """The declared fields of ``struct``, in their order; its class attribute ``env_prefix`` names the variables."""
    prefix = getattr(struct, "env_prefix", None)
    found = []
    for field in msgspec.structs.fields(struct):
        meta = next((m for m in get_args(field.type)[1:] if isinstance(m, Meta) and m.extra), None)
        if meta is None or meta.extra is None or meta.description is None:
            raise TypeError(f"{struct.__name__}.{field.name} is not declared with setting(...)")
        x = meta.extra
        default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
        env = None if prefix is None or x["file_only"] else prefix + field.name.upper()
        found.append(
            Setting(
                attr=field.name,
                name=field.encode_name,
                type=field.type,
                kind=_kind(field.type),
                default=default,
                help=meta.description,
                group=x["group"],
                metavar=x["metavar"],
                flags=x["flags"],
                default_text=x["default_text"],
                per_model=x["per_model"],
                file_only=x["file_only"],
                env=env,
                bounds=_bounds(field.type),
            )
        )
    return tuple(found)


def names(value: str) -> list[str]:
    """A comma-separated list, as --allowed-hosts and its variable take it."""
    return [name.strip() for name in value.split(",") if name.strip()]


def from_environ(struct: type[msgspec.Struct], environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the environment gives (an empty variable gives none), each checked and named by its variable."""
    values = {}
    for s in settings(struct):
        raw = environ.get(s.env or "")
        if not raw:
            continue
        try:
            values[s.attr] = msgspec.convert(names(raw) if s.kind is list else raw, s.type, strict=False)
        except msgspec.ValidationError as e:
            raise ConfigError(f"{s.env}={raw}: {e}") from None
    return values


def default_words(s: Setting) -> str:
    """The default as the docs and --help state it ("" where there is nothing to state: a flag off, no value)."""
    if s.default_text is not None:
        return s.default_text
    if isinstance(s.default, bool):
        return "on" if s.default else "off"
    if s.default is None or s.default == []:
        return ""
    return f"{s.default:g}" if isinstance(s.default, float) else str(s.default)


_DOC_REF = re.compile(r"docs/([\w-]+\.md): ([^;)]+)")


def meaning(s: Setting) -> str:
    """Its help and its range (Markdown: see plain and markdown)."""
    if not s.bounds:
        return s.help
    return f"{s.help[:-1]}; {s.bounds})" if s.help.endswith(")") else f"{s.help} ({s.bounds})"


def plain(text: str) -> str:
    """A help text for a terminal: without the Markdown backticks."""
    return text.replace("`", "")


def markdown(text: str) -> str:
    """A help text for the docs: "docs/internals.md: Threads" as a link, `|` kept out of the table's columns."""

    def link(m: re.Match[str]) -> str:
        anchor = re.sub(r"[^\w\- ]", "", m[2].strip().lower()).replace(" ", "-")
        return f"[{m[2]}]({m[1]}#{anchor})"

    return _DOC_REF.sub(link, text).replace("|", "\\|")
