"""What a task's inputs are, independent of any model: :class:`InputSpec`.

A task describes its data (``modwire.tasks``); each model maps that description onto
its own input layer (``ModelConfig.input_overrides`` / ``for_inputs``): NAC and
Perceiver IO through a conv / linear / embedding tokenizer, a ViT through a patch embedding
(both described by the one input-layer config, :meth:`TokenizerConfig.for_input`), and so
on. Nothing here knows about a model.

Four kinds, each a per-sample tensor (a batch adds a leading ``B`` axis):

* ``image``: float ``[channels, height, width]`` (values in [0, 1] unless a task says otherwise).
* ``tokens``: integer ids ``[L]`` with ``L ≤ length`` and ids ``< vocab_size``;
  ``pad_id`` is the id that right-pads a batch of variable-length sequences (``padded``).
* ``vectors``: float ``[N, dim]``, a set (``ordered=False``: the order carries no meaning,
  e.g. a point cloud) or a sequence (``ordered=True``: position ``i`` means something, e.g.
  Fuzzy Boolean's 5 scalar inputs); ``length`` bounds ``N`` (None: only known from the files);
  ``padded``: variable-length sets right-padded per batch with zero rows.
* ``index``: one integer in ``[0, vocab_size)`` per sample, shape ``()`` (a batch is
  ``LongTensor [B]``): a categorical side input that selects something, e.g. which dataset
  an image of NI's digits multi-task comes from, hence which CLS token's head scores it
  (NI §4.2, App. C.1). It is not a sequence: tokenizer-based models refuse it.

A multimodal input is a mapping of named specs, e.g. ``{"x": image tokens, "condition":
question ids}`` for a conditional NAC (NAC §2.2, App. G), whose items are dicts of
tensors with the same keys and which a model takes as ``model(**inputs)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

import torch
from torch import Tensor

from ..errors import UserError, UserTypeError

INPUT_KINDS = ("image", "tokens", "vectors", "index")
_FIELDS = {"image": ("channels", "height", "width"), "tokens": ("length", "vocab_size", "pad_id", "padded"),
           "vectors": ("length", "dim", "padded", "ordered"), "index": ("vocab_size",)}


@dataclass(frozen=True)
class InputSpec:
    """One input of a task. Build with :meth:`image`, :meth:`tokens`, :meth:`vectors` or :meth:`index`;
    fields that do not belong to ``kind`` stay None (checked)."""

    kind: str
    channels: int | None = None     # image
    height: int | None = None       # image
    width: int | None = None        # image
    length: int | None = None       # tokens: max length; vectors: max set size / sequence length
    vocab_size: int | None = None   # tokens; index: the number of values
    pad_id: int | None = None       # tokens: the padding id (None: no padding id)
    dim: int | None = None          # vectors: feature width
    padded: bool = False            # variable length, right-padded per batch (tokens: with pad_id)
    ordered: bool = False           # vectors: the position of a vector carries meaning

    @classmethod
    def image(cls, channels: int, height: int, width: int) -> "InputSpec":
        return cls("image", channels=channels, height=height, width=width)

    @classmethod
    def tokens(cls, length: int, vocab_size: int, *, pad_id: int | None = None, padded: bool = False) -> "InputSpec":
        return cls("tokens", length=length, vocab_size=vocab_size, pad_id=pad_id, padded=padded)

    @classmethod
    def vectors(cls, length: int | None, dim: int, *, padded: bool = False, ordered: bool = False) -> "InputSpec":
        return cls("vectors", length=length, dim=dim, padded=padded, ordered=ordered)

    @classmethod
    def index(cls, n: int) -> "InputSpec":
        """One integer in ``[0, n)`` per sample (per-sample shape ``()``)."""
        return cls("index", vocab_size=n)

    def __post_init__(self) -> None:
        if self.kind not in INPUT_KINDS:
            raise UserError(f"InputSpec.kind: got {self.kind!r}, expected one of {list(INPUT_KINDS)}")
        own = _FIELDS[self.kind]
        stray = [n for n in ("channels", "height", "width", "length", "vocab_size", "pad_id", "dim")
                 if n not in own and getattr(self, n) is not None]
        stray += [n for n in ("padded", "ordered") if n not in own and getattr(self, n)]
        if stray:
            raise UserError(f"InputSpec of kind {self.kind!r}: fields {stray} do not apply (its fields: {list(own)})")
        for name in ("channels", "height", "width", "vocab_size", "dim", "length"):
            if name in own:
                _check_size(self, name, optional=name == "length" and self.kind == "vectors")
        for name in ("padded", "ordered"):
            if not isinstance(getattr(self, name), bool):
                raise UserTypeError(f"InputSpec.{name}: got {getattr(self, name)!r}, expected True or False")
        if self.kind == "tokens":
            self._check_pad()

    def _check_pad(self) -> None:
        if self.pad_id is not None and (not _is_int(self.pad_id) or not 0 <= self.pad_id < self.vocab_size):
            raise UserError(f"InputSpec.pad_id: got {self.pad_id!r}, expected None or an id in "
                            f"[0, vocab_size={self.vocab_size})")
        if self.padded and self.pad_id is None:
            raise UserError("InputSpec: padded tokens need a pad_id (the id that fills the padding)")

    def __repr__(self) -> str:
        own = ", ".join(f"{n}={getattr(self, n)!r}" for n in _FIELDS[self.kind])
        return f"InputSpec.{self.kind}({own})"

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The per-sample tensor shape; None where it varies (a sequence's or set's length)."""
        if self.kind == "image":
            return (self.channels, self.height, self.width)
        if self.kind == "tokens":
            return (self.length,)
        if self.kind == "index":
            return ()
        return (self.length, self.dim)

    def example(self, batch: int = 2, *, length: int | None = None, seed: int = 0) -> Tensor:
        """A random batch of this input (for smoke tests of a model built for a task):
        images ``[B, C, H, W]`` in [0, 1], ids ``[B, L]`` (no padding ids), vectors ``[B, N, dim]``,
        an index ``LongTensor [B]`` in ``[0, vocab_size)``; ``length`` sets ``L`` / ``N`` (default:
        the spec's length, or 4 when unknown)."""
        g = torch.Generator().manual_seed(seed)
        if self.kind == "index":
            return torch.randint(0, self.vocab_size, (batch,), generator=g)
        n = length or self.length or 4
        if self.kind == "image":
            return torch.rand(batch, self.channels, self.height, self.width, generator=g)
        if self.kind == "vectors":
            return torch.randn(batch, n, self.dim, generator=g)
        ids = torch.randint(0, self.vocab_size - (self.pad_id is not None), (batch, n), generator=g)
        return ids + (ids >= self.pad_id).long() if self.pad_id is not None else ids


Inputs = Union[InputSpec, Mapping[str, InputSpec]]


def check_inputs(inputs: Any, where: str = "inputs") -> Inputs:
    """``inputs`` if it is an :class:`InputSpec` or a non-empty mapping of names to specs, else
    a TypeError naming ``where`` and what it got."""
    if isinstance(inputs, InputSpec):
        return inputs
    if isinstance(inputs, Mapping) and inputs and all(
            isinstance(k, str) and isinstance(v, InputSpec) for k, v in inputs.items()):
        return dict(inputs)
    raise UserTypeError(f"{where}: expected an InputSpec or a mapping of input names to InputSpecs "
                        f"(e.g. {{'x': ..., 'condition': ...}}), got {inputs!r}")


def named_inputs(inputs: Inputs) -> dict[str, InputSpec]:
    """A single input as ``{"x": spec}``; a mapping as a dict."""
    return {"x": inputs} if isinstance(inputs, InputSpec) else dict(inputs)


def example_inputs(inputs: Inputs, batch: int = 2, **kw: Any) -> Tensor | dict[str, Tensor]:
    """:meth:`InputSpec.example` of every input: a tensor, or a dict for a multimodal input."""
    if isinstance(inputs, InputSpec):
        return inputs.example(batch, **kw)
    return {name: spec.example(batch, **kw) for name, spec in inputs.items()}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_size(spec: InputSpec, name: str, *, optional: bool) -> None:
    value = getattr(spec, name)
    if value is None and optional:
        return
    if not _is_int(value) or value < 1:
        raise UserError(f"InputSpec.{name} ({spec.kind}): got {value!r}, expected a positive int"
                        + (" or None (unknown)" if optional else ""))
