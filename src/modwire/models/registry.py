"""Model registry, in the style of timm: ``create_model(name, **overrides)``.

A preset is a named config (usually one column of a paper's hyperparameter table)
bound to a model class. Overrides replace config fields and are validated.
"""
from __future__ import annotations

import fnmatch
import os
from typing import Any, Callable

from torch import nn

from .base import MODEL_TYPES, PretrainedModel, load_model, read_pretrained, unknown_name
from .classifier_api import Classifier
from .config import ModelConfig
from ..errors import UserError, UserTypeError

_PRESETS: dict[str, tuple[type[PretrainedModel], Callable[[], ModelConfig], str]] = {}
_MODEL_TYPES = MODEL_TYPES   # the table loading dispatches on (models.base); a test may swap in a copy


def register_model_type(cls: type[PretrainedModel]) -> type[PretrainedModel]:
    _MODEL_TYPES[cls.config_class.model_type] = cls
    return cls


def register_preset(name: str, cls: type[PretrainedModel], make_config: Callable[[], ModelConfig],
                    source: str = "") -> None:
    """Register ``name`` → ``cls(make_config())``; ``source`` cites the paper table."""
    if name in _PRESETS:
        raise UserError(f"model preset {name!r} is already registered")
    _PRESETS[name] = (cls, make_config, source)


def list_models(pattern: str = "*") -> list[str]:
    """Registered preset names matching a glob pattern, sorted."""
    return sorted(n for n in _PRESETS if fnmatch.fnmatch(n, pattern))


def model_source(name: str) -> str:
    """The paper table a preset reproduces."""
    return get_preset(name)[2]


def get_preset(name: str) -> tuple[type[PretrainedModel], Callable[[], ModelConfig], str]:
    if not isinstance(name, str):
        got = f"{type(name).__name__} {name!r:.60}"
        if isinstance(name, ModelConfig) and name.model_type in _MODEL_TYPES:
            got = (f"a {type(name).__name__}; to build a model from a config, call "
                   f"{_MODEL_TYPES[name.model_type].__name__}(config)")
        raise UserTypeError(f"expected a model preset name (str) such as 'nac_small', got {got}")
    if name not in _PRESETS:
        raise unknown_name("model", name, list_models())
    return _PRESETS[name]


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The config of preset ``name`` with ``overrides`` applied."""
    _, make_config, _ = get_preset(name)
    return make_config().replace(**overrides)


#: timm's ``create_model`` keywords, mapped onto each family's config fields (``Classifier.timm_overrides``).
TIMM_KEYWORDS = ("in_chans", "drop_rate", "global_pool")


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build preset ``name``; keyword overrides replace config fields (validated). timm's ``in_chans``,
    ``drop_rate`` and ``global_pool`` set the fields they mean in the model's family (a classifier's
    ``timm_overrides``; an error where the family has no such thing). ``"hf-hub:org/name"`` (timm's
    prefix) loads the model saved there (:func:`from_pretrained`, through the Hub's cache)."""
    if isinstance(name, str) and name.startswith("hf-hub:"):
        if not name.removeprefix("hf-hub:").strip():
            raise UserError(f"create_model({name!r}): expected a Hub repo id after 'hf-hub:', e.g. 'hf-hub:org/name'")
        if overrides:
            raise UserError(f"create_model({name!r}): a model from the Hub is built from its saved config.json; "
                            f"{sorted(overrides)} cannot be applied to it (load it, then reset_classifier(n) for "
                            f"another class count)")
        return from_pretrained(name.removeprefix("hf-hub:"))
    cls, _, _ = get_preset(name)
    timm = {k: overrides.pop(k) for k in TIMM_KEYWORDS if k in overrides}
    if timm:
        if not issubclass(cls, Classifier):
            raise UserError(f"create_model: {sorted(timm)} (timm's classifier keywords) do not apply to a "
                            f"{cls.__name__}, which is not an image classifier; set its config fields instead")
        mapped = cls.timm_overrides(get_config(name), **timm)
        clash = sorted(set(mapped) & set(overrides))
        if clash:
            raise UserError(f"create_model: {sorted(timm)} set the config field(s) {clash}, which are also given "
                            f"directly: give one of them")
        overrides.update(mapped)
    return cls(get_config(name, **overrides))


def from_pretrained(name_or_path: str | os.PathLike, map_location: str = "cpu", *,
                    config: ModelConfig | None = None, **hub: Any) -> nn.Module:
    """Load any model saved with ``save_pretrained`` (dispatching on its ``model_type``), from a folder
    or a Hub repo id (``"org/name"``, through the Hub's cache; ``hub``: ``revision``, ``cache_dir``,
    ``force_download``, ``token``, ``local_files_only``, :func:`modwire.hub.resolve`). ``config``: the
    config of a folder of weights without ``config.json`` (accelerate's ``save_model``)."""
    from ..hub import resolve

    directory = resolve(name_or_path, **hub)
    config, state = read_pretrained(directory, config=config)
    return load_model(_MODEL_TYPES[config.model_type], config, state, directory, map_location)
