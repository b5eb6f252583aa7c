"""Each setting declared once (cllm/core/config.py): the command line, the environment and the YAML file give
the same ServeConfig, and docs/configuration.md's tables are the ones its declarations write."""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest

from cllm import docs_config
from cllm.cli import parser, serve_overrides
from cllm.core.config import ServeConfig
from cllm.core.config_load import load_config
from cllm.core.settings import ConfigError, Setting, settings

EVERY = [s for s in settings(ServeConfig) if not s.file_only]


def sample(s: Setting, path: str):
    """A value the setting accepts that is not its default."""
    if isinstance(s.kind, tuple):
        candidates: list = list(s.kind)
    else:
        by_kind: dict[Any, list] = {
            bool: [True, False],
            int: [1, 2, 65, 1025],
            float: [0.5, 1.5],
            str: [path, "org/repo:Q4_K_M", "ngram"],  # a path, a Hugging Face name for --hf-repo, a --spec-type
            # files (--lora), files with scales (--lora-scaled), host names, origins
            list: [[path], [path + ":0.5"], ["a.example"], ["https://a.example"]],
        }
        if s.name == "lora-dir":  # a folder
            return os.path.dirname(path)
        candidates = by_kind[s.kind]
    for value in candidates:
        try:
            msgspec.convert(value, s.type)
        except msgspec.ValidationError:
            continue
        if value != s.default:
            return value
    raise AssertionError(f"no sample value for {s.name}")


def as_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return ",".join(value) if isinstance(value, list) else str(value)


def as_argv(s: Setting, value) -> list[str]:
    if isinstance(value, bool):
        return [f"--{s.name}" if value else f"--no-{s.name}"]
    return [f"--{s.name}", as_text(value)]


@pytest.fixture
def values(tmp_path):
    path = tmp_path / "template.jinja"  # a file that exists: --chat-template-file wants one
    path.write_text("{{ messages }}")
    return {s.attr: sample(s, str(path)) for s in EVERY}


def test_every_setting_parses_alike_from_the_command_line_the_environment_and_the_file(values, tmp_path):
    argv = [arg for s in EVERY for arg in as_argv(s, values[s.attr])]
    from_cli = load_config(None, serve_overrides(parser().parse_args(["serve", *argv])), {})
    from_env = load_config(None, {}, {s.env: as_text(values[s.attr]) for s in EVERY if s.env})
    yaml = tmp_path / "cllm.yaml"
    yaml.write_bytes(msgspec.yaml.encode({s.name: values[s.attr] for s in EVERY}))
    from_file = load_config(str(yaml), {}, {})
    assert from_cli == from_env == from_file
    default = ServeConfig()
    unchanged = [s.name for s in EVERY if getattr(from_cli, s.attr) == getattr(default, s.attr)]
    assert unchanged == []  # each setting was given a value of its own, so each one was read


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(tmp_path):
    yaml = tmp_path / "cllm.yaml"
    yaml.write_text("parallel: 2\nctx-size: 1024\nport: 9001\n")
    args = serve_overrides(parser().parse_args(["serve", "--port", "9003"]))
    config = load_config(str(yaml), args, {"CLLM_CTX_SIZE": "2048", "CLLM_PORT": "9002", "CLLM_PARALLEL": ""})
    assert (config.parallel, config.ctx_size, config.port) == (2, 2048, 9003)


def test_a_bad_variable_is_named():
    with pytest.raises(ConfigError, match=r"^CLLM_PARALLEL=lots: Expected `int`"):
        load_config(None, {}, {"CLLM_PARALLEL": "lots"})
    with pytest.raises(ConfigError, match=r"^CLLM_PORT=70000: Expected `int` <= 65535"):
        load_config(None, {}, {"CLLM_PORT": "70000"})


def test_docs_configuration_is_current():
    with open(docs_config.PATH) as f:
        text = f.read()
    assert docs_config.generated(text) == text, "docs/configuration.md is stale: run python -m cllm.docs_config"
