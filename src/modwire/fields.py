"""Declarative config fields: the one way a modwire config says what its fields accept.

Every config dataclass (a model config, ``modwire.models.config.ConfigBase``, or a section of
the training config, ``modwire.training.config``) declares two class-level tables:

* ``bounds: ClassVar[dict[str, Bounds]]``: the numeric range of a field (:class:`Bounds`: an
  interval, open or closed, whose ends may name a sibling field; a multiple; a divisor of a
  sibling). NaN and inf are refused everywhere.
* ``choices: ClassVar[dict[str, tuple]]``: the values a field may take.

A key names a field of the dataclass, or a field of one of its sub-configs (``"tokenizer.kind"``:
a model restricting the input layers it can read). On a list or dict field the rule applies to
each element, and an error names it: ``optim.betas[1]``, ``aux_loss_weights.graph``.
:func:`check_fields` checks one dataclass's tables, :func:`check_tree` a dataclass and every
dataclass below it; both raise :class:`~modwire.errors.UserError` as ``config key 'optim.lr':
got -1, expected a finite number > 0`` (model configs say ``config field``). :func:`did_you_mean`
is the close-match hint of every unknown-name error.

Task parameters (``data.params``) use the same rules: a task's registration declares
``param_bounds`` / ``param_choices`` tables (:class:`modwire.tasks.base.TaskInfo`), which
:func:`check_mapping` checks on the parameters as ``task 'digits': parameter 'size': got 12,
expected an integer >= 8 and a multiple of 8 (the images are 8x8)``.

This module is a floor of its own: it imports only the standard library and
:mod:`modwire.errors`, so ``modwire.nn``, ``modwire.models`` and ``modwire.training`` may all use it.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
import math
import numbers
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from .errors import UserError, UserTypeError

__all__ = ["Bounds", "Choices", "ChoicesOrImport", "import_object", "is_import_path", "POSITIVE", "NON_NEGATIVE", "COUNT", "UNIT", "INT_COUNT", "INT_NON_NEGATIVE",
           "check_argument", "check_keywords", "check_value", "check_table", "check_mapping", "check_fields", "check_tree",
           "declared_rules", "did_you_mean"]


@dataclass(frozen=True)
class Bounds:
    """The values a numeric config field accepts. ``lo`` / ``hi``: a number or the name of a
    sibling field (``pad_id < vocab_size``), each closed unless ``lo_open`` / ``hi_open``;
    ``multiple_of``: the value is a multiple of it (an image size vs. a tokenizer's total
    stride); ``divides``: the value divides that sibling field (attention heads split
    ``d_model``); ``note``: what a special value means, shown in the error; ``integer``: only
    an int holds (not a bool, not a float such as ``8.0``: a field whose type the dataclass does
    not fix, e.g. a task parameter whose default is None). NaN and inf (and anything that is
    not a number) never hold."""

    lo: float | str | None = None
    hi: float | str | None = None
    lo_open: bool = False
    hi_open: bool = False
    multiple_of: int | None = None
    divides: str | None = None
    note: str = ""
    integer: bool = False                # last: the fields before it keep their positions

    def holds(self, value: Any, owner: Any = None) -> bool:
        """Whether ``value`` lies within these bounds; sibling names are read from ``owner``."""
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                return False
            value = int(value)          # a numpy integer too
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        lo, hi = _sibling(owner, self.lo), _sibling(owner, self.hi)
        return ((lo is None or (value > lo if self.lo_open else value >= lo))
                and (hi is None or (value < hi if self.hi_open else value <= hi))
                and (self.multiple_of is None or value % self.multiple_of == 0)
                and (self.divides is None or (value > 0 and getattr(owner, self.divides) % value == 0)))

    def describe(self, owner: Any = None, integer: bool = False) -> str:
        """What the field accepts, in words: ``'an integer >= 1 that divides d_model=96'``."""
        def show(bound: float | str) -> str:
            return f"{bound}={getattr(owner, bound)}" if isinstance(bound, str) else f"{bound:g}"

        parts = ["an integer" if integer or self.integer else "a finite number"]
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


class Choices(tuple):
    """An entry of a ``choices`` table that explains its values in the error:
    ``Choices((1, 3), note="1: grayscale, 3: RGB")`` (a plain tuple explains nothing)."""

    note: str

    def __new__(cls, values: Iterable[Any], note: str = "") -> "Choices":
        out = super().__new__(cls, values)
        out.note = note
        return out

    def __reduce__(self):               # copy / pickle keep the note
        return (type(self), (tuple(self), self.note))


class ChoicesOrImport(Choices):
    """A ``choices`` entry whose field also takes an import path ``"package.module:attribute"``
    naming a callable of the user's (``data.augment``, ``loggers``). :func:`check_table` imports it
    (nothing is called) and refuses, naming the key, a path that does not import or names something
    that is not callable."""

    def __contains__(self, value: Any) -> bool:
        return super().__contains__(value) or is_import_path(value)


_IDENTIFIERS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_import_path(value: Any) -> bool:
    """Whether ``value`` reads as ``"package.module:attribute"`` (dotted names each side of one colon)."""
    if not isinstance(value, str) or value.count(":") != 1:
        return False
    module, attr = value.split(":")
    return bool(_IDENTIFIERS.fullmatch(module) and _IDENTIFIERS.fullmatch(attr))


def import_object(value: str, where: str = "import path") -> Any:
    """The callable that ``"package.module:attribute"`` names (the attribute may be dotted:
    ``"pkg.mod:Class.make"``): the module is imported, nothing is called. A :class:`UserError`
    starting with ``where`` says why not: a malformed path, a module that does not import (with the
    import's own error), a missing attribute, or one that is not callable."""
    import importlib

    form = "an import path 'package.module:attribute' naming a callable"
    if not is_import_path(value):
        raise UserError(f"{where}: got {value!r}, expected {form}")
    module_name, attr = value.split(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:             # the user's module: any error of its import is theirs
        raise UserError(f"{where}: got {value!r}, but module {module_name!r} does not import "
                        f"({type(exc).__name__}: {exc}); it must be importable by this Python (installed, "
                        f"or its folder on PYTHONPATH)") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{where}: got {value!r}, but {type(obj).__name__} {getattr(obj, '__name__', obj)!r} "
                            f"has no attribute {part!r}.{did_you_mean(part, [n for n in dir(obj) if not n.startswith('_')])}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{where}: got {value!r}, which names a {type(obj).__name__}, expected {form}")
    return obj


def _sibling(owner: Any, bound: float | str | None) -> float | None:
    return getattr(owner, bound) if isinstance(bound, str) else bound


POSITIVE = Bounds(lo=0, lo_open=True)                # learning rates, temperatures, bandwidths
NON_NEGATIVE = Bounds(lo=0)                          # step counts where 0 means "off", weights
COUNT = Bounds(lo=1)                                 # sizes, dims, heads, layers, batch sizes
UNIT = Bounds(lo=0, hi=1, hi_open=True)              # [0, 1): decays, betas, label smoothing
INT_COUNT = Bounds(lo=1, integer=True)               # COUNT where the type is not fixed (task parameters)
INT_NON_NEGATIVE = Bounds(lo=0, integer=True)        # seeds, split sizes


def did_you_mean(names: str | Iterable[str], valid: Iterable[str]) -> str:
    """The close-match hint of an unknown-name error, with a leading space (`` Did you mean
    ['lr']?``), or ``""`` when nothing in ``valid`` is close to ``names`` (one name or several)."""
    valid = [str(v) for v in valid]
    close: list[str] = []
    for name in [names] if isinstance(names, str) else names:
        close += [m for m in difflib.get_close_matches(str(name), valid, n=3) if m not in close]
    return f" Did you mean {close}?" if close else ""


def check_argument(name: str, value: Any, choices: Iterable[Any], where: str = "") -> Any:
    """``value`` if it is one of ``choices``, else a :class:`UserError` ``"<where>: <name> must be one
    of [...], got <value>"``: the choice check of a function's or module's argument (a config field's
    is its class's ``choices`` table)."""
    choices = list(choices)
    if value not in choices:
        raise UserError(f"{where + ': ' if where else ''}{name} must be one of {choices}, got {value!r}")
    return value


def check_keywords(where: str, given: Iterable[str], accepted: Iterable[str], note: str = "") -> None:
    """A :class:`~modwire.errors.UserTypeError` (also a ``TypeError``, as Python's own for an unexpected
    keyword) when ``given`` holds a keyword not in ``accepted``: ``"<where>: unknown keyword argument(s)
    [...]; it takes [...]"``, with the close-match hint and ``note`` (e.g. why a peer's keyword is not taken)."""
    accepted = list(accepted)
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise UserTypeError(f"{where}: unknown keyword argument(s) {unknown}; it takes {accepted}"
                            f"{' ' + note if note else ''}.{did_you_mean(unknown, accepted)}")


def _values(obj: Any, key: str, prefix: str) -> Iterator[tuple[str, Any, Any]]:
    """``(key path, value, owner)`` of the field ``key`` (dotted: a sub-config's field) of
    ``obj``: the value itself, or each element of a list / dict field."""
    *parents, last = key.split(".")
    owner = obj
    for part in parents:
        owner = getattr(owner, part)
    value, path = getattr(owner, last), prefix + key
    if isinstance(value, Mapping):
        yield from ((f"{path}.{k}", v, owner) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        yield from ((f"{path}[{i}]", v, owner) for i, v in enumerate(value))
    else:
        yield path, value, owner


def check_value(value: Any, bounds: Bounds, path: str, owner: Any = None, label: str = "config key") -> None:
    """A :class:`UserError` naming ``path``, ``value`` and what ``bounds`` accept, unless ``value``
    is within them (None, an Optional field left unset, always is)."""
    if value is not None and not bounds.holds(value, owner):
        integer = isinstance(value, int) and not isinstance(value, bool)
        raise UserError(f"{label} {path!r}: got {value!r}, expected {bounds.describe(owner, integer)}")


def check_table(obj: Any, *, choices: Mapping[str, tuple] | None = None, bounds: Mapping[str, Bounds] | None = None,
                prefix: str = "", label: str = "config key", skip: Iterable[str] = ()) -> None:
    """Check the fields of ``obj`` that ``choices`` (key → allowed values) and ``bounds`` (key →
    :class:`Bounds`) name, choices first; keys whose first part is in ``skip`` (fields the
    current settings do not use) are left alone. Errors name ``prefix + key``."""
    skip = set(skip)
    for key, allowed in (choices or {}).items():
        if key.split(".")[0] not in skip:
            for path, value, _ in _values(obj, key, prefix):
                if value not in allowed:
                    note = getattr(allowed, "note", "")
                    also = " or an import path 'package.module:attribute'" if isinstance(allowed, ChoicesOrImport) \
                        else ""
                    raise UserError(f"{label} {path!r}: got {value!r}, expected one of {list(allowed)}{also}"
                                    + (f" ({note})" if note else ""))
                if isinstance(allowed, ChoicesOrImport) and not tuple.__contains__(allowed, value):
                    import_object(value, f"{label} {path!r}")
    for key, rule in (bounds or {}).items():
        if key.split(".")[0] not in skip:
            for path, value, owner in _values(obj, key, prefix):
                check_value(value, rule, path, owner, label)


def check_mapping(values: Mapping[str, Any], *, choices: Mapping[str, tuple] | None = None,
                  bounds: Mapping[str, Bounds] | None = None, label: str = "key") -> None:
    """:func:`check_table` on a mapping of names to values (a task's parameters, ``label``
    ``"task 'digits': param"``) instead of a dataclass: a sibling name in a :class:`Bounds` is
    another key, a rule on a list or dict value applies to each element, and None passes a
    :class:`Bounds` (a choice table lists None where it is allowed)."""
    check_table(types.SimpleNamespace(**values), choices=choices, bounds=bounds, label=label)


def check_fields(obj: Any, prefix: str = "", *, label: str = "config key", skip: Iterable[str] = ()) -> None:
    """Check one dataclass instance against its class's ``choices`` and ``bounds`` tables
    (:func:`check_table`), then refuse NaN and inf in every float field, used or not (the
    elements of a list or dict field only where a rule names it: a free-form mapping such as a
    model's overrides is its reader's to check). Sub-configs are not entered: :func:`check_tree`."""
    cls = type(obj)
    check_table(obj, choices=getattr(cls, "choices", None), bounds=getattr(cls, "bounds", None),
                prefix=prefix, label=label, skip=skip)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{label} {prefix + f.name!r}: got {value!r}, expected a finite number")


def check_tree(obj: Any, prefix: str = "", *, label: str = "config key") -> None:
    """:func:`check_fields` on ``obj`` and on every dataclass instance below it, depth first;
    errors name the full key path (``'data.few_shot.ways'``)."""
    check_fields(obj, prefix, label=label)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_tree(value, f"{prefix}{f.name}.", label=label)


def declared_rules(cls: type, table: str = "bounds", prefix: str = "") -> dict[str, Any]:
    """Every rule of ``table`` (``"bounds"`` or ``"choices"``) that the dataclass ``cls`` and the
    dataclasses of its fields declare, by full key; a rule on a list or dict field, which
    applies to each element, ends in ``.*`` (``{"optim.lr": POSITIVE, "optim.betas.*": UNIT, ...}``)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, rule in getattr(cls, table, {}).items():
        origin = typing.get_origin(hints.get(key))
        out[prefix + key + (".*" if origin in (list, dict, tuple) else "")] = rule
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.update(declared_rules(hint, table, f"{prefix}{f.name}."))
    return out


def flatten(node: Any, convert: Callable[[Any], Any] = lambda n: n) -> dict[str, Any]:
    """``{"optim.lr": 3e-4, "model.overrides.tokenizer.max_len": 64, ...}``: every leaf of a config by its
    dotted key (dataclasses and mappings are walked, lists are leaves, as lists); ``convert`` is applied to
    each node first (e.g. an OmegaConf container to plain data)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        node = convert(node)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            node = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = list(node) if isinstance(node, (list, tuple)) else node

    walk("", node)
    return out
