"""docs/configuration.md's tables of options, written from their declarations (cllm/core/config.py, cllm/cli.py).

`python -m cllm.docs_config` rewrites the parts between the markers; `--check` only says whether they are current
(tests/unit/test_settings.py runs it). The prose around them is written by hand.
"""

from __future__ import annotations

import argparse
import os
import sys

from cllm.cli import serve_settings
from cllm.core.config import GROUPS, PER_MODEL
from cllm.core.settings import Setting, default_words, markdown, meaning

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "configuration.md")
BEGIN = "<!-- {}: written by `python -m cllm.docs_config` from the declarations in cllm/core/config.py -->"
END = "<!-- end of {} -->"


def _option(s: Setting) -> str:
    if s.file_only:
        return f"`{s.name}:` (YAML only)"
    if s.kind is bool:  # argparse's BooleanOptionalAction: a --no- form of each
        return ", ".join(f"`{o}`, `--no-{o[2:]}`" for o in s.options)
    value = s.metavar or ("|".join(s.kind) if isinstance(s.kind, tuple) else "")
    return ", ".join(f"`{o}{' ' + value if value else ''}`" for o in s.options).replace("|", "\\|")


def options_tables() -> str:
    every = serve_settings()
    out = []
    for group, note in GROUPS.items():
        out += [f"### {group}", ""] + ([note, ""] if note else [])
        out += ["| option | default | variable | meaning |", "|---|---|---|---|"]
        for s in (s for s in every if s.group == group):
            env = f"`{s.env}`" if s.env else ""
            out.append(f"| {_option(s)} | {markdown(default_words(s))} | {env} | {markdown(meaning(s))} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


def per_model_keys() -> str:
    keys = [f"`{a.replace('_', '-')}`" for a in PER_MODEL]
    return f"and any of {', '.join(keys[:-1])} and {keys[-1]};"


SECTIONS = {"options": options_tables, "per-model settings": per_model_keys}


def generated(text: str) -> str:
    """``text`` with each section between its markers written anew."""
    for name, write in SECTIONS.items():
        begin, end = BEGIN.format(name), END.format(name)
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise SystemExit(f"{PATH}: no '{begin}' ... '{end}' section")
        text = f"{text[:start]}{begin}\n{write()}\n{text[stop:]}"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cllm.docs_config", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1, writing nothing, when the file is not current")
    args = ap.parse_args(argv)
    with open(PATH) as f:
        text = f.read()
    new = generated(text)
    if args.check:
        if new != text:
            print(f"{PATH} is stale: run python -m cllm.docs_config", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(PATH, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
