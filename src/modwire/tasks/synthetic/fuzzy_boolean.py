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
(32768), the NI protocol. Point ``p`` of a split is drawn from ``SeedSequence([seed,
split_id, p])``; every function is evaluated at the same points.

Two layouts of the items (parameter ``layout``), with the same points and targets:

* ``"sample"`` (default; NI §4.1): item ``p`` is point ``p`` with the targets of all
  functions ``F = function_ids``, as NI's "a sample comprises x and f_1(x), ..., f_20(x)".

  - input: float32 ``[5, 1]``, the 5 scalars ``x_k`` as a sequence of 5 one-feature vectors
    (``InputSpec.vectors(5, 1, ordered=True)``: the model embeds each and adds a learned
    positional embedding, NI: "with learnable positional embeddings added in");
  - target: float32 ``[F]``, ``f_u(x)`` for ``u`` in ``function_ids`` in that order;
  - ``TaskInfo.heads = F`` (20 for ``fuzzy_boolean``, 10 for ``fuzzy_boolean_adapt``),
    ``num_classes = 1``: the model appends one learned CLS token per function to the 5
    elements (a set of 25 for pre-training) and reads each through a shared regression
    head, returning ``[B, F]``; loss ``mse`` over all ``B·F`` values; metrics ``r2`` (mean over
    functions of each function's R²) and ``r2_std`` (its std over functions, NI Table 1).
    Adapting to the 10 new functions = a model with 10 new CLS tokens (``new_task``).

* ``"pair"``: one item per (point, function), for models with a single read-out (NAC,
  Perceiver IO) that cannot hold a CLS token per function. A split of ``size`` points has
  ``size · F`` items; item ``i`` is function ``F[i % F]`` at point ``i // F``.

  - input: float32 ``[6, 1 + 30]``: rows 0-4 are the scalar tokens ``[x_k, 0, …, 0]``; row 5
    is the function's token ``[0, onehot_30(u)]``, which a ``linear`` tokenizer turns into a
    learned embedding per function (a weight column); ``max_len`` = 6 adds learned positions.
    The one-hot spans the whole family, so pre-training and adaptation share one tokenizer
    shape. The function tokens of one point never meet (one per item): not NI's set-up.
  - target: float32 ``[1]``, ``f_u(x)``; ``heads = 1``; ``r2`` pools the functions.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import GENERATOR_BOUNDS, GeneratedDataset, sample_rng, split_size
from ...errors import UserError
from ...fields import INT_NON_NEGATIVE, Bounds, Choices

NUM_VARS = 5
NUM_CORNERS = 2 ** NUM_VARS
NUM_FUNCTIONS = 30
PRETRAIN_IDS = tuple(range(20))
ADAPT_IDS = tuple(range(20, 30))
FAMILY_TAG = 0xF022B001  # separates the function stream from (seed, split, index) streams
INPUT_DIM = 1 + NUM_FUNCTIONS
NUM_TOKENS = NUM_VARS + 1
LAYOUTS = ("sample", "pair")
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
        raise UserError(f"function_id must be in [0, {NUM_FUNCTIONS}), got {function_id}")
    return np.array(_table(int(function_id), int(function_seed)))


def evaluate(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Product-logic sum-of-products of ``table [32]`` at points ``x [..., 5]`` (NI Eq. 16-19)."""
    out = evaluate_all(x, np.asarray(table, dtype=bool)[None])[..., 0]
    return out[()]  # one point: a numpy scalar, not a 0-d array


def evaluate_all(x: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """All functions of ``tables [F, 32]`` (bool) at points ``x [..., 5]`` at once: ``[..., F]``.

    ``f_u(x) = 1 - Π_m (1 - term_m(x))^{table[u, m]}`` (Eq. 18 over the table's minterms),
    the minterms ``term_m [..., 32]`` computed once for all functions."""
    x = np.asarray(x, dtype=np.float64)
    lit = np.where(_BITS, x[..., None, :], 1 - x[..., None, :])              # [..., 32, 5]
    keep = 1 - lit.prod(-1)                                                  # 1 - term_m: [..., 32]
    factors = np.where(tables, keep[..., None, :], 1.0)                      # [..., F, 32]
    return 1 - factors.prod(-1)


def encode(x: np.ndarray, function_id: int) -> np.ndarray:
    """The ``[6, 31]`` ``pair``-layout input of point ``x [5]`` and function ``function_id``."""
    out = np.zeros((NUM_TOKENS, INPUT_DIM), dtype=np.float32)
    out[:NUM_VARS, 0] = x
    out[NUM_VARS, 1 + function_id] = 1
    return out


def function_id_of(inputs: Tensor) -> Tensor:
    """Function id(s) of a ``pair``-layout input ``[6, 31]`` or a batch ``[B, 6, 31]``."""
    return inputs[..., NUM_VARS, 1:].argmax(-1)


#: What the parameters accept (``TaskInfo.param_bounds`` / ``param_choices``); a rule on
#: ``function_ids`` applies to each id, :func:`check_function_ids` checks that there are some,
#: all distinct.
PARAM_BOUNDS = {**GENERATOR_BOUNDS, "function_seed": INT_NON_NEGATIVE,
                "function_ids": Bounds(lo=0, hi=NUM_FUNCTIONS, hi_open=True, integer=True,
                                       note="ids of the family's functions")}
PARAM_CHOICES = {"layout": Choices(LAYOUTS, note=(
    "'sample': NI's set-up, one item per point with all functions' targets, heads = number of functions; "
    "'pair': one item per (point, function) for single-read-out models such as NAC"))}


def check_function_ids(function_ids: object) -> tuple[int, ...]:
    """The ids as a tuple: a non-empty list of distinct ids (each in range: :data:`PARAM_BOUNDS`)."""
    try:
        ids = tuple(int(u) for u in function_ids) if not isinstance(function_ids, (str, bytes)) else ()
    except (TypeError, ValueError):
        ids = ()
    if not ids or len(set(ids)) != len(ids):
        raise UserError(f"function_ids must be distinct ids in [0, {NUM_FUNCTIONS}), got {function_ids!r}")
    return ids


class FuzzyBooleanDataset(GeneratedDataset):
    """A split of ``size`` points in ``layout`` ``"sample"`` or ``"pair"`` (module docstring)."""

    def __init__(self, split: str, seed: int, size, function_ids: Sequence[int], function_seed: int,
                 layout: str = "sample") -> None:
        ids, self.layout = check_function_ids(function_ids), str(layout)
        self.num_points = split_size(size, split)
        super().__init__(split, seed, self.num_points * (len(ids) if self.layout == "pair" else 1))
        self.function_ids, self.function_seed = ids, int(function_seed)
        self.tables = np.stack([truth_table(u, self.function_seed) for u in ids])  # [F, 32] bool

    def point(self, p: int) -> np.ndarray:
        return sample_rng(self.seed, self.split, p).random(NUM_VARS)

    def targets(self, x: np.ndarray) -> np.ndarray:
        """``f_u(x)`` of every function of the split, float32 ``[..., F]``."""
        return evaluate_all(x, self.tables).astype(np.float32)

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        if self.layout == "sample":
            x = self.point(index)
            return torch.from_numpy(x.astype(np.float32)[:, None]), torch.from_numpy(self.targets(x))  # [5, 1], [F]
        k = index % len(self.function_ids)
        x = self.point(index // len(self.function_ids))
        y = evaluate_all(x, self.tables[k:k + 1])
        return torch.from_numpy(encode(x, self.function_ids[k])), torch.tensor(y, dtype=torch.float32)


def _builder(default_ids: tuple[int, ...]):
    def build(split: str, seed: int = 0, size=None, function_ids: Sequence[int] = default_ids,
              function_seed: int = 0, layout: str = "sample") -> FuzzyBooleanDataset:
        """Fuzzy Boolean split. ``size``: points (int or ``{split: n}``; default 131072 train /
        32768 val); ``function_ids``: which of the 30 functions; ``function_seed`` draws the
        family of truth tables, ``seed`` the points; ``layout``: ``"sample"`` (NI) or ``"pair"``."""
        return FuzzyBooleanDataset(split, seed, DEFAULT_SIZE if size is None else size,
                                   function_ids, function_seed, layout)
    return build


def _describe(params: dict) -> tuple[InputSpec, int, int]:
    """``sample``: 5 ordered scalars ``[5, 1]``, one head per function; ``pair``: ``[6, 31]``, one head."""
    ids = check_function_ids(params["function_ids"])
    if params["layout"] == "pair":
        return InputSpec.vectors(NUM_TOKENS, INPUT_DIM, ordered=True), 1, 1  # token k is variable k; the last the function
    return InputSpec.vectors(NUM_VARS, 1, ordered=True), 1, len(ids)


def _info(name: str, ids: tuple[int, ...], what: str) -> TaskInfo:
    return TaskInfo(
        name=name,
        kind="generator",
        description=(f"Fuzzy Boolean regression (NI Sec. 4.1, App. B), {what}: f_u(x) for x ~ U[0,1]^5 and "
                     f"functions u = {ids[0]}-{ids[-1]} of a family of 30 product-logic sum-of-products "
                     f"functions. layout 'sample' (NI): input [5, 1] (5 scalars), targets [{len(ids)}], one "
                     f"head (CLS token) per function; layout 'pair': input [6, 31] (5 scalars + a function "
                     f"token), target [1], one item per (point, function). size counts points."),
        describe=_describe,
        loss="mse",
        metrics=("r2", "r2_std"),
        splits=("train", "val"),
        params={"seed": 0, "size": dict(DEFAULT_SIZE), "function_ids": ids, "function_seed": 0, "layout": "sample"},
        param_bounds=PARAM_BOUNDS, param_choices=PARAM_CHOICES,
    )


register_task(_info("fuzzy_boolean", PRETRAIN_IDS, "pre-training functions"), _builder(PRETRAIN_IDS))
register_task(_info("fuzzy_boolean_adapt", ADAPT_IDS, "adaptation functions"), _builder(ADAPT_IDS))
