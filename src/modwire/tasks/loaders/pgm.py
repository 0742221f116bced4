"""Procedurally Generated Matrices (PGM, Barrett et al. 2018) from the official ``.npz`` files.

Input: float ``[16, 160, 160]`` in [0, 1] (``image`` uint8 / 255, reshaped to 16
panels: 0-7 the context of the 3×3 matrix in reading order, 8-15 the candidate
answers); target: the index 0-7 of the right candidate. ``meta_target`` (the
multi-hot rule encoding) is not part of the item; read it with
:meth:`PGMDataset.meta_target`.

Input description (``TaskInfo.inputs``): an image with the 16 panels as 16 channels,
``InputSpec.image(16, 160, 160)``, which NAC and Perceiver IO read with the conv tokenizer
(160 is a multiple of 8; 20×20 = 400 tokens). It mixes context and candidate panels
from the first layer, like the CNN baselines of the PGM paper. For one token per panel
instead, pass ``flatten=True``: the input ``[16, 25600]`` is described as an ordered
sequence of 16 vectors, read by a linear map of each flattened panel plus a learned
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
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import FormatError, LoaderDataset, malformed, missing, require_root, text_problem

PANELS, SIZE = 16, 160

LAYOUT = """\
<root>/                        (the regime's folder, e.g. neutral/, or its parent)
  PGM_<regime>_<split>_<i>.npz  split: train, val or test; i: 0, 1, 2, ...
     image        uint8, 16*160*160 values (reshaped to [16, 160, 160]; panels 0-7 context, 8-15 candidates)
     target       the right candidate, 0-7
     meta_target  multi-hot rule encoding"""


class PGMDataset(LoaderDataset):
    """``PGM_*.npz`` files read on access → ``(float [16, 160, 160] in [0, 1], long target)``."""

    def __init__(self, files: list[Path], flatten: bool = False, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.files, self.flatten = files, flatten

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

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
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
        if self.flatten:
            x = x.reshape(PANELS, SIZE * SIZE)
        return self._out(x, torch.tensor(int(target[0]), dtype=torch.long))


def build_pgm(split: str, root: Any = None, regime: str = "neutral", flatten: bool = False,
              transform: Callable | None = None) -> PGMDataset:
    """The ``PGM_<regime>_<split>_*.npz`` files of ``root`` (or ``root/<regime>/``), ordered by ``i``."""
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
    return PGMDataset([p for _, p in sorted(found)], flatten, transform)


def _describe(params: dict) -> tuple[InputSpec, int]:
    """16 panels as the channels of one ``[16, 160, 160]`` image, or (``flatten``) a sequence of 16
    flattened panels ``[16, 25600]`` whose order (context 0-7, candidates 8-15) matters; 8 answers."""
    if params["flatten"]:
        return InputSpec.vectors(PANELS, SIZE * SIZE, ordered=True), 8
    return InputSpec.image(PANELS, SIZE, SIZE), 8


register_task(TaskInfo(
    name="pgm", kind="loader",
    description="PGM matrices [16, 160, 160] in [0,1] (8 context + 8 candidate panels as channels)",
    describe=_describe,
    splits=("train", "val", "test"), params={"root": None, "regime": "neutral", "flatten": False, "transform": None},
), build_pgm)
