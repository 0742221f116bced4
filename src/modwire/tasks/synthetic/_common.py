"""Shared plumbing of the built-in generators: per-sample RNGs, split sizes, a base dataset.

Every generated sample is a pure function of ``(seed, split, index)``: its numpy
``Generator`` is built from ``np.random.SeedSequence([seed, split_id, index])`` (never
from global RNG state, never one generator drawn from sequentially), so a split is a
fixed dataset whatever the access order, DataLoader workers or shuffling. Splits are
disjoint because their ``split_id`` differs (train 0, val 1, test 2).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from torch.utils.data import Dataset

from ...errors import UserError
from ...fields import INT_NON_NEGATIVE

SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
#: The rules of the parameters every generator has (``TaskInfo.param_bounds``): ``size`` is one
#: count or ``{split: count}`` (each count checked).
GENERATOR_BOUNDS = {"seed": INT_NON_NEGATIVE, "size": INT_NON_NEGATIVE}


def split_id(split: str) -> int:
    if split not in SPLIT_IDS:
        raise UserError(f"unknown split {split!r}; valid: {list(SPLIT_IDS)}")
    return SPLIT_IDS[split]


def sample_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of sample ``index`` of ``split``: ``SeedSequence([seed, split_id, index])``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), split_id(split), int(index)]))


def split_size(size: int | Mapping[str, int], split: str) -> int:
    """``size`` is one count for every split, or a mapping ``{split: count}`` (the counts are
    checked by :data:`GENERATOR_BOUNDS`)."""
    if isinstance(size, Mapping):
        bad = [k for k in size if not isinstance(k, str) or k not in SPLIT_IDS]
        if bad:    # e.g. `size={train:8}`: YAML needs a space after the colon, else a key "train:8"
            raise UserError(f"size has unknown split name(s) {bad}: expected a mapping of {list(SPLIT_IDS)} "
                            f"to counts (in YAML, a space after each colon: {{train: 8, val: 2}})")
    if isinstance(size, Mapping) and size.get(split) is None:  # e.g. `--set data.params.size:={train: 8}`
        raise UserError(f"size has no count for split {split!r}: expected a count for every split used, "
                        f"got {dict(size)!r}")
    return int(size[split] if isinstance(size, Mapping) else size)


class GeneratedDataset(Dataset):
    """Map-style dataset of ``length`` items; subclasses implement ``item(index)``."""

    def __init__(self, split: str, seed: int, length: int) -> None:
        split_id(split)
        self.split, self.seed, self.length = split, int(seed), int(length)

    def __len__(self) -> int:
        return self.length

    def _index(self, index: int) -> int:
        index = int(index)
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for a split of {self.length} items")
        return index

    def __getitem__(self, index: int):
        return self.item(self._index(index))

    def __getitems__(self, indices) -> list:
        """The items ``indices`` at once (what a DataLoader asks for a batch): :meth:`items`,
        equal item by item to ``[self[i] for i in indices]``."""
        return self.items([self._index(i) for i in indices])

    def item(self, index: int):  # pragma: no cover - abstract
        raise NotImplementedError

    def items(self, indices: list[int]) -> list:
        """Items ``indices`` (checked, non-negative); a generator that renders whole batches at once
        (vectorised) overrides it."""
        return [self.item(i) for i in indices]
