"""Loading `cllm serve`'s settings (cllm/core/config.py declares them): the defaults, a YAML file, the CLLM_
variables, then the command line, each over the one before; paths made absolute for the processes that read them,
and the settings llama.cpp would refuse said before any engine starts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from cllm.core.config import ServeConfig
from cllm.core.settings import ConfigError, from_environ


def load_config(
    path: str | None, overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> ServeConfig:
    """The defaults, a YAML file (keys as on the command line), the CLLM_ variables of ``environ``, then
    ``overrides`` (the command line's values; None: not given), each over the one before."""
    values: dict = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                values = msgspec.yaml.decode(f.read()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        except msgspec.DecodeError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path} must hold a mapping of option: value")
    given = {**from_environ(ServeConfig, environ or {}), **{k: v for k, v in overrides.items() if v is not None}}
    values.update({k.replace("_", "-"): v for k, v in given.items()})
    try:
        config = msgspec.convert(values, ServeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid setting: {e}") from None
    check_engine(config, "")
    if config.cache_dir is not None:
        config.cache_dir = os.path.abspath(config.cache_dir)  # the engines find it wherever they run
    if config.slot_save_path is not None:
        config.slot_save_path = os.path.abspath(config.slot_save_path)
    if config.mmproj is not None:
        if not os.path.isfile(config.mmproj):
            raise ConfigError(f"--mmproj {config.mmproj}: no such file")
        config.mmproj = os.path.abspath(config.mmproj)  # the engines find it wherever they run
    if config.model_draft is not None:
        if not os.path.isfile(config.model_draft):
            raise ConfigError(f"--model-draft {config.model_draft}: no such file")
        config.model_draft = os.path.abspath(config.model_draft)  # the engines find it wherever they run
    for path, _ in config.lora_files:
        if not os.path.isfile(path):
            raise ConfigError(f"--lora {path}: no such file")
    config.lora = [os.path.abspath(p) for p in config.lora]  # the engines find them wherever they run
    config.lora_scaled = [
        os.path.abspath(p) + ":" + scale for p, scale in (s.rsplit(":", 1) for s in config.lora_scaled)
    ]
    if config.lora_dir is not None:
        if not os.path.isdir(config.lora_dir):
            raise ConfigError(f"--lora-dir {config.lora_dir} is not a directory")
        config.lora_dir = os.path.abspath(config.lora_dir)
    if config.chat_template_file is not None:
        if not os.path.isfile(config.chat_template_file):
            raise ConfigError(f"--chat-template-file {config.chat_template_file}: no such file")
        config.chat_template_file = os.path.abspath(config.chat_template_file)  # the frontend reads it
    return config


def check_engine(config: ServeConfig, where: str) -> None:
    """Settings llama.cpp would refuse, said before any engine starts (``where``: which model)."""
    opt = "" if where else "--"
    if config.ctx_size < config.parallel * 16:
        raise ConfigError(
            f"{where}{opt}ctx-size {config.ctx_size} leaves under 16 KV cells for each of {opt}parallel "
            f"{config.parallel} sequences"
        )
    if config.cache_type_v not in ("f16", "f32") and config.flash_attn == "off":
        raise ConfigError(
            f"{where}cache-type-v {config.cache_type_v} needs flash attention (llama.cpp quantizes V only with it)"
        )
    if "draft-simple" in config.spec_types and config.model_draft is None and config.hf_repo_draft is None:
        raise ConfigError(f"{where}{opt}spec-type draft-simple needs a draft model: {opt}model-draft FILE or -hfd")
