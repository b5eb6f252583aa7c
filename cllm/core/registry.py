"""The models `cllm serve` may serve: ids, aliases, files and each one's engine settings.

One model (``--model PATH`` or the embedded file) is the registry of today's
single-model server. ``--models-dir`` adds every ``*.gguf`` in a directory
(its id is the file's stem); the config's ``models:`` list adds entries with
their own settings. Requests name a model by id or alias, never by path, so an
id such as ``../x`` is simply not found.
"""

from __future__ import annotations

import glob
import os

import msgspec

from cllm.core.config import PER_MODEL, ConfigError, ModelEntry, ServeConfig, check_engine
from cllm.core.model_file import resolve_model


class ModelSpec(msgspec.Struct, kw_only=True):
    """One registry entry, resolved: its file and the settings of its engines."""

    id: str
    path: str
    config: ServeConfig  # the top-level settings with the entry's own on top
    aliases: list[str] = []

    @property
    def replicas(self) -> int:
        return self.config.replicas


def is_pool(config: ServeConfig) -> bool:
    """Whether the settings ask for more than today's one model."""
    return bool(config.models or config.models_dir)


def build_registry(config: ServeConfig) -> list[ModelSpec]:
    """Every model, the default one first; ConfigError (or ModelFileError) says what is wrong."""
    base = msgspec.structs.replace(config, models=[], api_key=None)
    specs: list[ModelSpec] = []
    if config.model is not None or not is_pool(config):
        path = resolve_model(config.model)
        specs.append(ModelSpec(id=_stem(path), path=path, config=_split_threads(base)))
    if config.models_dir is not None:
        if not os.path.isdir(config.models_dir):
            raise ConfigError(f"--models-dir {config.models_dir} is not a directory")
        for path in sorted(glob.glob(os.path.join(glob.escape(config.models_dir), "*.gguf"))):
            specs.append(ModelSpec(id=_stem(path), path=resolve_model(path), config=_split_threads(base)))
    for entry in config.models:
        specs.append(_entry(base, entry))
    _check_names(specs)
    if config.default_model is not None:
        default = [s for s in specs if config.default_model in (s.id, *s.aliases)]
        if not default:
            raise ConfigError(f"default-model {config.default_model} is not in the registry")
        specs.remove(default[0])
        specs.insert(0, default[0])
    if not specs:
        raise ConfigError(f"--models-dir {config.models_dir} holds no .gguf file")
    return specs


def _entry(base: ServeConfig, entry: ModelEntry) -> ModelSpec:
    own = {f: getattr(entry, f) for f in PER_MODEL if getattr(entry, f) is not None}
    config = _split_threads(msgspec.structs.replace(base, **own))
    check_engine(config, f"model {entry.id}: ")
    return ModelSpec(id=entry.id, path=resolve_model(entry.path), config=config, aliases=list(entry.aliases))


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
