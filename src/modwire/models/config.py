"""The typed config machinery every modwire model config is built from.

:class:`ConfigBase`: a dataclass validated at construction (types, then the ``choices`` and
numeric :class:`~modwire.fields.Bounds` tables each class declares, checked by the shared
:func:`modwire.fields.check_fields`, then its own ``validate``), whose sub-configs accept
partial dicts; a wrong key, type or value raises an error naming the full key path
(``'kernel.tau'``), what it got and what is allowed. :class:`ModelConfig`: the root of a
model's config, fitting to a task's inputs, and the JSON round trip (``to_json`` / ``from_json``).
Small helpers: ``COUNT``, ``POSITIVE`` and ``Bounds`` (from :mod:`modwire.fields`), ``heads_of``,
``check_head_split``, ``check_choice``, ``deep_merge``.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from .inputs import Inputs, check_inputs
from ..errors import UnknownNameError, UserError, UserTypeError
from ..fields import COUNT, POSITIVE, Bounds, check_fields, did_you_mean

__all__ = ["CLASSES", "COUNT", "POSITIVE", "Bounds", "ConfigBase", "ModelConfig", "check_choice", "check_head_split",
           "check_single_head", "deep_merge", "heads_of", "renamed_keys"]

#: A classifier's ``num_classes``: timm's 0 builds it without its last linear layer (``nn.Identity``), so
#: ``model(x)`` returns what that layer would read (``forward_head(f, pre_logits=True)``).
CLASSES = Bounds(lo=0, note="0: no classifier (timm's num_classes=0): the model returns its pre-logits features")

FIELD = "config field"   # how a model config's errors name a key: "config field 'kernel.tau': ..."


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """A UserError naming the field ``name``, the ``value`` given and the ``choices`` allowed, for
    the choices a class's ``choices`` table cannot state (a registry that grows at run time, a
    module's argument)."""
    if value not in choices:
        raise UserError(f"{FIELD} {name!r}: got {value!r}, expected one of {list(choices)}")


def check_single_head(heads: int, model_type: str) -> None:
    """A ValueError unless ``heads == 1``: for models with one read-out (NAC, Perceiver IO), given
    a task whose samples carry ``heads`` predictions, one per CLS token (NI §4.1-4.2)."""
    if heads != 1:
        raise UserError(
            f"the task gives heads={heads} predictions per sample (one per CLS token, NI §4.1-4.2), but a "
            f"{model_type!r} model has a single read-out (heads=1): use a model with one CLS token per head "
            f"(a ViT or Neural Interpreter), or the task's single-head form where it has one (fuzzy_boolean / "
            f"fuzzy_boolean_adapt: data.params.layout: pair, one item per (point, function))")


def heads_of(dim: str) -> Bounds:
    """An attention head count: ≥ 1 and divides ``dim`` (heads split the width)."""
    return Bounds(lo=1, divides=dim)


def check_head_split(config: Any, fields: tuple[str, ...]) -> None:
    """For a config with ``head_dim`` and ``d_model`` (NAC, Perceiver IO): with ``head_dim=None``
    the heads split ``d_model``, so each head count named in ``fields`` (dotted paths) must
    divide it; with a ``head_dim`` any count ≥ 1 holds (the attention is ``heads·head_dim`` wide)."""
    if config.head_dim is not None:
        return
    rule = heads_of("d_model")
    for path in fields:
        value = config
        for part in path.split("."):
            value = getattr(value, part)
        if not rule.holds(value, config):
            raise UserError(f"{FIELD} {path!r}: got {value!r}, expected {rule.describe(config, integer=True)} "
                            f"(head_dim=None: the heads split d_model)")


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


def _check_keys(cls: type, keys: dict[str, Any], path: str = "") -> None:
    unknown = sorted(set(keys) - set(cls.field_names()))
    if unknown:
        where = f" in {path!r}" if path else ""
        hint = did_you_mean(unknown, cls.field_names())
        raise UnknownNameError(f"unknown {cls.__name__} field(s) {unknown}{where}; valid fields: "
                               f"{cls.field_names()}{'.' + hint if hint else ''}")


def example_generator(device: Any, seed: int) -> Any:
    """A torch generator seeded with ``seed`` on ``device`` (None on ``meta``, where nothing is drawn)."""
    import torch

    return None if str(device) == "meta" else torch.Generator(device).manual_seed(seed)


def _is_config(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, ConfigBase)


@dataclass
class ConfigBase:
    """Typed, validated dataclass config. Fields that are themselves configs (sub-configs,
    e.g. ``kernel``) accept a dict, which is merged into the default sub-config; the whole
    tree is type-checked and validated from the root, so errors name the full path
    (``'kernel.tau'``). Fields declare what they accept in the ``choices`` and ``bounds`` tables
    (:mod:`modwire.fields`; a key may name a sub-config's field, ``"tokenizer.kind"``; NaN and
    inf refused everywhere); ``validate`` holds the checks a table cannot say."""

    _prefix: ClassVar[str] = ""   # the field path of a sub-config, set while it is checked
    bounds: ClassVar[dict[str, Bounds]] = {}
    choices: ClassVar[dict[str, tuple]] = {}
    # Former field names that still load (issue 37: one name per idea), former → current: a dict
    # with a former key (a committed YAML, a checkpoint's config.json, ``model.overrides``) loads as
    # the current one with a FutureWarning; both at once is a UserError (:func:`renamed_keys`).
    # docs/layout.md, "Renamed config fields", lists every entry.
    renamed: ClassVar[dict[str, str]] = {}

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
        """Types, then the ``choices`` / ``bounds`` tables (:func:`~modwire.fields.check_fields`),
        then the sub-configs this config uses, then :meth:`validate`; errors name ``prefix + key``."""
        object.__setattr__(self, "_prefix", prefix)
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            hint, value = hints[f.name], getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and hint is float:
                setattr(self, f.name, float(value))
            elif not _type_ok(value, hint):
                raise UserTypeError(f"{FIELD} {prefix + f.name!r}: got {value!r} ({type(value).__name__}), "
                                    f"expected {getattr(hint, '__name__', hint)}")
        unused = self.unused_fields()
        check_fields(self, prefix, label=FIELD, skip=unused)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ConfigBase) and f.name not in unused:
                value._check(f"{prefix}{f.name}.")
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
        overrides = renamed_keys(type(self), overrides, path)
        _check_keys(type(self), overrides, path)
        changes = {}
        for key, value in overrides.items():
            current = getattr(self, key)
            if isinstance(current, ConfigBase) and isinstance(value, dict):
                value = current.merged(value, path=f"{path}.{key}" if path else key)
            changes[key] = value
        return dataclasses.replace(self, **changes)


def renamed_keys(cls: type[ConfigBase], keys: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``keys`` with each former field name of ``cls`` (``cls.renamed``) replaced by the current one, with
    a FutureWarning naming both; a former and a current name of one field together is a UserError."""
    if not any(k in cls.renamed for k in keys):
        return keys
    where = f"{path}." if path else ""
    out = {}
    for key, value in keys.items():
        new = cls.renamed.get(key)
        if new is None:
            out[key] = value
            continue
        if new in keys:
            raise UserError(f"{FIELD} {where + key!r} is the former name of {where + new!r}: give one of them, "
                            f"not both (got {where + key}={value!r} and {where + new}={keys[new]!r})")
        warnings.warn(f"{FIELD} {where + key!r} is now called {where + new!r}; the former name still loads "
                      f"(docs/layout.md, 'Renamed config fields')", FutureWarning, stacklevel=4)
        out[new] = value
    return out


def deep_merge(base: dict, extra: dict) -> dict:
    """``base`` updated by ``extra``, nested dicts merged key by key (both left unchanged)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


@dataclass
class ModelConfig(ConfigBase):
    """Base of all model configs. Subclasses set ``model_type`` and implement ``validate``."""

    model_type: ClassVar[str] = ""

    @classmethod
    def normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` in the nested form: a string where a sub-config is expected sets its ``kind``
        or ``name`` (``{"tokenizer": "conv"}`` → ``{"tokenizer": {"kind": "conv"}}``), a sub-config
        object becomes its dict; the caller's dicts are never modified."""
        out: dict[str, Any] = {}
        hints = typing.get_type_hints(cls)
        for key, value in renamed_keys(cls, data).items():
            hint = hints.get(key)
            if isinstance(value, ConfigBase):
                value = dataclasses.asdict(value)
            elif _is_config(hint) and not isinstance(value, dict):   # its kind (or name)
                value = {"kind" if "kind" in hint.field_names() else "name": value}
            out[key] = copy.deepcopy(value)
        return out

    def input_overrides(self, inputs: Inputs, num_classes: int, heads: int = 1) -> dict[str, Any]:
        """The config fields (nested form) that fit this model to a task's ``inputs`` (an
        :class:`~modwire.models.inputs.InputSpec` or a mapping of named specs), class count (the
        width of one head) and ``heads`` (predictions per sample, one per CLS token:
        ``TaskInfo.heads``). Each model type implements it for its own input layer; an input or
        head count it cannot serve is a ValueError that says so."""
        raise UserError(f"model type {self.model_type!r} does not say how it reads a task's inputs "
                        f"(its config class implements no input_overrides)")

    def input_names(self) -> tuple[str, ...]:
        """The names of the inputs this configured model takes (``("x",)``: one input, ``model(x)``)."""
        return ("x",)

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        """A valid random input of ``batch`` samples for ``model(**inputs)``, keyed by
        :meth:`input_names` and drawn from ``seed`` (on the ``meta`` device nothing is drawn): what the
        contract and compile tests and the benchmarks feed each preset (timm's ``input_size``). Each
        model type declares its own."""
        raise UserError(f"model type {self.model_type!r} declares no example input (its config class "
                        f"implements no example_inputs)")

    def output_shape(self, inputs: dict[str, Any]) -> tuple[int, ...]:
        """The shape of ``model(**inputs)``: ``[B, num_classes]`` unless the model type says otherwise."""
        return (len(next(iter(inputs.values()))), self.num_classes)

    def for_inputs(self, inputs: Inputs, num_classes: int, heads: int = 1) -> "ModelConfig":
        """This config fitted to a task's inputs, class count and heads: ``replace(**input_overrides(...))``."""
        return self.replace(**self.input_overrides(check_inputs(inputs), num_classes, heads))

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A copy with some fields changed (validated); sub-configs take partial dicts."""
        return self.merged(self.normalize(overrides))

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):
            raise UserError(f"a model config must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        kind = data.pop("model_type", cls.model_type)
        if kind != cls.model_type:
            raise UserError(f"config is for model_type {kind!r}, not {cls.model_type!r}")
        return cls().replace(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))
