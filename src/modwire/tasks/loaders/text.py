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

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, TaskInfo, pad_collate, register_task
from ._common import (LoaderDataset, first_dir, first_existing, malformed, missing, read_text_file, require_root,
                      text_problem)
from ...errors import UserError
from ...fields import INT_COUNT

IMDB_LAYOUT = """\
<root>/                           (the folder aclImdb/, or its parent)
  train/pos/<id>_<rating>.txt     positive reviews (label 1)
  train/neg/<id>_<rating>.txt     negative reviews (label 0)
  test/pos/*.txt, test/neg/*.txt  (train/unsup/ is ignored)"""

LISTOPS_LAYOUT = """\
<root>/                 (e.g. lra_release/listops-1000/, or lra_release/ or its parent)
  basic_train.tsv       header "Source<TAB>Target" (LRA; the original generator's "Target<TAB>Source"
  basic_val.tsv         is read too), then rows like ( ( [MAX 2 9 ( [MIN 4 7 ] ) 0 ] ) )<TAB>9:
  basic_test.tsv        tokens separated by whitespace, target 0-9
or files={train: a.tsv, val: b.tsv, test: c.tsv} (absolute, or relative to root)"""
LISTOPS_DIRS = (".", "listops-1000", "lra_release/listops-1000")  # where under root basic_<split>.tsv is looked for

LISTOPS_VOCAB: dict[str, int] = {"<pad>": 0, **{str(d): d + 1 for d in range(10)},
                                 "[MIN": 11, "[MAX": 12, "[MED": 13, "[SM": 14, "]": 15}
_NAME = re.compile(r"^(\d+)_(\d+)\.txt$")


class ImdbBytesDataset(LoaderDataset):
    """Review files read on access → ``(LongTensor [min(len, max_len)] of byte+1, long label)``."""

    def __init__(self, samples: list[tuple[Path, int]], max_len: int, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.samples, self.max_len = samples, max_len

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def targets(self) -> Tensor:
        """The class label of every item (declared: ``data.max_samples`` draws a stratified subset)."""
        return torch.tensor([label for _, label in self.samples], dtype=torch.long)

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
    path = require_root(task, root, IMDB_LAYOUT)
    path = first_existing(task, f"{split}/ folder", [path / split, path / "aclImdb" / split], IMDB_LAYOUT, path,
                          directory=True).parent
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
        raise UserError(f"unknown ListOps token {exc.args[0]!r}; known: {sorted(LISTOPS_VOCAB)[1:]}") from None


class ListOpsFiles(LoaderDataset):
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


def listops_file(split: str, root: Any, files: Any, task: str = "lra_listops") -> Path:
    """The TSV of ``split``: ``files[split]`` (absolute, or relative to ``root``, else to the working
    directory) when ``files`` is given, else the first ``<root>/<dir>/basic_<split>.tsv`` of
    :data:`LISTOPS_DIRS` (the error lists every path tried)."""
    if files is None:
        path = require_root(task, root, LISTOPS_LAYOUT)
        return first_existing(task, f"basic_{split}.tsv", [(path / d / f"basic_{split}.tsv") for d in LISTOPS_DIRS],
                              LISTOPS_LAYOUT, path)
    if not isinstance(files, Mapping):
        raise UserError(f"{task}: files must map split names to TSV files, e.g. {{train: a.tsv, val: b.tsv}}, "
                        f"got {files!r}")
    if split not in files:
        raise UserError(f"{task}: files has no entry for split {split!r} (it has {sorted(files)})")
    file = Path(os.path.expanduser(str(files[split])))
    if not file.is_absolute() and root is not None:
        file = require_root(task, root, LISTOPS_LAYOUT) / file
    if not file.is_file():
        raise missing(task, f"files.{split}: no file {file}", LISTOPS_LAYOUT, first_dir(file.parent, Path(".")))
    return file


def listops_columns(file: Path, header: str, task: str = "lra_listops") -> tuple[int, int]:
    """``(source column, target column)`` named by the header line (either order, any case)."""
    names = [c.strip().lower() for c in header.split("\t")]
    if sorted(names) != ["source", "target"]:
        html = text_problem(header.encode()[:64], "a TSV file")
        hint = f"; the file is {html}" if html and "HTML" in html else ""
        raise malformed(task, file, f"the first line must be the header naming the TAB-separated columns Source "
                                    f"and Target (LRA: 'Source<TAB>Target'; the original generator: "
                                    f"'Target<TAB>Source'), got {header[:60]!r}{hint}", LISTOPS_LAYOUT)
    return names.index("source"), names.index("target")


def read_listops_tsv(file: Path, max_len: int, task: str = "lra_listops") -> tuple[list[list[int]], list[int]]:
    """Token ids (truncated to ``max_len``) and targets of every row of a ListOps TSV file."""
    lines = read_text_file(task, file, LISTOPS_LAYOUT).splitlines()
    if not lines:
        raise malformed(task, file, "empty file", LISTOPS_LAYOUT)
    src, tgt = listops_columns(file, lines[0], task)
    seqs, targets = [], []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise malformed(task, file, f"line {n} has {len(fields)} TAB-separated fields, expected 2",
                            LISTOPS_LAYOUT)
        try:
            ids, target = tokenize_listops(fields[src]), int(fields[tgt])
        except ValueError as exc:
            raise malformed(task, file, f"line {n}: {exc}", LISTOPS_LAYOUT) from None
        if not 0 <= target <= 9:
            raise malformed(task, file, f"line {n}: target {target} is not 0-9", LISTOPS_LAYOUT)
        seqs.append(ids[:max_len])
        targets.append(target)
    if not targets:
        raise malformed(task, file, "no rows after the header", LISTOPS_LAYOUT)
    return seqs, targets


def build_lra_listops(split: str, root: Any = None, max_len: int = 2000, files: Any = None,
                      transform: Callable | None = None) -> ListOpsFiles:
    """LRA ListOps from ``basic_{train,val,test}.tsv`` (96,000 / 2,000 / 2,000 rows), or from the
    files named by ``files={split: path}`` (see :func:`listops_file`); columns by the header."""
    task = "lra_listops"
    seqs, targets = read_listops_tsv(listops_file(split, root, files, task), max_len, task)
    offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    flat = torch.tensor([i for s in seqs for i in s], dtype=torch.uint8)
    return ListOpsFiles(flat, offsets, torch.tensor(targets, dtype=torch.long), transform)


def _token_ids(vocab_size: int, num_classes: int):
    """Ids ``[L ≤ max_len]`` (0 = padding, right-padded per batch) of a ``vocab_size``-id vocabulary."""
    def describe(params: dict) -> tuple[InputSpec, int]:
        return InputSpec.tokens(params["max_len"], vocab_size, pad_id=0, padded=True), num_classes
    return describe


register_task(TaskInfo(
    name="imdb_bytes", kind="loader",
    description="LRA Text: IMDB reviews as byte ids (byte+1, 0 = pad), truncated to max_len; padded per batch",
    describe=_token_ids(257, 2), class_names=("neg", "pos"),
    splits=("train", "test"), params={"root": None, "max_len": 4096, "transform": None},
    param_bounds={"max_len": INT_COUNT},
    collate=pad_collate,
), build_imdb_bytes)

register_task(TaskInfo(
    name="lra_listops", kind="loader",
    description="LRA ListOps from basic_{train,val,test}.tsv; 16-id vocabulary (0 = pad); padded per batch",
    describe=_token_ids(len(LISTOPS_VOCAB), 10), class_names=DIGIT_CLASSES,
    splits=("train", "val", "test"), params={"root": None, "max_len": 2000, "files": None, "transform": None},
    param_bounds={"max_len": INT_COUNT},
    collate=pad_collate,
), build_lra_listops)
