"""What every modwire model shares: typed configs, tokenizer settings, save/load.

Configs are dataclasses validated at construction: a wrong key, type or value
raises an error that names the field, what it got and what is allowed. They
round-trip through JSON (``to_json`` / ``from_json``).

``save_pretrained(dir)`` writes ``config.json`` and ``model.safetensors``
atomically (temporary file, then rename); ``from_pretrained(dir)`` never unpickles.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer
from ..nn.init import single_thread
from .inputs import InputSpec, Inputs, check_inputs

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"config field {name!r}: got {value!r}, expected one of {list(choices)}")


@dataclass(frozen=True)
class Bounds:
    """The values a numeric config field accepts. Each config class declares its fields'
    bounds once, in its ``bounds`` table; :class:`ConfigBase` checks them and names the full
    key path, the value given and what is expected. ``lo`` / ``hi`` are numbers or the name of
    a sibling field (``pad_id < vocab_size``); ``multiple_of``: the value is a multiple of it
    (an image size vs. the tokenizer's total stride); ``divides``: the value divides that
    sibling field (attention heads split ``d_model``). NaN and inf are refused for every field."""

    lo: float | str | None = None
    hi: float | str | None = None
    lo_open: bool = False
    hi_open: bool = False
    multiple_of: int | None = None
    divides: str | None = None
    note: str = ""

    def check(self, cfg: "ConfigBase", name: str, prefix: str) -> None:
        value = getattr(cfg, name)
        if value is None:           # an Optional field left unset (``truncation=None``)
            return
        lo, hi = self._bound(cfg, self.lo), self._bound(cfg, self.hi)
        ok = (math.isfinite(value)
              and (lo is None or (value > lo if self.lo_open else value >= lo))
              and (hi is None or (value < hi if self.hi_open else value <= hi))
              and (self.multiple_of is None or value % self.multiple_of == 0)
              and (self.divides is None or (value > 0 and getattr(cfg, self.divides) % value == 0)))
        if not ok:
            raise ValueError(f"config field {prefix + name!r}: got {value!r}, expected "
                             f"{self.describe(cfg, isinstance(value, int))}")

    def describe(self, cfg: "ConfigBase", integer: bool) -> str:
        """What the field accepts, in words: ``'an integer >= 1 that divides d_model=96'``."""
        def show(bound: float | str) -> str:
            return f"{bound}={getattr(cfg, bound)}" if isinstance(bound, str) else f"{bound:g}"

        parts = ["an integer" if integer else "a finite number"]
        if self.lo is not None and self.hi is not None:
            parts.append(f"in {'(' if self.lo_open else '['}{show(self.lo)}, {show(self.hi)}"
                         f"{')' if self.hi_open else ']'}")
        elif self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {show(self.lo)}")
        elif self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {show(self.hi)}")
        if self.multiple_of is not None:
            parts.append(f"and a multiple of {self.multiple_of}")
        if self.divides is not None:
            parts.append(f"that divides {show(self.divides)}")
        return " ".join(parts) + (f" ({self.note})" if self.note else "")

    @staticmethod
    def _bound(cfg: "ConfigBase", bound: float | str | None) -> float | None:
        return getattr(cfg, bound) if isinstance(bound, str) else bound


COUNT = Bounds(lo=1)                                 # sizes, dims, heads, layers, module counts
POSITIVE = Bounds(lo=0, lo_open=True)                # temperatures, bandwidths, δ
# (a dropout-like rate would be Bounds(lo=0, hi=1, hi_open=True))


def heads_of(dim: str) -> Bounds:
    """An attention head count: ≥ 1 and divides ``dim`` (heads split the width)."""
    return Bounds(lo=1, divides=dim)


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


@dataclass
class ConfigBase:
    """Typed, validated dataclass config. Fields that are themselves configs (sub-configs,
    e.g. ``kernel``) accept a dict, which is merged into the default sub-config; the whole
    tree is type-checked and validated from the root, so errors name the full path
    (``'kernel.tau'``). Numeric fields declare what they accept in ``bounds`` (checked here,
    NaN and inf refused everywhere); ``validate`` holds the checks a table cannot say."""

    _prefix: ClassVar[str] = ""   # the field path of a sub-config, set while it is checked
    bounds: ClassVar[dict[str, Bounds]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            hint, value = hints[f.name], getattr(self, f.name)
            if _is_config(hint) and isinstance(value, dict):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else hint()
                setattr(self, f.name, default.merged(value, path=f.name))
        if isinstance(self, ModelConfig):
            self._check("")

    def _check(self, prefix: str) -> None:
        object.__setattr__(self, "_prefix", prefix)
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            hint, value = hints[f.name], getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and hint is float:
                setattr(self, f.name, float(value))
            elif not _type_ok(value, hint):
                raise TypeError(f"config field {prefix + f.name!r}: got {value!r} ({type(value).__name__}), "
                                f"expected {getattr(hint, '__name__', hint)}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"config field {prefix + f.name!r}: got {value!r}, expected a finite number")
            if isinstance(value, ConfigBase) and f.name not in self.unused_fields():
                value._check(f"{prefix}{f.name}.")
        unused = self.unused_fields()
        for name, bounds in self.bounds.items():
            if name not in unused:
                bounds.check(self, name, prefix)
        self.validate()

    def unused_fields(self) -> tuple[str, ...]:
        """Fields (sub-configs included) that the current settings do not use: their values
        are type-checked but not validated (``tokenizer.vocab_size`` of a conv tokenizer)."""
        return ()

    def validate(self) -> None:
        """Check values; raise ValueError naming the field and the allowed values."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def merged(self, overrides: dict[str, Any], path: str = "") -> "ConfigBase":
        """A copy with ``overrides`` applied; nested dicts merge into sub-configs."""
        _check_keys(type(self), overrides, path)
        changes = {}
        for key, value in overrides.items():
            current = getattr(self, key)
            if isinstance(current, ConfigBase) and isinstance(value, dict):
                value = current.merged(value, path=f"{path}.{key}" if path else key)
            changes[key] = value
        return dataclasses.replace(self, **changes)


def deep_merge(base: dict, extra: dict) -> dict:
    """``base`` updated by ``extra``, nested dicts merged key by key (both left unchanged)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def _is_config(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, ConfigBase)


@dataclass
class ModelConfig(ConfigBase):
    """Base of all model configs. Subclasses set ``model_type``, implement ``validate`` and
    list renamed fields in ``legacy_keys`` (old flat name → new dotted path), so configs
    written by older versions keep loading."""

    model_type: ClassVar[str] = ""
    legacy_keys: ClassVar[dict[str, str]] = {}

    @classmethod
    def normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrite legacy flat keys into the current nested form (``{"tau": 1}`` →
        ``{"kernel": {"tau": 1}}``); a string where a sub-config is expected sets its ``kind``
        or ``name`` (``{"tokenizer": "conv"}`` → ``{"tokenizer": {"kind": "conv"}}``)."""
        out: dict[str, Any] = {}
        hints = typing.get_type_hints(cls)
        for key, value in data.items():
            sub = _is_config(hints.get(key))
            if sub and isinstance(value, (dict, ConfigBase)):
                path = [key]
            elif sub:  # a string where a sub-config is expected: its kind (or name)
                path = [key, "kind" if "kind" in hints[key].field_names() else "name"]
            else:
                path = cls.legacy_keys.get(key, key).split(".")
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            if isinstance(value, ConfigBase):
                value = dataclasses.asdict(value)
            leaf = node.get(path[-1])
            node[path[-1]] = deep_merge(leaf, value) if isinstance(leaf, dict) and isinstance(value, dict) \
                else copy.deepcopy(value)   # the caller's dicts are never modified
        return out

    def input_overrides(self, inputs: Inputs, num_classes: int) -> dict[str, Any]:
        """The config fields (nested form) that fit this model to a task's ``inputs`` (an
        :class:`~modwire.models.inputs.InputSpec` or a mapping of named specs) and class count.
        Each model type implements it for its own input layer; an input it cannot read is a
        ValueError that says so."""
        raise ValueError(f"model type {self.model_type!r} does not say how it reads a task's inputs "
                         f"(its config class implements no input_overrides)")

    def input_names(self) -> tuple[str, ...]:
        """The names of the inputs this configured model takes (``("x",)``: one input, ``model(x)``)."""
        return ("x",)

    def for_inputs(self, inputs: Inputs, num_classes: int) -> "ModelConfig":
        """This config fitted to a task's inputs and class count: ``replace(**input_overrides(...))``."""
        return self.replace(**self.input_overrides(check_inputs(inputs), num_classes))

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A copy with some fields changed (validated); sub-configs take partial dicts."""
        return self.merged(self.normalize(overrides))

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):
            raise ValueError(f"a model config must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        kind = data.pop("model_type", cls.model_type)
        if kind != cls.model_type:
            raise ValueError(f"config is for model_type {kind!r}, not {cls.model_type!r}")
        return cls().replace(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))


def _check_keys(cls: type, keys: dict[str, Any], path: str = "") -> None:
    unknown = sorted(set(keys) - set(cls.field_names()))
    if unknown:
        where = f" in {path!r}" if path else ""
        raise KeyError(f"unknown {cls.__name__} field(s) {unknown}{where}; valid fields: {cls.field_names()}")


TOKENIZERS = ("conv", "linear", "embedding")


@dataclass
class TokenizerConfig(ConfigBase):
    """How an input becomes the token set ``X`` (a sub-config: ``tokenizer``).

    ``conv``: NAC App. C preprocessor for ``[B, in_channels, image_size, image_size]``
    images; tokens are ``conv_channels + pos_dim`` wide. ``linear``: sets/sequences
    ``[B, N, input_dim]`` → ``token_dim``. ``embedding``: ids ``[B, N]`` <
    ``vocab_size`` → ``token_dim``. ``max_len > 0`` adds learned positions (linear,
    embedding); ``pad_id`` (embedding) is hidden from the attention that reads the tokens.
    """

    kind: str = "conv"
    image_size: int = 64
    in_channels: int = 3
    conv_channels: int = 320
    pos_dim: int = 64
    input_dim: int = 0
    vocab_size: int = 0
    token_dim: int = 384
    max_len: int = 0
    pad_id: int = -1          # embedding: this id is padding (-1: none)

    bounds = {"image_size": Bounds(lo=8, multiple_of=8, note="the conv tokenizer downsamples by 4, then 2"),
              "in_channels": COUNT, "conv_channels": COUNT, "pos_dim": COUNT, "input_dim": COUNT,
              "vocab_size": COUNT, "token_dim": COUNT, "max_len": Bounds(lo=0, note="0: no learned positions"),
              "pad_id": Bounds(lo=-1, hi="vocab_size", hi_open=True, note="-1: no padding id")}
    uses: ClassVar[dict[str, tuple[str, ...]]] = {
        "conv": ("image_size", "in_channels", "conv_channels", "pos_dim"),
        "linear": ("input_dim", "token_dim", "max_len"),
        "embedding": ("vocab_size", "token_dim", "max_len", "pad_id")}

    def validate(self) -> None:
        check_choice(self._prefix + "kind", self.kind, TOKENIZERS)

    def unused_fields(self) -> tuple[str, ...]:   # an unknown kind: validate() names it
        return tuple(n for n in self.bounds if n not in self.uses.get(self.kind, ()))


    @staticmethod
    def for_input(spec: InputSpec) -> dict[str, Any]:
        """The tokenizer fields that read ``spec`` (NAC/Perceiver IO's input layer): images →
        ``conv`` (NAC App. C), token ids → ``embedding`` with learned positions up to the spec's
        length and its padding id, vectors → ``linear`` with learned positions only for an ordered
        sequence (a set stays permutation-invariant). Widths (``token_dim``, ``conv_channels``,
        ``pos_dim``) are the model's own and are left alone."""
        if spec.kind == "image":
            if spec.height != spec.width or spec.height % 8:
                raise ValueError(f"the conv tokenizer reads square images whose side is a multiple of 8 "
                                 f"(two downsamplings, 4 then 2); the task gives {spec.channels}x{spec.height}"
                                 f"x{spec.width} images (resize or pad them, e.g. mnist's pad_to=32)")
            return {"kind": "conv", "image_size": spec.height, "in_channels": spec.channels}
        if spec.kind == "tokens":
            return {"kind": "embedding", "vocab_size": spec.vocab_size, "max_len": spec.length,
                    "pad_id": -1 if spec.pad_id is None else spec.pad_id}
        if spec.ordered and spec.length is None:
            raise ValueError("the linear tokenizer needs the length of an ordered sequence of vectors "
                             "(for its learned positions); the task gives length=None")
        return {"kind": "linear", "input_dim": spec.dim, "max_len": spec.length if spec.ordered else 0}


def single_input(inputs: Inputs, model_type: str) -> InputSpec:
    """The one input of a single-input model, or a ValueError naming the inputs it was given."""
    if isinstance(inputs, InputSpec):
        return inputs
    if list(inputs) == ["x"]:
        return inputs["x"]
    raise ValueError(f"a {model_type!r} model reads one input, but the task gives the named inputs "
                     f"{sorted(inputs)} (a multimodal task: use a model that takes them, e.g. a "
                     f"conditional NAC for {{'x', 'condition'}})")


TOKENIZER_LEGACY_KEYS = {"tokenizer": "tokenizer.kind", **{k: f"tokenizer.{k}" for k in (
    "image_size", "in_channels", "conv_channels", "pos_dim", "input_dim", "vocab_size", "token_dim",
    "max_len", "pad_id")}}


def build_tokenizer(cfg: TokenizerConfig) -> nn.Module:
    if cfg.kind == "conv":
        return ConvTokenizer(cfg.image_size, cfg.in_channels, cfg.conv_channels, cfg.pos_dim)
    if cfg.kind == "linear":
        return LinearTokenizer(cfg.input_dim, cfg.token_dim, cfg.max_len)
    return EmbeddingTokenizer(cfg.vocab_size, cfg.token_dim, cfg.max_len, None if cfg.pad_id < 0 else cfg.pad_id)


@dataclass
class Intermediates:
    """What one forward pass computed, for analysis (NAC Fig. 6, 8; App. F). Shapes for a
    batch of ``B``: ``logits [B, C]``, ``states`` (final processor states) ``[B, U, d]``,
    ``read_in_attention [B, H, U, N]``, ``propagator_attention`` one ``[B, H, U, U]`` per layer,
    ``read_out_attention [B, H, U_o, U]``, ``readout_confidence [B, U_o]``; NAC only:
    ``link_probs`` ``P`` of Eq. 2 ``[(B,) U, U]`` (per sample for a conditional NAC),
    ``readout_link_probs [(B,) U_o, U]`` and the ``circuit`` design the generator produced."""

    logits: Tensor
    states: Tensor
    read_in_attention: Tensor | None = None
    propagator_attention: list[Tensor] = dataclasses.field(default_factory=list)
    read_out_attention: Tensor | None = None
    readout_confidence: Tensor | None = None
    link_probs: Tensor | None = None
    readout_link_probs: Tensor | None = None
    circuit: Any = None


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
        return self.existing_names("tokenizer.pos")

    def existing_names(self, *fragments: str) -> tuple[str, ...]:
        """The ``fragments`` that occur in at least one parameter name of this model."""
        names = [n for n, _ in self.named_parameters()]
        return tuple(f for f in fragments if any(f in n for n in names))

    # Weights saved by older versions: (regex, replacement) renames of state-dict keys, applied
    # in order to a key that this model does not have.
    legacy_state_keys: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"^(propagators\.\d+\.attn)\.attn\.", r"\1.fn."),     # v0.1 blocks → PreNorm
        (r"^(.*\.ffn)\.ffn\.", r"\1.fn."),
        (r"^(read_in|read_out)\.norm_q\.", r"\1.attn.norm."),
        (r"^(read_in)\.norm_x\.", r"\1.attn.norm_context."),
        (r"^(read_out)\.norm_kv\.", r"\1.attn.norm_context."),
        (r"^(read_in|read_out)\.attn\.(q|k|v|o)\.", r"\1.attn.fn.\2."),
    )

    def prepare_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Called before weights are loaded: a model whose optional parts (e.g. a NAC's
        edge-masked kernel after sparsification) are in ``state`` installs them here."""

    def auxiliary_losses(self) -> dict[str, Tensor]:
        """Named auxiliary losses of the last forward pass in training mode: scalars that carry
        gradient, e.g. NAC's graph structure regularizer ``{"graph": L_graph(P, P0)}`` (NAC App. A,
        Eq. 6-9) or an Associative Transformer's balance loss. The trainer adds
        ``Σ_name weight[name] · loss`` (weights from the training config's ``aux_loss_weights``;
        a reported loss without a weight is an error), scales it like the task loss under
        gradient accumulation and logs each as ``aux/<name>``. A model computes them inside
        ``forward`` and returns them here; in eval mode it returns ``{}``. Default: none."""
        return {}

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (each atomically) into ``directory``."""
        from safetensors.torch import save_file

        from ..manifest import MANIFEST_FILE

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / MANIFEST_FILE).unlink(missing_ok=True)   # a checkpoint's checksums no longer describe the files
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        _atomic_write(d / WEIGHTS_FILE, lambda p: save_file(tensors, p, metadata={"format": "pt"}))
        _atomic_write(d / CONFIG_FILE, lambda p: Path(p).write_text(self.config.to_json()))
        return d

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str | torch.device = "cpu"):
        config, state = read_pretrained(directory)
        if not isinstance(config, cls.config_class):
            raise ValueError(f"{directory} holds a {config.model_type!r} model, not {cls.config_class.model_type!r}")
        return _load(cls, config, state, directory, map_location)


def read_pretrained(directory: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read ``config.json`` (→ the right config class) and the safetensors weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .registry import config_class

    d = Path(directory)
    layout = f"expected {d}/{CONFIG_FILE} and {d}/{WEIGHTS_FILE} (written by save_pretrained)"
    if not (d / CONFIG_FILE).is_file() or not (d / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"not a saved modwire model: {layout}")
    config = _read_config(d / CONFIG_FILE, config_class)
    from ..manifest import verify_manifest

    verify_manifest(d)   # a checkpoint's sha256 manifest, when there is one (modwire.training)
    try:
        state = load_file(str(d / WEIGHTS_FILE))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{d / WEIGHTS_FILE} is not a readable safetensors file ({e}); {layout}") from e
    return config, state


_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
               type(None): "null"}


def _read_config(path: Path, config_class: typing.Callable[[str], type[ModelConfig]]) -> ModelConfig:
    """``config.json`` → its config; every error is one line naming ``path`` and what was expected."""
    expected = "a JSON object with a 'model_type' key (as written by save_pretrained)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}); expected {expected}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                         f"expected {expected}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected {expected}, got {_JSON_KINDS.get(type(data), type(data).__name__)}")
    if not isinstance(data.get("model_type"), str):
        got = f"model_type {data['model_type']!r}" if "model_type" in data else "no 'model_type' key"
        raise ValueError(f"{path}: expected {expected}, got {got}")
    try:
        return config_class(data["model_type"]).from_dict(data)
    except (KeyError, ValueError, TypeError) as e:   # a field's error, prefixed with the file
        raise type(e)(f"{path}: {e.args[0] if e.args else e}") from None


def upgrade_state_dict(model: "PretrainedModel", state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename the keys of weights saved by an older version (``legacy_state_keys``)."""
    own = set(model.state_dict())
    out = {}
    for key, value in state.items():
        for pattern, repl in model.legacy_state_keys:
            if key in own:
                break
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


def _load(cls: type[nn.Module], config: ModelConfig, state: dict[str, torch.Tensor], where: Any,
          map_location) -> nn.Module:
    """``cls(config)`` holding ``state``, without initialising the weights it then overwrites:
    the model is built on the meta device (no memory, no sampling) and the loaded tensors are
    assigned to it. Should a tensor not come from ``state`` (a buffer left out of the state
    dict, a plain tensor attribute), the model is built and initialised normally instead, so
    nothing stays unset on the meta device."""
    with torch.device("meta"):
        model = cls(config)
    if not _fill(model, state, where, assign=True):
        model = cls(config)
        _fill(model, state, where, assign=False)
    return model.to(map_location)


def _fill(model: nn.Module, state: dict[str, torch.Tensor], where: Any, *, assign: bool) -> bool:
    """Load ``state`` into ``model``; with ``assign``, the tensors of ``state`` become the
    model's (copied once into the dtype the model declares). False if a tensor is left unset (meta)."""
    state = upgrade_state_dict(model, state)
    model.prepare_state_dict(state)
    own = model.state_dict()
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise ValueError(f"weights in {where} do not match the config: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    if assign:  # fresh, aligned storage: safetensors' tensors may sit at any offset of the file
        # buffer, and a misaligned weight changes the SIMD summation order (logits differ in ulps).
        # One thread: a memory-bound copy gains little from more, and stalls when cores are shared.
        with single_thread():
            state = {k: torch.empty(v.shape, dtype=own[k].dtype, device=v.device).copy_(v) for k, v in state.items()}
    try:
        model.load_state_dict(state, assign=assign)
    except RuntimeError as e:  # shape mismatches: name the files, keep torch's details
        raise ValueError(f"weights in {where} do not match its config.json: {e}") from None
    return not any(isinstance(t, Tensor) and t.is_meta for m in model.modules()
                   for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values()))
