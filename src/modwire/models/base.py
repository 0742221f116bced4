"""What every modwire model shares: typed configs, tokenizer settings, save/load.

Configs are dataclasses validated at construction: a wrong key, type or value
raises an error that names the field, what it got and what is allowed. They
round-trip through JSON (``to_json`` / ``from_json``).

``save_pretrained(dir)`` writes ``config.json`` and ``model.safetensors``
atomically (temporary file, then rename); ``from_pretrained(dir)`` never unpickles.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"config field {name!r}: got {value!r}, expected one of {list(choices)}")


def check_positive(obj: Any, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value < 0 or (value == 0 and not allow_zero):
            raise ValueError(f"config field {name!r}: got {value!r}, expected a {'non-negative' if allow_zero else 'positive'} number")


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


@dataclass
class ModelConfig:
    """Base of all model configs. Subclasses set ``model_type`` and implement ``validate``."""

    model_type: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and hints[f.name] is float:
                setattr(self, f.name, float(value))
            elif not _type_ok(value, hints[f.name]):
                raise TypeError(f"config field {f.name!r}: got {value!r} ({type(value).__name__}), "
                                f"expected {hints[f.name]}")
        self.validate()

    def validate(self) -> None:
        """Check values; raise ValueError naming the field and the allowed values."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A copy with some fields changed (validated)."""
        _check_keys(type(self), overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        data = dict(data)
        kind = data.pop("model_type", cls.model_type)
        if kind != cls.model_type:
            raise ValueError(f"config is for model_type {kind!r}, not {cls.model_type!r}")
        _check_keys(cls, data)
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))


def _check_keys(cls: type, keys: dict[str, Any]) -> None:
    unknown = sorted(set(keys) - set(cls.field_names()))
    if unknown:
        raise KeyError(f"unknown {cls.__name__} field(s) {unknown}; valid fields: {cls.field_names()}")


TOKENIZERS = ("conv", "linear", "embedding")


@dataclass
class TokenizerConfig:
    """Input tokenizer settings shared by NAC and Perceiver IO (mixed into their configs).

    ``conv``: NAC App. C preprocessor for ``[B, in_channels, image_size, image_size]``
    images; tokens are ``conv_channels + pos_dim`` wide. ``linear``: sets/sequences
    ``[B, N, input_dim]`` → ``token_dim``. ``embedding``: ids ``[B, N]`` <
    ``vocab_size`` → ``token_dim``. ``max_len > 0`` adds learned positions (linear,
    embedding).
    """

    tokenizer: str = "conv"
    image_size: int = 64
    in_channels: int = 3
    conv_channels: int = 320
    pos_dim: int = 64
    input_dim: int = 0
    vocab_size: int = 0
    token_dim: int = 384
    max_len: int = 0
    pad_id: int = -1          # embedding: this id is padding, hidden from the read-in (-1: none)

    def validate_tokenizer(self) -> None:
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
        if self.tokenizer == "conv":
            check_positive(self, "image_size", "in_channels", "conv_channels", "pos_dim")
            if self.image_size % 8:
                raise ValueError(f"config field 'image_size': got {self.image_size}, expected a multiple of 8")
        elif self.tokenizer == "linear":
            check_positive(self, "input_dim", "token_dim")
        else:
            check_positive(self, "vocab_size", "token_dim")
            if not -1 <= self.pad_id < self.vocab_size:
                raise ValueError(f"config field 'pad_id': got {self.pad_id}, expected -1 (none) or an id "
                                 f"in [0, vocab_size={self.vocab_size})")
        check_positive(self, "max_len", allow_zero=True)


def build_tokenizer(cfg: TokenizerConfig) -> nn.Module:
    if cfg.tokenizer == "conv":
        return ConvTokenizer(cfg.image_size, cfg.in_channels, cfg.conv_channels, cfg.pos_dim)
    if cfg.tokenizer == "linear":
        return LinearTokenizer(cfg.input_dim, cfg.token_dim, cfg.max_len)
    return EmbeddingTokenizer(cfg.vocab_size, cfg.token_dim, cfg.max_len, None if cfg.pad_id < 0 else cfg.pad_id)


def _atomic_write(path: Path, write: typing.Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class PretrainedModel(nn.Module):
    """Mixin for models with a ``config``: save/load and parameter counting."""

    config_class: ClassVar[type[ModelConfig]]
    config: ModelConfig

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    def no_weight_decay(self) -> tuple[str, ...]:
        """Name fragments of parameters trained without weight decay (besides all 1-D ones)."""
        return ("tokenizer.pos",)

    def prepare_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Called before weights are loaded: a model whose optional buffers (e.g. a NAC's
        edge mask after sparsification) are in ``state`` creates them here."""

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (each atomically) into ``directory``."""
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        _atomic_write(d / WEIGHTS_FILE, lambda p: save_file(tensors, p, metadata={"format": "pt"}))
        _atomic_write(d / CONFIG_FILE, lambda p: Path(p).write_text(self.config.to_json()))
        return d

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str | torch.device = "cpu"):
        config, state = read_pretrained(directory)
        if not isinstance(config, cls.config_class):
            raise ValueError(f"{directory} holds a {config.model_type!r} model, not {cls.config_class.model_type!r}")
        return _load(cls(config), state, directory, map_location)


def read_pretrained(directory: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read ``config.json`` (→ the right config class) and the safetensors weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .registry import config_class

    d = Path(directory)
    layout = f"expected {d}/{CONFIG_FILE} and {d}/{WEIGHTS_FILE} (written by save_pretrained)"
    if not (d / CONFIG_FILE).is_file() or not (d / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"not a saved modwire model: {layout}")
    try:
        data = json.loads((d / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{d / CONFIG_FILE} is not valid JSON: {e}") from e
    config = config_class(data.get("model_type", "")).from_dict(data)
    try:
        state = load_file(str(d / WEIGHTS_FILE))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{d / WEIGHTS_FILE} is not a readable safetensors file ({e}); {layout}") from e
    return config, state


def _load(model: nn.Module, state: dict[str, torch.Tensor], where: Any, map_location) -> nn.Module:
    model.prepare_state_dict(state)
    missing, unexpected = set(model.state_dict()) - set(state), set(state) - set(model.state_dict())
    if missing or unexpected:
        raise ValueError(f"weights in {where} do not match the config: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # shape mismatches: name the files, keep torch's details
        raise ValueError(f"weights in {where} do not match its config.json: {e}") from None
    return model.to(map_location)
