"""Procedurally Generated Matrices (PGM, Barrett et al. 2018) from the official ``.npz`` files.

Input: float ``[16, S, S]`` in [0, 1] (``image`` uint8 / 255, reshaped to 16 panels of
160×160: 0-7 the context of the 3×3 matrix in reading order, 8-15 the candidate answers),
each panel area-downsampled (the mean over each source pixel's share) to ``S =
panel_size``: 80 by default, NI §4.3's "a panel being an 80 × 80 image"; ``panel_size=160``
keeps the files' resolution. Target: the index 0-7 of the right candidate. ``meta_target``
(the multi-hot rule encoding) is not part of the item; read it with
:meth:`PGMDataset.meta_target`.

Input description (``TaskInfo.inputs``): an image with the 16 panels as 16 channels,
``InputSpec.image(16, S, S)``. NAC and Perceiver IO read it with the conv tokenizer (S a
multiple of 8; 10×10 = 100 tokens at 80), which mixes context and candidate panels from the
first layer, like the CNN baselines of the PGM paper; NI / ViT (NI §4.3, App. D) embed each
panel with a shallow CNN and score each candidate with the 8 context panels ("panels"
embedding), reading the channels 0-7 as context and 8-15 as candidates. For one token per
panel through a tokenizer, pass ``flatten=True``: the input ``[16, S·S]`` is described as an
ordered sequence of 16 vectors, read by a linear map of each flattened panel plus a learned
position that tells the 8 context panels from the 8 candidates.

Files are read with ``numpy.load(allow_pickle=False)``: nothing in them is unpickled.
"""
from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import BadSampleError, InputSpec, TaskInfo, register_task
from ._common import FormatError, LoaderDataset, malformed, malformed_reason, missing, require_root, text_problem
from ...fields import Bounds

PANELS, SIZE = 16, 160          # the files: 16 panels of 160×160
DEFAULT_PANEL_SIZE = 80         # NI §4.3: "a panel being an 80 × 80 image"

LAYOUT = """\
<root>/                        (the regime's folder, e.g. neutral/, or its parent)
  PGM_<regime>_<split>_<i>.npz  split: train, val or test; i: 0, 1, 2, ...
     image        uint8, 16*160*160 values (reshaped to [16, 160, 160]; panels 0-7 context, 8-15 candidates)
     target       the right candidate, 0-7
     meta_target  multi-hot rule encoding"""


class PGMDataset(LoaderDataset):
    """``PGM_*.npz`` files read on access → ``(float [16, S, S] in [0, 1], long target)``, the
    panels area-downsampled from 160 to ``S = panel_size``."""

    def __init__(self, files: list[Path], flatten: bool = False, transform: Callable | None = None,
                 panel_size: int = SIZE) -> None:
        super().__init__(transform)
        self.files, self.flatten, self.panel_size = files, flatten, panel_size

    def __len__(self) -> int:
        return len(self.files)

    def _load(self, index: int) -> dict[str, np.ndarray]:
        path = self.files[index]
        with open(path, "rb") as f:
            head = f.read(64)
        if not head.startswith(b"PK\x03\x04"):
            raise malformed("pgm", path, text_problem(head, "a .npz (zip) archive")
                            or "not a readable .npz (zip) archive", LAYOUT)
        try:
            with np.load(path, allow_pickle=False) as z:
                missing_keys = [k for k in ("image", "target") if k not in z.files]
                if missing_keys:
                    raise malformed("pgm", path, f"no array(s) {missing_keys} (has {z.files})", LAYOUT)
                return {k: z[k] for k in z.files}
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise malformed("pgm", path, f"not a readable .npz ({type(exc).__name__}: {exc})", LAYOUT) from None
        except FormatError:
            raise
        except ValueError as exc:
            raise malformed("pgm", path, f"unreadable array ({exc})", LAYOUT) from None

    def meta_target(self, index: int) -> Tensor:
        return torch.from_numpy(np.asarray(self._load(index).get("meta_target", np.zeros(0))).copy())

    def sample_path(self, index: int) -> Path:
        """The ``.npz`` file of item ``index``."""
        return self.files[index]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        try:
            return self._item(index)
        except FormatError as exc:      # one unreadable file: a BadSampleError (data.bad_samples: skip drops it)
            raise BadSampleError(str(exc), path=self.files[index], reason=malformed_reason(exc), task="pgm") from None

    def _item(self, index: int) -> tuple[Tensor, Tensor]:
        d, path = self._load(index), self.files[index]
        image, target = d["image"], np.asarray(d["target"]).reshape(-1)
        if image.size != PANELS * SIZE * SIZE:
            raise malformed("pgm", path, f"'image' has {image.size} values, expected 16*160*160 = "
                                         f"{PANELS * SIZE * SIZE}", LAYOUT)
        if image.dtype == np.uint8:
            x = torch.from_numpy(image.reshape(PANELS, SIZE, SIZE).copy()).float().div_(255.0)
        elif np.issubdtype(image.dtype, np.floating):
            x = torch.from_numpy(image.reshape(PANELS, SIZE, SIZE).astype(np.float32))
        else:
            raise malformed("pgm", path, f"'image' must be uint8, got {image.dtype}", LAYOUT)
        if target.size != 1 or not np.issubdtype(target.dtype, np.integer) or not 0 <= int(target[0]) <= 7:
            raise malformed("pgm", path, f"'target' must be one integer 0-7, got {target.tolist()[:8]}", LAYOUT)
        if self.panel_size != SIZE:          # area: each output pixel is the mean of the pixels it covers
            x = F.interpolate(x[None], size=(self.panel_size,) * 2, mode="area")[0]   # [16, S, S]
        if self.flatten:
            x = x.reshape(PANELS, self.panel_size ** 2)
        return self._out(x, torch.tensor(int(target[0]), dtype=torch.long))


def build_pgm(split: str, root: Any = None, regime: str = "neutral", flatten: bool = False,
              transform: Callable | None = None, panel_size: int = DEFAULT_PANEL_SIZE) -> PGMDataset:
    """The ``PGM_<regime>_<split>_*.npz`` files of ``root`` (or ``root/<regime>/``), ordered by ``i``;
    panels downsampled to ``panel_size``."""
    root_path = require_root("pgm", root, LAYOUT)
    pattern = re.compile(rf"^PGM_{re.escape(regime)}_{split}_(\d+)\.npz$")
    searched = [p for p in (root_path / regime, root_path) if p.is_dir()]
    found = []
    for path in searched:  # the regime's folder first; the first folder holding the files is used
        with os.scandir(path) as it:
            found = [(int(m.group(1)), path / e.name) for e in it if (m := pattern.match(e.name))]
        if found:
            break
    if not found:
        tried = "\n".join(f"  {p}/PGM_{regime}_{split}_<i>.npz" for p in (root_path / regime, root_path))
        raise missing("pgm", f"no files PGM_{regime}_{split}_<i>.npz (regime={regime!r}); tried:\n{tried}", LAYOUT,
                      searched[0])
    return PGMDataset([p for _, p in sorted(found)], flatten, transform, panel_size)


def _describe(params: dict) -> tuple[InputSpec, int]:
    """16 panels as the channels of one ``[16, S, S]`` image, or (``flatten``) a sequence of 16
    flattened panels ``[16, S·S]`` whose order (context 0-7, candidates 8-15) matters; 8 answers."""
    s = params["panel_size"]
    if params["flatten"]:
        return InputSpec.vectors(PANELS, s * s, ordered=True), 8
    return InputSpec.image(PANELS, s, s), 8


register_task(TaskInfo(
    name="pgm", kind="loader",
    description="PGM matrices [16, S, S] in [0,1] (8 context + 8 candidate panels as channels), panels "
                "area-downsampled 160 -> panel_size (default 80, NI §4.3)",
    describe=_describe, splits=("train", "val", "test"),
    params={"root": None, "regime": "neutral", "flatten": False, "transform": None,
            "panel_size": DEFAULT_PANEL_SIZE},
    param_bounds={"panel_size": Bounds(lo=1, hi=SIZE, integer=True,
                                       note=f"the files' panels are {SIZE}x{SIZE}; NI uses 80")},
), build_pgm)
