"""Long Range Arena text tasks: IMDB as raw bytes ("Text") and ListOps TSV files.

Inputs are 1-D ``LongTensor`` ids of variable length; 0 is padding in both tasks and
the tasks' ``collate`` right-pads a batch to its longest sequence.

IMDB bytes: id = byte value + 1 (1..256; vocabulary 257), as LRA's byte encoder
does, so 0 stays free for padding; the raw file bytes are used as they are (UTF-8,
``<br />`` tags included), truncated to ``max_len`` (LRA uses 1000, 2000, 4000 or 4096).

ListOps vocabulary (``LISTOPS_VOCAB``; 16 ids): 0 = pad, digits "0".."9" = 1..10,
"[MIN" = 11, "[MAX" = 12, "[MED" = 13, "[SM" = 14, "]" = 15. The brackets "(" and ")"
of the TSV are dropped. Sequences longer than ``max_len`` (default 2000) are truncated.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import LoaderDataset, malformed, missing, pad_collate, require_root

IMDB_LAYOUT = """\
<root>/                           (the folder aclImdb/, or its parent)
  train/pos/<id>_<rating>.txt     positive reviews (label 1)
  train/neg/<id>_<rating>.txt     negative reviews (label 0)
  test/pos/*.txt, test/neg/*.txt  (train/unsup/ is ignored)"""

LISTOPS_LAYOUT = """\
<root>/                 (e.g. lra_release/listops-1000/)
  basic_train.tsv       header "Source<TAB>Target", then rows like
  basic_val.tsv         ( ( [MAX 2 9 ( [MIN 4 7 ] ) 0 ] ) )<TAB>9
  basic_test.tsv        tokens separated by whitespace, target 0-9"""

LISTOPS_VOCAB: dict[str, int] = {"<pad>": 0, **{str(d): d + 1 for d in range(10)},
                                 "[MIN": 11, "[MAX": 12, "[MED": 13, "[SM": 14, "]": 15}
_NAME = re.compile(r"^(\d+)_(\d+)\.txt$")


def _check_max_len(task: str, max_len: Any) -> int:
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"{task}: max_len must be a positive int, got {max_len!r}")
    return max_len


class ImdbBytesDataset(LoaderDataset):
    """Review files read on access → ``(LongTensor [min(len, max_len)] of byte+1, long label)``."""

    def __init__(self, samples: list[tuple[Path, int]], max_len: int, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.samples, self.max_len = samples, max_len

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        path, label = self.samples[index]
        with open(path, "rb") as f:
            data = f.read(self.max_len)
        ids = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64) + 1)
        return self._out(ids, torch.tensor(label, dtype=torch.long))


def _review_key(p: Path) -> tuple[int, str]:
    m = _NAME.match(p.name)
    return (int(m.group(1)) if m else -1, p.name)


def build_imdb_bytes(split: str, root: Any = None, max_len: int = 4096,
                     transform: Callable | None = None) -> ImdbBytesDataset:
    """IMDB reviews ``train`` / ``test`` (25,000 each): neg (label 0) then pos (label 1), by id."""
    task = "imdb_bytes"
    max_len = _check_max_len(task, max_len)
    path = require_root(task, root, IMDB_LAYOUT)
    if not (path / split).is_dir() and (path / "aclImdb").is_dir():
        path = path / "aclImdb"
    samples: list[tuple[Path, int]] = []
    for label, name in ((0, "neg"), (1, "pos")):
        folder = path / split / name
        if not folder.is_dir():
            raise missing(task, f"no folder {split}/{name}/", IMDB_LAYOUT,
                          path / split if (path / split).is_dir() else path)
        files = sorted((p for p in folder.iterdir() if p.suffix == ".txt" and p.is_file()), key=_review_key)
        if not files:
            raise missing(task, f"no .txt reviews in {split}/{name}/", IMDB_LAYOUT, folder)
        samples += [(p, label) for p in files]
    return ImdbBytesDataset(samples, max_len, transform)


def tokenize_listops(source: str) -> list[int]:
    """ListOps source string → ids of :data:`LISTOPS_VOCAB` (brackets "(" ")" dropped)."""
    try:
        return [LISTOPS_VOCAB[t] for t in source.split() if t not in ("(", ")")]
    except KeyError as exc:
        raise ValueError(f"unknown ListOps token {exc.args[0]!r}; known: {sorted(LISTOPS_VOCAB)[1:]}") from None


class ListOpsDataset(LoaderDataset):
    """Token ids held in one flat tensor with offsets → ``(LongTensor [len], long target)``."""

    def __init__(self, flat: Tensor, offsets: Tensor, targets: Tensor, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.flat, self.offsets, self.targets = flat, offsets, targets

    def __len__(self) -> int:
        return self.targets.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        ids = self.flat[int(self.offsets[index]): int(self.offsets[index + 1])].long()
        return self._out(ids, self.targets[index])


def build_lra_listops(split: str, root: Any = None, max_len: int = 2000,
                      transform: Callable | None = None) -> ListOpsDataset:
    """LRA ListOps from ``basic_{train,val,test}.tsv`` (96,000 / 2,000 / 2,000 rows)."""
    task = "lra_listops"
    max_len = _check_max_len(task, max_len)
    path = require_root(task, root, LISTOPS_LAYOUT)
    file = path / f"basic_{split}.tsv"
    if not file.is_file():
        raise missing(task, f"no file basic_{split}.tsv", LISTOPS_LAYOUT, path)
    lines = file.read_text(encoding="utf-8").splitlines()
    if not lines or [c.strip() for c in lines[0].split("\t")] != ["Source", "Target"]:
        raise malformed(task, file, f"first line must be the header 'Source<TAB>Target', got "
                                    f"{lines[0][:60]!r}" if lines else "empty file", LISTOPS_LAYOUT)
    seqs, targets = [], []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise malformed(task, file, f"line {n} has {len(fields)} TAB-separated fields, expected 2",
                            LISTOPS_LAYOUT)
        try:
            ids, target = tokenize_listops(fields[0]), int(fields[1])
        except ValueError as exc:
            raise malformed(task, file, f"line {n}: {exc}", LISTOPS_LAYOUT) from None
        if not 0 <= target <= 9:
            raise malformed(task, file, f"line {n}: target {target} is not 0-9", LISTOPS_LAYOUT)
        seqs.append(ids[:max_len])
        targets.append(target)
    if not targets:
        raise malformed(task, file, "no rows after the header", LISTOPS_LAYOUT)
    offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    flat = torch.tensor([i for s in seqs for i in s], dtype=torch.uint8)
    return ListOpsDataset(flat, offsets, torch.tensor(targets, dtype=torch.long), transform)


def _token_ids(vocab_size: int, num_classes: int):
    """Ids ``[L ≤ max_len]`` (0 = padding, right-padded per batch) of a ``vocab_size``-id vocabulary."""
    def describe(params: dict) -> tuple[InputSpec, int]:
        return InputSpec.tokens(params["max_len"], vocab_size, pad_id=0, padded=True), num_classes
    return describe


register_task(TaskInfo(
    name="imdb_bytes", kind="loader",
    description="LRA Text: IMDB reviews as byte ids (byte+1, 0 = pad), truncated to max_len; padded per batch",
    describe=_token_ids(257, 2),
    splits=("train", "test"), params={"root": None, "max_len": 4096, "transform": None},
    collate=pad_collate,
), build_imdb_bytes)

register_task(TaskInfo(
    name="lra_listops", kind="loader",
    description="LRA ListOps from basic_{train,val,test}.tsv; 16-id vocabulary (0 = pad); padded per batch",
    describe=_token_ids(len(LISTOPS_VOCAB), 10),
    splits=("train", "val", "test"), params={"root": None, "max_len": 2000, "transform": None},
    collate=pad_collate,
), build_lra_listops)
