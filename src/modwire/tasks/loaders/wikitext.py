"""WikiText-2 (Merity et al. 2017) for word-level language modelling (NFM §4.6, Table 8).

Reads the official files, never downloads: ``wikitext-2/wiki.{train,valid,test}.tokens``
(``variant="tokens"``, the tokenised release whose rare words are already ``<unk>``) or
``wikitext-2-raw/wiki.{train,valid,test}.raw`` (``variant="raw"``).

Vocabulary (word level, from the **train** file only): each line is split on whitespace and
ends with ``<eos>`` (blank lines too), as in PyTorch's ``word_language_model`` example and
AWD-LSTM; ids follow the order of first appearance in the train file, so the vocabulary is a
pure function of that file. Words seen fewer than ``min_count`` times in train are mapped to
``<unk>``; ``<unk>`` is appended to the vocabulary when train does not contain it. A word of
valid/test that is not in the vocabulary becomes ``<unk>`` (the tokens release has none: its
33,278-word vocabulary covers all three splits). With the defaults the tokens release gives
the usual 33,278 words and 2,088,628 / 217,646 / 245,569 train / valid / test tokens.

Items: the split's token stream cut into non-overlapping chunks of ``seq_len`` tokens (the
last partial chunk is dropped): item ``j`` is ``(x, y)`` with ``x = s[jT : jT+T]`` and the
next-token targets ``y = s[jT+1 : jT+T+1]``, both ``LongTensor [T]``. Each chunk is an
independent context (no state carried between chunks), so the first tokens of every chunk
are predicted with little context: perplexities are higher than with a sliding window.
"""
from __future__ import annotations

import functools
import os
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import LoaderDataset, first_dir, first_existing, malformed, missing, read_text_file, require_root
from ...errors import UnknownNameError, UserError, UserTypeError
from ...fields import INT_COUNT, did_you_mean

TASK = "wikitext2"
VARIANTS = {"tokens": ("wikitext-2", "tokens"), "raw": ("wikitext-2-raw", "raw")}   # folder, file suffix
FILE_SPLITS = {"train": "train", "val": "valid", "test": "test"}
EOS, UNK = "<eos>", "<unk>"
LAYOUT = """\
<root>/                              (the folder below, or its parent)
  wikitext-2/wiki.train.tokens       variant "tokens" (default); also wiki.valid.tokens, wiki.test.tokens
  wikitext-2-raw/wiki.train.raw      variant "raw"; also wiki.valid.raw, wiki.test.raw
or files={train: a.txt, valid: b.txt, test: c.txt} (absolute, or relative to root; splits not named: as above)
(UTF-8 text, a leading byte-order mark is dropped; one paragraph or heading per line, words separated by spaces)"""


FILE_KEYS = {"train": "train", "val": "val", "valid": "val", "test": "test"}   # a key of files= -> its split


def split_files(files: Any) -> dict[str, Path]:
    """The parameter ``files`` (``{train: ..., valid: ..., test: ...}``; ``val`` for ``valid`` too) as
    ``{split: path}``; None: ``{}``. A mapping of other keys or of non-path values is a UserError
    naming the parameter, what it got and what it accepts."""
    if files is None:
        return {}
    label = f"task {TASK!r}: parameter 'files'"
    if not isinstance(files, Mapping):
        raise UserTypeError(f"{label}: got {files!r} ({type(files).__name__}), expected a mapping of split names to "
                            f"files, e.g. {{train: wiki.train.tokens, valid: wiki.valid.tokens, test: "
                            f"wiki.test.tokens}} (relative to root when root is given)")
    out: dict[str, Path] = {}
    for key, value in files.items():
        if key not in FILE_KEYS:
            raise UnknownNameError(f"{label}: unknown split {key!r}; expected keys among {list(FILE_KEYS)}"
                                   f"{did_you_mean(str(key), FILE_KEYS)}")
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            raise UserTypeError(f"{label}.{key}: got {value!r}, expected the path of a text file")
        if FILE_KEYS[key] in out:
            raise UserError(f"{label}: gives the split {FILE_KEYS[key]!r} twice (keys 'val' and 'valid' are the same "
                            f"split), got {dict(files)!r}")
        out[FILE_KEYS[key]] = Path(os.path.expanduser(str(value)))
    return out


def split_file(root: Any, variant: str, split: str, files: Any = None) -> Path:
    """The file of ``split`` (``train`` / ``val`` / ``test``): ``files[split]`` when the parameter
    ``files`` names it (a relative path is relative to ``root`` when given, else to the working
    directory), else ``wiki.<split>.<variant>`` under ``root`` or ``root/<folder>``."""
    named = split_files(files)
    if split in named:
        file = named[split]
        if not file.is_absolute() and root is not None:
            file = require_root(TASK, root, LAYOUT) / file
        if not file.is_file():
            raise missing(TASK, f"files.{split}: no file {file}", LAYOUT, first_dir(file.parent, Path(".")))
        return file
    folder, suffix = VARIANTS[variant]
    path = require_root(TASK, root, LAYOUT)
    name = f"wiki.{FILE_SPLITS[split]}.{suffix}"
    return first_existing(TASK, name, [path / name, path / folder / name], LAYOUT, path)


def words(text: str) -> list[str]:
    """Every line's whitespace-separated words followed by ``<eos>`` (module docstring)."""
    return [w for line in text.splitlines() for w in (*line.split(), EOS)]


@functools.lru_cache(maxsize=4)
def _vocabulary(path: str, stamp: tuple[int, int], min_count: int) -> tuple[str, ...]:
    stream = words(read_text_file(TASK, Path(path), LAYOUT))
    if len(stream) < 2:
        raise malformed(TASK, path, f"the train file has {len(stream)} token(s), expected at least 2", LAYOUT)
    counts = Counter(stream)
    vocab = [w for w in dict.fromkeys(stream) if counts[w] >= min_count or w == EOS]   # first appearance
    return tuple(vocab) if UNK in vocab else (*vocab, UNK)


def vocabulary(root: Any, variant: str = "tokens", min_count: int = 1, files: Any = None) -> tuple[str, ...]:
    """The words of the vocabulary in id order (module docstring); cached per train file."""
    path = split_file(root, variant, "train", files)
    st = os.stat(path)
    return _vocabulary(str(path), (st.st_mtime_ns, st.st_size), min_count)


def encode(stream: list[str], vocab: tuple[str, ...]) -> np.ndarray:
    """Word stream → int64 ids; a word outside ``vocab`` → ``<unk>``."""
    index = {w: i for i, w in enumerate(vocab)}
    unk = index[UNK]
    return np.fromiter((index.get(w, unk) for w in stream), dtype=np.int64, count=len(stream))


class LMChunks(LoaderDataset):
    """Non-overlapping next-token chunks of one token stream: ``(x [T], y [T])`` (module docstring)."""

    def __init__(self, ids: Tensor, seq_len: int, vocab: tuple[str, ...], transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.ids, self.seq_len, self.vocab = ids, seq_len, vocab

    def __len__(self) -> int:
        return max(0, (self.ids.numel() - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} chunks")
        start = index * self.seq_len
        chunk = self.ids[start: start + self.seq_len + 1]
        return self._out(chunk[:-1].clone(), chunk[1:].clone())


#: A split whose share of words outside the vocabulary exceeds this is named in a warning.
OOV_WARN_SHARE = 0.5


def build_wikitext2(split: str, root: Any = None, variant: str = "tokens", seq_len: int = 128, min_count: int = 1,
                    transform: Callable | None = None, files: Any = None) -> LMChunks:
    """WikiText-2 ``train`` / ``val`` (file ``valid``) / ``test`` as chunks of ``seq_len`` tokens; the
    files of ``files={train: ..., valid: ..., test: ...}`` where it names them. A split of which more
    than half the words are not in the vocabulary (a file of another corpus or variant) is named
    in a warning with that share."""
    vocab = vocabulary(root, variant, min_count, files)
    path = split_file(root, variant, split, files)
    stream = words(read_text_file(TASK, path, LAYOUT))
    ids = torch.from_numpy(encode(stream, vocab))
    _warn_out_of_vocabulary(split, path, stream, ids, vocab, split_file(root, variant, "train", files))
    if ids.numel() < seq_len + 1:
        raise malformed(TASK, path, f"{ids.numel()} tokens is fewer than one chunk of seq_len + 1 = "
                                    f"{seq_len + 1}", LAYOUT)
    return LMChunks(ids, seq_len, vocab, transform)


def _warn_out_of_vocabulary(split: str, path: Path, stream: list[str], ids: Tensor, vocab: tuple[str, ...],
                            train: Path) -> None:
    """Warn when more than :data:`OOV_WARN_SHARE` of the words of ``stream`` (``<eos>`` not counted,
    a literal ``<unk>`` not out of the vocabulary) are mapped to ``<unk>``."""
    unk = vocab.index(UNK)
    words_ = sum(1 for w in stream if w != EOS)
    oov = int((ids == unk).sum()) - sum(1 for w in stream if w == UNK)
    if words_ and oov / words_ > OOV_WARN_SHARE:
        warnings.warn(f"{TASK}: {oov / words_:.1%} of the {words_:,} words of split {split!r} ({path}) are not in the "
                      f"vocabulary of the train file {train} and become {UNK}: a file of another corpus or "
                      f"variant? (name the files with files={{train: ..., valid: ..., test: ...}})", stacklevel=3)


OFFICIAL_VOCAB = 33278     # words of wiki.train.tokens, <eos> included (Merity et al. 2017)


def describe(params: dict) -> tuple[InputSpec, int]:
    """Ids ``[seq_len]`` (no padding); the class count is the vocabulary size, counted from the train
    file. Without the files (a config checked before the data is in place), the tokens release with
    ``min_count=1`` is described by its official size, :data:`OFFICIAL_VOCAB`; building a split
    still needs the files."""
    variant, seq_len, min_count, files = params["variant"], params["seq_len"], params["min_count"], params["files"]
    named = split_files(files)                      # a bad files= is refused here, before any data is read
    try:
        size = len(vocabulary(params["root"], variant, min_count, files))
    except (FileNotFoundError, ValueError):
        if (variant != "tokens" or min_count != 1 or "train" in named
                or params["root"] is not None and _has_train(params["root"])):
            raise
        size = OFFICIAL_VOCAB
    return InputSpec.tokens(seq_len, size), size


def _has_train(root: Any) -> bool:
    path = Path(os.path.expanduser(str(root)))
    return any((d / "wiki.train.tokens").is_file() for d in (path, path / "wikitext-2"))


register_task(TaskInfo(
    name=TASK, kind="loader",
    description=("WikiText-2 word-level language modelling from wiki.{train,valid,test}.tokens (or .raw): "
                 "vocabulary of the train file (+ <eos> per line), next-token chunks of seq_len tokens"),
    inputs=InputSpec.tokens(128, OFFICIAL_VOCAB), num_classes=OFFICIAL_VOCAB,
    describe=describe,   # the vocabulary size of the files under root
    loss="token_cross_entropy", metrics=("perplexity", "token_top1"),
    splits=("train", "val", "test"),
    params={"root": None, "variant": "tokens", "seq_len": 128, "min_count": 1, "transform": None, "files": None},
    param_bounds={"seq_len": INT_COUNT, "min_count": INT_COUNT}, param_choices={"variant": tuple(VARIANTS)},
), build_wikitext2)
