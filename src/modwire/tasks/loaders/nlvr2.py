"""NLVR2 (Suhr et al. 2019) from precomputed token features, for the conditional NAC
(NAC §4.4 "Sample-Conditional Circuit Design Generation" and App. G "NLVR2 Experiments").

Task ``nlvr2_features``: is a sentence true of a pair of photographs? The paper encodes both
modalities with a frozen CLIP (CLIP-base) and keeps the pre-pooling tokens: the circuit
generator cross-attends to the sentence's text tokens, the executor reads the tokens of
both images. CLIP is not downloaded here (nothing is): the loader reads features that
the user computed, from two files of keyed arrays:

* image features: key = the image's file name, ``<split>-<set>-<pair>-img0.png`` (left)
  and ``...-img1.png`` (right) (the key without ``.png`` is accepted too); value
  ``[n, d_img]``, the same ``n`` for every image of a split;
* text features: key = the example's ``identifier``; value ``[m, d_txt]``, ``m ≥ 1`` may
  vary between sentences.

Both are ``.safetensors`` files (read with ``safetensors.safe_open``) or ``.npz`` archives
(read with ``numpy.load(allow_pickle=False)``), told apart by their first bytes: nothing
is ever unpickled. Values may be any float dtype (returned as float32). Files are opened
lazily in each process (DataLoader workers included) and arrays read on access.

The examples come from NLVR2's official JSON-lines files (``train.json``, ``dev.json``,
``test1.json``, ``test2.json``). Each line is an object with at least ``identifier``
``"<split>-<set_id>-<pair_id>-<sentence_id>"`` (e.g. ``"dev-850-0-0"``; the images of the
pair are ``dev-850-0-img0.png`` / ``dev-850-0-img1.png``) and ``label`` (``"True"`` /
``"False"``; JSON booleans are accepted too); ``sentence`` is kept for analysis.

Item: ``({"x": float32 [2n, d_img + 1], "condition": float32 [m, d_txt]}, label)`` where
``x`` = the left image's ``n`` tokens then the right image's, each with one appended
*side column* (0.0 left, 1.0 right) so that a set model can tell the two images apart
(``side_column=False`` drops it: ``[2n, d_img]``); ``label`` is a 0-d ``LongTensor``,
1 = True. :func:`collate` stacks ``x`` and right-pads ``condition`` to the batch's longest
sentence with zero rows (the model is called with exactly ``x`` and ``condition``, so
there is no padding mask: zero rows are attended like any token; this loader accepts
that, as CLIP's own 77-token outputs already carry end-of-text padding tokens).

Model dimensions. The task describes its inputs from its parameters (:func:`describe`):
by default CLIP ViT-B/32's pre-projection widths (``image_dim=768`` + 1 side column,
``text_dim=512``). For other features set ``data.params.image_dim`` /
``data.params.text_dim``; the model's input layers follow. ``build`` reads the first
example's arrays and raises an error that prints these settings when the files' widths
differ from ``image_dim`` / ``text_dim``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..base import InputSpec, TaskInfo, register_task
from ._common import FormatError, first_existing, malformed, require_root, text_problem
from ...errors import UserError
from ...fields import INT_COUNT

TASK = "nlvr2_features"
CLIP_B32_IMAGE_DIM, CLIP_B32_TEXT_DIM = 768, 512  # CLIP ViT-B/32 token widths before the projections
SPLIT_FILES = {"train": "train", "val": "dev", "dev": "dev", "test": "test1", "test1": "test1", "test2": "test2"}

LAYOUT = """\
<root>/
  train.json, dev.json, test1.json      NLVR2 JSON lines (or <root>/data/<name>.json); one object per line:
                                        {"identifier": "dev-850-0-0", "sentence": "...", "label": "True", ...}
                                        splits: train; val or dev -> dev.json; test or test1 -> test1.json; test2
  <stem>_image_features.safetensors     (or .npz; or image_features.safetensors / .npz for every split;
                                        or image_features=<path>) key "dev-850-0-img0.png" -> float [n, d_img]
  <stem>_text_features.safetensors      (or .npz; or text_features.safetensors / .npz; or text_features=<path>)
                                        key "dev-850-0-0" (the identifier) -> float [m, d_txt]
  <stem> is the JSON file's name without .json; .npz is read with allow_pickle=False, nothing is unpickled"""


def describe(params: dict) -> tuple[dict[str, InputSpec], int]:
    """``x``: both images' tokens, a set of ``2n`` vectors ``[image_dim (+1 side column)]`` (``n`` is
    read from the files: length None); ``condition``: the sentence's ``m`` text tokens ``[text_dim]``,
    zero-padded per batch. The features carry CLIP's own positions, so neither gets learned ones."""
    image_dim, text_dim = params["image_dim"], params["text_dim"]
    return {"x": InputSpec.vectors(None, image_dim + int(bool(params["side_column"]))),
            "condition": InputSpec.vectors(None, text_dim, padded=True)}, 2


# ----------------------------------------------------------------------------- feature files


def sniff_format(path: Path) -> str:
    """``"npz"`` or ``"safetensors"`` from the file's first bytes; anything else (an HTML page
    saved by a failed download, a text file, a pickle, a bare .npy) raises ``FormatError``."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "npz"
    if head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= 100_000_000:  # header size, JSON header
        return "safetensors"
    if head.startswith(b"\x93NUMPY"):
        problem = "a single .npy array, not a keyed archive (save the arrays with numpy.savez)"
    else:
        problem = (text_problem(head, "binary features (safetensors or .npz)")
                   or f"neither safetensors nor .npz (it starts with the bytes {head[:12]!r})")
    raise malformed(TASK, path, problem, LAYOUT)


class FeatureFile:
    """A ``.safetensors`` or ``.npz`` file of arrays keyed by name, opened lazily once per process."""

    def __init__(self, path: Path) -> None:
        self.path, self.format = path, sniff_format(path)
        self._handle: Any = None
        self._pid = -1
        try:
            self.keys = frozenset(self._open().keys() if self.format == "safetensors" else self._open().files)
        except Exception as exc:  # OSError, zipfile.BadZipFile, safetensors' SafetensorError, ...
            raise malformed(TASK, path, f"unreadable {self.format} file ({type(exc).__name__}: {exc})",
                            LAYOUT) from None

    def _open(self):
        if self._handle is None or self._pid != os.getpid():  # never share a file handle across processes
            if self.format == "safetensors":
                from safetensors import safe_open

                self._handle = safe_open(str(self.path), framework="numpy")
            else:
                self._handle = np.load(self.path, allow_pickle=False)
            self._pid = os.getpid()
        return self._handle

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handle": None, "_pid": -1}

    def get(self, key: str) -> np.ndarray:
        """The array stored under ``key`` (which must be in :attr:`keys`)."""
        try:
            h = self._open()
            arr = h.get_tensor(key) if self.format == "safetensors" else h[key]
        except Exception as exc:  # a truncated file, an object array refused by allow_pickle=False, ...
            raise malformed(TASK, self.path, f"key {key!r} is unreadable ({type(exc).__name__}: {exc})",
                            LAYOUT) from None
        if not isinstance(arr, np.ndarray):
            raise malformed(TASK, self.path, f"key {key!r} is not an array", LAYOUT)
        return arr


def checked_tokens(arr: np.ndarray, file: FeatureFile, key: str, width: int, rows: int | None = None) -> Tensor:
    """``arr`` as float32 ``[rows, width]`` (``rows`` free but ≥ 1 when None), or a ``FormatError``."""
    want = f"[{rows if rows is not None else 'm >= 1'}, {width}]"
    ok_shape = arr.ndim == 2 and arr.shape[1] == width and arr.shape[0] >= 1 and rows in (None, arr.shape[0])
    if not ok_shape or not np.issubdtype(arr.dtype, np.floating):
        raise malformed(TASK, file.path, f"key {key!r} holds {arr.dtype} {list(arr.shape)}, expected float "
                                         f"{want}", LAYOUT)
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))


# ----------------------------------------------------------------------------- JSON lines


@dataclass(frozen=True)
class Example:
    """One line of an NLVR2 JSON file; ``images`` are the (left, right) image keys found in the features."""

    identifier: str
    sentence: str
    label: int
    line: int
    images: tuple[str, str] = ("", "")


_IDENTIFIER = re.compile(r"^(?P<pair>.+-\d+)-\d+$")  # <split>-<set>-<pair>-<sentence>


def parse_line(path: Path, n: int, line: str) -> Example:
    """Line ``n`` (1-based) of ``path`` → :class:`Example`, or a ``FormatError`` naming file and line."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise malformed(TASK, path, f"line {n} is not valid JSON ({exc.msg} at column {exc.colno})", LAYOUT) from None
    if not isinstance(obj, dict) or not {"identifier", "label"} <= set(obj):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise malformed(TASK, path, f"line {n} must be an object with 'identifier' and 'label', got {got}", LAYOUT)
    ident, label = obj["identifier"], obj["label"]
    if not isinstance(ident, str) or not _IDENTIFIER.match(ident):
        raise malformed(TASK, path, f"line {n}: identifier {ident!r} is not <split>-<set>-<pair>-<sentence>",
                        LAYOUT)
    if not (isinstance(label, bool) or isinstance(label, str) and label in ("True", "False")):
        raise malformed(TASK, path, f"line {n} ({ident}): label {label!r} is not \"True\" or \"False\"", LAYOUT)
    return Example(ident, str(obj.get("sentence", "")), int(label in (True, "True")), n)


def read_examples(path: Path) -> list[Example]:
    """Every non-blank line of an NLVR2 JSON-lines file, in file order."""
    try:
        with open(path, encoding="utf-8") as f:
            examples = [parse_line(path, n, line) for n, line in enumerate(f, 1) if line.strip()]
    except UnicodeDecodeError as exc:
        raise malformed(TASK, path, f"not UTF-8 text ({exc.reason} at byte {exc.start})", LAYOUT) from None
    if not examples:
        raise malformed(TASK, path, "no examples (the file has no non-blank line)", LAYOUT)
    return examples


def image_names(identifier: str) -> tuple[str, str]:
    """``"dev-850-0-0"`` → ``("dev-850-0-img0.png", "dev-850-0-img1.png")`` (the official file names)."""
    pair = _IDENTIFIER.match(identifier).group("pair")
    return f"{pair}-img0.png", f"{pair}-img1.png"


# ----------------------------------------------------------------------------- locating the files


def find_file(root: Path, what: str, candidates: Sequence[Path]) -> Path:
    """The first existing file of ``candidates``, or a ``LayoutError`` listing every path tried."""
    return first_existing(TASK, f"{what} file", candidates, LAYOUT, root)


def feature_candidates(root: Path, stem: str, kind: str, given: Any) -> list[Path]:
    """Where the ``kind`` ("image" / "text") features of split file ``stem`` may be: the path
    ``given`` (absolute, or relative to ``root``) alone, else per-split then shared names."""
    if given is not None:
        path = Path(os.path.expanduser(str(given)))
        return [path if path.is_absolute() else root / path]
    return [root / f"{stem}_{kind}_features.safetensors", root / f"{stem}_{kind}_features.npz",
            root / f"{kind}_features.safetensors", root / f"{kind}_features.npz"]


def _image_key(images: FeatureFile, name: str) -> str | None:
    """The key of image file ``name`` in ``images``: the name itself, else the name without ``.png``."""
    return next((k for k in (name, name[:-len(".png")]) if k in images.keys), None)


def attach_features(examples: list[Example], images: FeatureFile, texts: FeatureFile,
                    skip_missing: bool, json_path: Path) -> tuple[list[Example], list[str]]:
    """Examples with their image keys resolved; those lacking a feature are dropped (``skip_missing``)
    or counted in one ``FormatError`` that shows the first five. Returns ``(kept, skipped identifiers)``."""
    kept, lacking = [], []
    for ex in examples:
        names = image_names(ex.identifier)
        keys = tuple(_image_key(images, name) for name in names)
        absent = [f"image {name!r} in {images.path}" for name, k in zip(names, keys) if k is None]
        if ex.identifier not in texts.keys:
            absent.append(f"text {ex.identifier!r} in {texts.path}")
        if absent:
            lacking.append((ex, absent))
        else:
            kept.append(replace(ex, images=keys))
    if lacking and not skip_missing:
        shown = "\n".join(f"  {ex.identifier} ({json_path.name} line {ex.line}): no key {'; no key '.join(a)}"
                          for ex, a in lacking[:5])
        raise FormatError(f"{TASK}: {len(lacking)} of {len(examples)} examples of {json_path} have no features "
                          f"(image keys tried: <pair>-imgK.png, then <pair>-imgK):\n{shown}"
                          f"{chr(10) + '  ...' if len(lacking) > 5 else ''}\n"
                          f"Pass skip_missing=True to drop them, or add their features.")
    return kept, [ex.identifier for ex, _ in lacking]


# ----------------------------------------------------------------------------- dataset


class NLVR2FeatureDataset(Dataset):
    """NLVR2 examples with precomputed features → ``({"x": [2n, d_img (+1)], "condition": [m, d_txt]}, label)``.

    ``examples``: the kept :class:`Example` records (identifier, sentence, label, JSON line);
    ``skipped``: identifiers dropped by ``skip_missing``; ``image_tokens``: ``n``.
    """

    def __init__(self, examples: list[Example], images: FeatureFile, texts: FeatureFile, *, image_dim: int,
                 text_dim: int, image_tokens: int, side_column: bool, skipped: Sequence[str] = ()) -> None:
        self.examples, self.images, self.texts = examples, images, texts
        self.image_dim, self.text_dim, self.image_tokens = image_dim, text_dim, image_tokens
        self.side_column, self.skipped = side_column, list(skipped)

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def targets(self) -> Tensor:
        """The class label of every item (declared: ``data.max_samples`` draws a stratified subset)."""
        return torch.tensor([ex.label for ex in self.examples], dtype=torch.long)

    def image(self, key: str) -> Tensor:
        """One image's tokens ``[n, d_img]``."""
        return checked_tokens(self.images.get(key), self.images, key, self.image_dim, self.image_tokens)

    def sentence(self, identifier: str) -> Tensor:
        """One sentence's tokens ``[m, d_txt]``."""
        return checked_tokens(self.texts.get(identifier), self.texts, identifier, self.text_dim)

    def __getitem__(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        ex = self.examples[index]
        left, right = (self.image(k) for k in ex.images)
        x = torch.cat([left, right])  # [2n, d_img]: left image's tokens, then the right's
        if self.side_column:
            side = torch.zeros(2 * self.image_tokens, 1)
            side[self.image_tokens:] = 1.0  # 0 = left (img0), 1 = right (img1)
            x = torch.cat([x, side], 1)  # [2n, d_img + 1]
        return {"x": x, "condition": self.sentence(ex.identifier)}, torch.tensor(ex.label, dtype=torch.long)


def collate(batch: Sequence[tuple[dict[str, Tensor], Tensor]]) -> tuple[dict[str, Tensor], Tensor]:
    """Stack ``x`` → ``[B, 2n, d_img (+1)]``; right-pad ``condition`` with zero rows → ``[B, max m, d_txt]``;
    labels → ``[B]``."""
    conds = [b[0]["condition"] for b in batch]
    cond = conds[0].new_zeros(len(conds), max(c.shape[0] for c in conds), conds[0].shape[1])
    for row, c in zip(cond, conds):
        row[: c.shape[0]] = c
    x = torch.stack([b[0]["x"] for b in batch])
    return {"x": x, "condition": cond}, torch.stack([b[1] for b in batch])


def check_widths(first: Example, images: FeatureFile, texts: FeatureFile, image_dim: int, text_dim: int,
                 side_column: bool) -> int:
    """The number ``n`` of tokens per image, read from the first example; widths other than
    ``image_dim`` / ``text_dim`` raise an error that says which settings to change."""
    img, txt = images.get(first.images[0]), texts.get(first.identifier)
    if img.ndim != 2:
        checked_tokens(img, images, first.images[0], image_dim)  # raises, naming the shape found
    if txt.ndim != 2:
        checked_tokens(txt, texts, first.identifier, text_dim)
    if (img.shape[1], txt.shape[1]) != (image_dim, text_dim):
        raise UserError(
            f"{TASK}: the features are {img.shape[1]} (image, {images.path}) and {txt.shape[1]} (text, "
            f"{texts.path}) wide, but image_dim={image_dim}, text_dim={text_dim}. Set "
            f"data.params.image_dim={img.shape[1]} data.params.text_dim={txt.shape[1]} (the model's input "
            f"layers follow the task's description)")
    return int(img.shape[0])


def build_nlvr2_features(split: str, root: Any = None, image_features: Any = None, text_features: Any = None,
                         image_dim: int = CLIP_B32_IMAGE_DIM, text_dim: int = CLIP_B32_TEXT_DIM,
                         side_column: bool = True, skip_missing: bool = False) -> NLVR2FeatureDataset:
    """The NLVR2 examples of ``split`` (train; val/dev; test/test1; test2) with their features.

    ``image_features`` / ``text_features``: feature files (absolute or relative to ``root``); by
    default ``<stem>_{image,text}_features.{safetensors,npz}`` then ``{image,text}_features.*``.
    ``image_dim`` / ``text_dim``: the features' widths (checked). ``side_column``: append the
    left/right column to ``x``. ``skip_missing``: drop examples without features instead of failing.
    """
    path = require_root(TASK, root, LAYOUT)
    stem = SPLIT_FILES[split]
    json_path = find_file(path, f"{stem}.json", [path / f"{stem}.json", path / "data" / f"{stem}.json"])
    examples = read_examples(json_path)
    images = FeatureFile(find_file(path, "image features", feature_candidates(path, stem, "image", image_features)))
    texts = FeatureFile(find_file(path, "text features", feature_candidates(path, stem, "text", text_features)))
    kept, skipped = attach_features(examples, images, texts, skip_missing, json_path)
    if not kept:
        raise FormatError(f"{TASK}: none of the {len(examples)} examples of {json_path} has features")
    n = check_widths(kept[0], images, texts, image_dim, text_dim, side_column)
    return NLVR2FeatureDataset(kept, images, texts, image_dim=image_dim, text_dim=text_dim, image_tokens=n,
                               side_column=bool(side_column), skipped=skipped)


register_task(TaskInfo(
    name=TASK, kind="loader",
    description=("NLVR2 from precomputed (e.g. CLIP) token features for a conditional NAC (NAC 4.4 / App. G): "
                 "{'x': both images' tokens [2n, image_dim + 1 side column], 'condition': sentence tokens "
                 "[m, text_dim], zero-padded per batch}; 2 classes. Defaults: CLIP ViT-B/32 widths 768 / 512; "
                 "other widths: set data.params.image_dim/text_dim (the model follows)"),
    describe=describe, class_names=("False", "True"),
    splits=tuple(SPLIT_FILES),
    params={"root": None, "image_features": None, "text_features": None, "image_dim": CLIP_B32_IMAGE_DIM,
            "text_dim": CLIP_B32_TEXT_DIM, "side_column": True, "skip_missing": False},
    param_bounds={"image_dim": INT_COUNT, "text_dim": INT_COUNT},
    collate=collate,
), build_nlvr2_features)
