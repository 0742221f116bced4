"""Fuzzy Boolean regression (Neural Interpreters Sec. 4.1 and App. B; implementation notes §2).

Product fuzzy logic (NI Eq. 16-18): ``and(a, b) = a·b``, ``not(a) = 1 - a``,
``or(a, b) = 1 - (1 - a)(1 - b)``. A function of ``N = 5`` variables is sampled as in
App. B.1: its truth table gets one Bernoulli(0.5) bit per corner of ``{0, 1}^5``; the
function is the table's canonical sum-of-products (disjunctive normal form, as NI Eq. 19)
read with those primitives:

    term_m(x) = Π_k (x_k if bit k of m is 1 else 1 - x_k)      (Eq. 16-17, one minterm)
    f(x)      = 1 - Π_{m : table[m] = 1} (1 - term_m(x))       (Eq. 18, or over the terms)

where corner ``b ∈ {0, 1}^5`` has index ``m = Σ_k b_k 2^k`` (``x_0`` is the least
significant bit). An empty table gives ``f ≡ 0``. On the corners ``f`` equals the table
and on ``[0, 1]^5`` it stays in ``[0, 1]``.

A family of ``NUM_FUNCTIONS`` = 30 functions: function ``u`` has the truth table drawn
from ``SeedSequence([function_seed, FAMILY_TAG, u])`` (independent of the data ``seed`` and
of the split, so every split and both tasks see the same functions). Functions 0-19 are
for pre-training (task ``fuzzy_boolean``), 20-29 for adaptation (``fuzzy_boolean_adapt``).
Points: ``x ~ U[0, 1]^5``; per function 163840 points, 80% train (131072) and 20% val
(32768), the NI protocol.

Items (one (point, function) pair each): a task with functions ``F = function_ids`` and
``size`` points per split has ``size · |F|`` items; item ``i`` is function
``F[i % |F|]`` at point ``p = i // |F|``, and point ``p`` is drawn from
``SeedSequence([seed, split_id, p])``, so within a split all functions are evaluated at
the same points (as NI, where one sample is ``x`` with the targets of all 20 functions).

* input: float32 ``[6, 1 + 30]``: rows 0-4 are the scalar tokens ``[x_k, 0, …, 0]``; row 5
  is the function's CLS token ``[0, onehot_30(u)]``. Through the ``linear`` tokenizer the
  CLS row becomes a learned embedding per function (a weight column), and ``max_len`` = 6
  adds learned positional embeddings (NI: "learnable positional embeddings" on the 5
  scalars). The one-hot spans the whole family, so pre-training and adaptation share one
  tokenizer shape: adapting with "CLS tokens only" means training columns 21-30 of the
  tokenizer weight, which pre-training never touches (their inputs are always 0).
* target: float32 ``[1]``, ``f_u(x)``. A shared regression head reads the CLS token's
  output (loss ``mse``, metric ``r2``).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import GeneratedDataset, check_seed, sample_rng, split_size

NUM_VARS = 5
NUM_CORNERS = 2 ** NUM_VARS
NUM_FUNCTIONS = 30
PRETRAIN_IDS = tuple(range(20))
ADAPT_IDS = tuple(range(20, 30))
FAMILY_TAG = 0xF022B001  # separates the function stream from (seed, split, index) streams
INPUT_DIM = 1 + NUM_FUNCTIONS
NUM_TOKENS = NUM_VARS + 1
POINTS_PER_FUNCTION = 163_840
DEFAULT_SIZE = {"train": POINTS_PER_FUNCTION * 4 // 5, "val": POINTS_PER_FUNCTION // 5}  # 131072 / 32768

# _BITS[m, k] = bit k of corner index m
_BITS = ((np.arange(NUM_CORNERS)[:, None] >> np.arange(NUM_VARS)[None]) & 1).astype(bool)


@lru_cache(maxsize=None)
def _table(function_id: int, function_seed: int) -> tuple[bool, ...]:
    rng = np.random.default_rng(np.random.SeedSequence([function_seed, FAMILY_TAG, function_id]))
    return tuple(bool(b) for b in rng.random(NUM_CORNERS) < 0.5)


def truth_table(function_id: int, function_seed: int = 0) -> np.ndarray:
    """The Bernoulli(0.5) truth table ``[32]`` (bool) of function ``function_id``; entry ``m`` is
    the value at the corner with ``x_k = bit k of m``."""
    if not 0 <= int(function_id) < NUM_FUNCTIONS:
        raise ValueError(f"function_id must be in [0, {NUM_FUNCTIONS}), got {function_id}")
    return np.array(_table(int(function_id), check_seed(function_seed)))


def evaluate(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Product-logic sum-of-products of ``table [32]`` at points ``x [..., 5]`` (NI Eq. 16-19)."""
    x = np.asarray(x, dtype=np.float64)
    lit = np.where(_BITS, x[..., None, :], 1 - x[..., None, :])  # [..., 32, 5]
    terms = lit.prod(-1)[..., np.asarray(table, dtype=bool)]      # the minterms of the table
    return 1 - (1 - terms).prod(-1)


def encode(x: np.ndarray, function_id: int) -> np.ndarray:
    """The ``[6, 31]`` input of point ``x [5]`` and function ``function_id`` (see module docstring)."""
    out = np.zeros((NUM_TOKENS, INPUT_DIM), dtype=np.float32)
    out[:NUM_VARS, 0] = x
    out[NUM_VARS, 1 + function_id] = 1
    return out


def function_id_of(inputs: Tensor) -> Tensor:
    """Function id(s) of an input ``[6, 31]`` or a batch ``[B, 6, 31]`` (for per-function R²)."""
    return inputs[..., NUM_VARS, 1:].argmax(-1)


class FuzzyBooleanDataset(GeneratedDataset):
    def __init__(self, split: str, seed: int, size, function_ids: Sequence[int], function_seed: int) -> None:
        ids = tuple(int(u) for u in function_ids)
        if not ids or len(set(ids)) != len(ids) or not all(0 <= u < NUM_FUNCTIONS for u in ids):
            raise ValueError(f"function_ids must be distinct ids in [0, {NUM_FUNCTIONS}), got {function_ids!r}")
        self.num_points = split_size(size, split)
        super().__init__(split, seed, self.num_points * len(ids))
        self.function_ids, self.function_seed = ids, check_seed(function_seed)
        self.tables = {u: truth_table(u, self.function_seed) for u in ids}

    def point(self, p: int) -> np.ndarray:
        return sample_rng(self.seed, self.split, p).random(NUM_VARS)

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        u = self.function_ids[index % len(self.function_ids)]
        x = self.point(index // len(self.function_ids))
        y = evaluate(x, self.tables[u])
        return torch.from_numpy(encode(x, u)), torch.tensor([y], dtype=torch.float32)


def _builder(default_ids: tuple[int, ...]):
    def build(split: str, seed: int = 0, size=None, function_ids: Sequence[int] = default_ids,
              function_seed: int = 0) -> FuzzyBooleanDataset:
        """Fuzzy Boolean split. ``size``: points per function (int or ``{split: n}``; default
        131072 train / 32768 val); ``function_ids``: which of the 30 functions; ``function_seed``
        draws the family of truth tables, ``seed`` the points."""
        return FuzzyBooleanDataset(split, check_seed(seed), DEFAULT_SIZE if size is None else size,
                                   function_ids, function_seed)
    return build


def _info(name: str, ids: tuple[int, ...], what: str) -> TaskInfo:
    return TaskInfo(
        name=name,
        kind="generator",
        description=(f"Fuzzy Boolean regression (NI Sec. 4.1, App. B), {what}: f_u(x) for x ~ U[0,1]^5 and "
                     f"functions u = {ids[0]}-{ids[-1]} of a family of 30 product-logic sum-of-products "
                     f"functions. Input [6, 31]: 5 scalar tokens [x_k, 0..] + a CLS token [0, onehot30(u)]; "
                     f"target [1]. size counts points per function."),
        num_classes=1,
        inputs=InputSpec.vectors(NUM_TOKENS, INPUT_DIM, ordered=True),  # token k is variable k; the last is CLS
        loss="mse",
        metrics=("r2",),
        splits=("train", "val"),
        params={"seed": 0, "size": dict(DEFAULT_SIZE), "function_ids": ids, "function_seed": 0},
    )


register_task(_info("fuzzy_boolean", PRETRAIN_IDS, "pre-training functions"), _builder(PRETRAIN_IDS))
register_task(_info("fuzzy_boolean_adapt", ADAPT_IDS, "adaptation functions"), _builder(ADAPT_IDS))
