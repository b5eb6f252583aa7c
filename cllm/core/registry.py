"""The models `cllm serve` may serve: ids, aliases, files and each one's engine settings.

One model (``--model PATH`` or the embedded file) is a registry of one: the
single-model server. ``--models-dir`` adds every ``*.gguf`` in a directory
(its id is the file's stem); the config's ``models:`` list adds entries with
their own settings. A Hugging Face name (``--hf-repo org/repo:QUANT``, a ``--model`` that
is no file but such a name, a list entry's ``hf-repo``) becomes its cached file, pulled
first unless offline, and ``--pulled`` adds every model in the Hugging Face cache; their ids
are their names (``org/repo:QUANT``). The hub is asked through ``HubModels``
(cllm/hub/commands.py), so this bottom layer never imports its client. Requests name a
model by id or alias, never by path, so an id such as ``../x`` is simply not found.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Protocol

import msgspec

from cllm.core.config import HF_NAME, PER_MODEL, ModelEntry, ServeConfig
from cllm.core.config_load import check_engine
from cllm.core.model_file import resolve_model
from cllm.core.settings import ConfigError


class ModelSpec(msgspec.Struct, kw_only=True):
    """One registry entry, resolved: its file and the settings of its engines."""

    id: str
    path: str
    config: ServeConfig  # the top-level settings with the entry's own on top
    aliases: list[str] = []

    @property
    def replicas(self) -> int:
        return self.config.replicas


class HubModels(Protocol):
    """What the registry asks of the Hugging Face hub and cache (cllm/hub/commands.py answers)."""

    def resolve(self, name: str) -> tuple[str, str, str | None]:
        """(the model's name, its local file, the projector beside it or None) for `org/repo[:QUANT]`; ConfigError in
        one sentence if none."""

    def listed(self) -> list[tuple[str, str, str | None]]:
        """(name, file, projector or None) of every model in the cache."""


def hf_name(config: ServeConfig) -> str | None:
    """The Hugging Face name of the one model: --hf-repo, or a --model that is no file but reads as
    `org/repo[:QUANT]` (as `vllm serve org/repo` takes one)."""
    model = config.model
    if config.hf_repo is not None or model is None or not re.match(HF_NAME, model):
        return config.hf_repo
    return None if model.lower().endswith(".gguf") or os.path.exists(model) else model


def asks_hub(config: ServeConfig) -> bool:
    """Whether the settings name a model on the Hugging Face hub or in its cache, or let clients pull one."""
    return bool(
        hf_name(config)
        or config.hf_repo_draft
        or config.pulled
        or config.allow_pull
        or any(m.hf_repo for m in config.models)
    )


def is_pool(config: ServeConfig) -> bool:
    """Whether the settings ask for more than the one model of ``--model``."""
    return bool(config.models or config.models_dir or config.pulled)


def build_registry(config: ServeConfig, hub: HubModels | None = None) -> list[ModelSpec]:
    """Every model, the default one first; ConfigError (or ModelFileError, or the hub's error) says what is wrong."""
    # --mmproj and the draft model are the one model's: a pool's other files are other models (an entry of `models:`
    # may give its own)
    base = msgspec.structs.replace(config, models=[], api_key=None, mmproj=None, model_draft=None, hf_repo_draft=None)
    own = _split_threads(msgspec.structs.replace(base, mmproj=config.mmproj, model_draft=config.model_draft))
    if config.hf_repo_draft is not None:  # llama-server's -hfd
        if config.model_draft is not None:
            raise ConfigError("--model-draft and -hfd both name the draft model: give one")
        own = msgspec.structs.replace(own, model_draft=resolve_model(_hub(hub).resolve(config.hf_repo_draft)[1]))
    specs: list[ModelSpec] = []
    if config.allow_pull:
        _hub(hub)  # pulls run in the supervisor, which a Ray deployment has not
    if config.hf_repo is not None and config.model is not None:
        raise ConfigError("--model and --hf-repo both name the model to serve: give one")
    if (hub_name := hf_name(config)) is not None:
        name, path, mmproj = _hub(hub).resolve(hub_name)
        specs.append(ModelSpec(id=name, path=resolve_model(path), config=_beside(own, mmproj)))
    elif config.model is not None or not is_pool(config):
        path = resolve_model(config.model)
        specs.append(ModelSpec(id=_stem(path), path=path, config=own))
    if config.models_dir is not None:
        if not os.path.isdir(config.models_dir):
            raise ConfigError(f"--models-dir {config.models_dir} is not a directory")
        for path in sorted(glob.glob(os.path.join(glob.escape(config.models_dir), "*.gguf"))):
            specs.append(ModelSpec(id=_stem(path), path=resolve_model(path), config=_split_threads(base)))
    for entry in config.models:
        specs.append(_entry(base, entry, hub))
    if config.pulled:
        taken = {n for s in specs for n in (s.id, *s.aliases)}
        for name, path, mmproj in _hub(hub).listed():
            if name not in taken:
                specs.append(pulled_spec(config, name, path, mmproj))
        if not specs and config.allow_pull:  # an empty cache: serve the default model until pulls arrive
            path = resolve_model(None)
            specs.append(ModelSpec(id=_stem(path), path=path, config=own))
    _check_names(specs)
    if config.default_model is not None:
        default = [s for s in specs if config.default_model in (s.id, *s.aliases)]
        if not default:
            raise ConfigError(f"default-model {config.default_model} is not in the registry")
        specs.remove(default[0])
        specs.insert(0, default[0])
    if not specs:
        if config.models_dir is not None:
            raise ConfigError(f"--models-dir {config.models_dir} holds no .gguf file")
        raise ConfigError("the Hugging Face cache holds no model (`cllm pull org/repo:QUANT` fetches one)")
    return specs


def pulled_spec(config: ServeConfig, name: str, path: str, mmproj: str | None) -> ModelSpec:
    """A model of the Hugging Face cache as --pulled serves it: the top-level settings, its repo's projector."""
    base = msgspec.structs.replace(config, models=[], api_key=None, mmproj=None)
    return ModelSpec(id=name, path=resolve_model(path), config=_beside(_split_threads(base), mmproj))


def _hub(hub: HubModels | None) -> HubModels:
    if hub is None:
        # Only `cllm serve` without --ray passes the hub: Ray's replicas build their registry from the settings alone.
        raise ConfigError(
            "--ray serves model files, not Hugging Face names (hf-repo, --pulled): `cllm pull` the model, pass its path"
        )
    return hub


def _entry(base: ServeConfig, entry: ModelEntry, hub: HubModels | None) -> ModelSpec:
    if (entry.path is None) == (entry.hf_repo is None):
        raise ConfigError(f"model {entry.id or entry.hf_repo or '?'}: give either path or hf-repo")
    if entry.path is not None and entry.id is None:
        raise ConfigError(f"model {entry.path}: an entry with a path needs an id")
    own = {f: getattr(entry, f) for f in PER_MODEL if getattr(entry, f) is not None}
    config = _split_threads(msgspec.structs.replace(base, **own))
    check_engine(config, f"model {entry.id or entry.hf_repo}: ")
    if config.mmproj is not None:
        if not os.path.isfile(config.mmproj):
            raise ConfigError(f"model {entry.id or entry.hf_repo}: mmproj {config.mmproj}: no such file")
        config = msgspec.structs.replace(config, mmproj=os.path.abspath(config.mmproj))
    if config.model_draft is not None:
        if not os.path.isfile(config.model_draft):
            raise ConfigError(f"model {entry.id or entry.hf_repo}: model-draft {config.model_draft}: no such file")
        config = msgspec.structs.replace(config, model_draft=os.path.abspath(config.model_draft))
    if entry.hf_repo is not None:
        name, path, mmproj = _hub(hub).resolve(entry.hf_repo)
        config = _beside(config, mmproj)
    else:
        name, path = str(entry.id), str(entry.path)
    return ModelSpec(id=entry.id or name, path=resolve_model(path), config=config, aliases=list(entry.aliases))


def _beside(config: ServeConfig, mmproj: str | None) -> ServeConfig:
    """A pulled model's settings with the projector its repo has beside it (llama-server's `-hf`), unless one is
    given or --no-mmproj says text only."""
    if mmproj is None or config.mmproj is not None or not config.mmproj_auto:
        return config
    return msgspec.structs.replace(config, mmproj=mmproj)


def _split_threads(config: ServeConfig) -> ServeConfig:
    """Replicas share the cores unless threads are set."""
    if config.threads or config.replicas == 1:
        return config
    return msgspec.structs.replace(config, threads=max(1, config.n_threads // config.replicas))


def _stem(path: str) -> str:
    return os.path.basename(path).removesuffix(".gguf")


def _check_names(specs: list[ModelSpec]) -> None:
    seen: dict[str, str] = {}
    for spec in specs:
        for name in (spec.id, *spec.aliases):
            if name in seen:
                raise ConfigError(f"model name {name} is used twice (by {seen[name]} and {spec.id})")
            seen[name] = spec.id
