"""ListOps (Nangia & Bowman 2018, in the Long Range Arena version; implementation notes §5).

A sample is a nested prefix expression such as ``[MAX 2 9 [MIN 4 7 ] 0 ]`` over the
digits 0-9, and its label is the value of the expression (10 classes). Operators:

* ``MIN``, ``MAX``;
* ``MED``: the median, *truncated* to an integer as in the LRA generator
  (``int(np.median(args))``): with an even number of arguments it is the floor of the
  mean of the two middle values, e.g. ``MED 2 5`` = ``int(3.5)`` = 3;
* ``SM``: the sum modulo 10.

Tree sampling (LRA): a node at depth ``d`` (the root has depth 1) is a leaf (a uniform
digit) with probability 0.75, otherwise an operator node (uniform operator) with a
uniform number of 2-10 arguments, each a fresh node at depth ``d + 1``; nodes at depth
``max_depth`` are always leaves, so a tree has at most ``max_depth`` levels. A tree is
kept when its token length ``n`` satisfies ``min_len < n < max_len`` (strict, as in
LRA's ``500 < n < 2000``); otherwise a new tree is drawn from the *same* per-sample
generator (rejection sampling stays a pure function of ``(seed, split, index)``). Trees
that grow past ``max_len`` are abandoned early; this does not change the distribution
of the accepted trees.

Tokens (an operator node is ``OP arg ... ]``, the opening bracket is part of ``OP``;
there are no parentheses). Vocabulary ids, ``VOCAB_SIZE`` = 16:

====  =======================================
id    token
====  =======================================
0     ``<pad>`` (only added by :func:`collate`)
1-10  the digits 0-9 (id = digit + 1)
11    ``[MIN``
12    ``[MAX``
13    ``[MED``
14    ``[SM``
15    ``]``
====  =======================================

Items: ``(ids, label)``: ``ids`` a 1-d ``LongTensor`` of variable length (no padding),
``label`` a 0-d ``LongTensor`` in 0-9. :func:`collate` pads a batch with ``PAD``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, pad_collate, register_task
from ._common import GENERATOR_BOUNDS, GeneratedDataset, sample_rng, split_size
from ...errors import UserError
from ...fields import INT_COUNT, INT_NON_NEGATIVE

PAD = 0
DIGIT_OFFSET = 1  # id of digit v is v + 1
MIN, MAX, MED, SM = 11, 12, 13, 14
CLOSE = 15
VOCAB_SIZE = 16
OPERATORS = (MIN, MAX, MED, SM)
TOKEN_NAMES = ["<pad>", *map(str, range(10)), "[MIN", "[MAX", "[MED", "[SM", "]"]

LEAF_PROB = 0.75
MIN_ARGS, MAX_ARGS = 2, 10


def apply_operator(op: int, args: list[int]) -> int:
    """Value of operator id ``op`` on digit values ``args`` (see the module docstring for MED)."""
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:
        s = sorted(args)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    if op == SM:
        return sum(args) % 10
    raise UserError(f"not an operator id: {op}")


def evaluate(ids) -> int:
    """Value (0-9) of a token-id sequence (a list, array or tensor); pad ids are skipped.

    A stack machine over the prefix form: an operator opens a frame, a digit is appended
    to the innermost open frame, ``]`` closes it and appends its value to the parent.
    """
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    stack: list[tuple[int, list[int]]] = []
    result = None
    for t in ids:
        if t == PAD:
            continue
        if t in OPERATORS:
            stack.append((t, []))
            continue
        if DIGIT_OFFSET <= t < DIGIT_OFFSET + 10:
            value = t - DIGIT_OFFSET
        elif t == CLOSE:
            if not stack:
                raise UserError("unbalanced ']'")
            op, args = stack.pop()
            if not args:
                raise UserError("operator without arguments")
            value = apply_operator(op, args)
        else:
            raise UserError(f"unknown token id {t}")
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise UserError("more than one top-level expression")
    if stack or result is None:
        raise UserError("incomplete expression")
    return result


def to_string(ids) -> str:
    """Readable form of a token-id sequence, e.g. ``"[MAX 2 9 [MIN 4 7 ] 0 ]"``."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return " ".join(TOKEN_NAMES[t] for t in ids if t != PAD)


def nesting_depth(ids) -> int:
    """How deeply operators nest in a token-id sequence: 1 for ``[MAX 2 9 ]``, 2 for
    ``[MAX 2 [MIN 4 7 ] ]``. A tree of ``max_depth`` levels (leaves included) nests at most
    ``max_depth - 1`` operators. Used to build out-of-distribution splits of deeper expressions."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    depth = deepest = 0
    for t in ids:
        if t in OPERATORS:
            depth += 1
            deepest = max(deepest, depth)
        elif t == CLOSE:
            depth -= 1
    return deepest


class _TooLong(Exception):
    pass


def _grow(rng: np.random.Generator, depth: int, max_depth: int, out: list[int], limit: int) -> int:
    """Append one random subtree's ids to ``out`` and return its value; raise past ``limit`` ids."""
    if depth >= max_depth or rng.random() < LEAF_PROB:
        value = int(rng.integers(10))
        out.append(DIGIT_OFFSET + value)
        if len(out) >= limit:
            raise _TooLong
        return value
    op = OPERATORS[int(rng.integers(len(OPERATORS)))]
    n_args = int(rng.integers(MIN_ARGS, MAX_ARGS + 1))
    out.append(op)
    args = [_grow(rng, depth + 1, max_depth, out, limit) for _ in range(n_args)]
    out.append(CLOSE)
    if len(out) >= limit:
        raise _TooLong
    return apply_operator(op, args)


def sample_expression(rng: np.random.Generator, min_len: int = 500, max_len: int = 2000,
                      max_depth: int = 10, max_tries: int = 100_000) -> tuple[list[int], int]:
    """Token ids and value of a random tree with ``min_len < len < max_len`` (rejection sampling)."""
    for _ in range(max_tries):
        out: list[int] = []
        try:
            value = _grow(rng, 1, max_depth, out, max_len)
        except _TooLong:
            continue
        if len(out) > min_len:
            return out, value
    raise RuntimeError(f"no ListOps tree with {min_len} < length < {max_len} in {max_tries} tries "
                       f"(max_depth={max_depth}); widen the length range")


class GeneratedListOps(GeneratedDataset):
    def __init__(self, split: str, seed: int, size, min_len: int, max_len: int, max_depth: int) -> None:
        super().__init__(split, seed, split_size(size, split))
        if not min_len + 1 < max_len:        # min_len >= 0 and max_depth >= 1: INFO.param_bounds
            raise UserError(f"need 0 <= min_len < max_len - 1, got min_len={min_len}, max_len={max_len}")
        self.min_len, self.max_len, self.max_depth = int(min_len), int(max_len), int(max_depth)

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        rng = sample_rng(self.seed, self.split, index)
        ids, value = sample_expression(rng, self.min_len, self.max_len, self.max_depth)
        return torch.tensor(ids, dtype=torch.long), torch.tensor(value, dtype=torch.long)


collate = pad_collate  # (ids [B, L] padded with PAD = 0, labels [B]); the model sees the pads


DEFAULT_SIZE = {"train": 96_000, "val": 2_000, "test": 2_000}  # LRA ListOps split sizes


def build(split: str, seed: int = 0, size=None, min_len: int = 500, max_len: int = 2000,
          max_depth: int = 10) -> GeneratedListOps:
    """ListOps split. ``size``: items per split (an int, or ``{split: n}``; default 96k/2k/2k as
    LRA). Lengths satisfy ``min_len < len < max_len``; ``max_depth`` bounds the tree depth."""
    return GeneratedListOps(split, seed, DEFAULT_SIZE if size is None else size,
                          min_len, max_len, max_depth)


def describe(params: dict) -> tuple[InputSpec, int]:
    """Ids ``[L]``, ``L < max_len``, right-padded with ``PAD`` per batch; 10 answers."""
    return InputSpec.tokens(params["max_len"], VOCAB_SIZE, pad_id=PAD, padded=True), 10


INFO = TaskInfo(
    name="listops",
    kind="generator",
    description=("ListOps (LRA): value (0-9) of a nested MIN/MAX/MED/SM expression given as token ids "
                 "(pad 0, digits 1-10, [MIN 11, [MAX 12, [MED 13, [SM 14, ] 15); 500 < length < 2000. "
                 "Variable-length items; batch with info.collate (pads with id 0)."),
    loss="cross_entropy",
    metrics=("top1",),
    splits=("train", "val", "test"),
    params={"seed": 0, "size": dict(DEFAULT_SIZE), "min_len": 500, "max_len": 2000, "max_depth": 10},
    param_bounds={**GENERATOR_BOUNDS, "min_len": INT_NON_NEGATIVE, "max_depth": INT_COUNT},
    collate=collate,
    describe=describe,
    class_names=DIGIT_CLASSES,
)

register_task(INFO, build)
