"""MNIST-M (Ganin & Lempitsky 2015): MNIST digits blended onto colour photo patches.

There is no official archive in a binary array format; this loader reads the layout of the
authors' ``mnist_m.tar.gz`` (image folders + a label list per split):

    <root>/mnist_m_train/00000000.png ...      28×28 RGB PNG images
    <root>/mnist_m_train_labels.txt            lines "<file name> <label 0-9>"
    <root>/mnist_m_test/... and mnist_m_test_labels.txt

Items: ``(float [3, S, S] in [0, 1], long)`` with the 28×28 image resized bilinearly to
``size`` (default 32, NI App. C.1: every digit dataset "up-sampled to 32×32"). The label
list is checked when the split is built (a bad line names the file and line); an image is
decoded (Pillow) when its item is read, so a missing or broken image names its file then.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import DIGIT_CLASSES, InputSpec, MissingSampleError, TaskInfo, register_task
from ._common import LoaderDataset, bad_sample, first_existing, image_problem, malformed, read_text_file, require_root
from .mnist import upsample
from ...errors import UserError
from ...fields import INT_COUNT

LAYOUT = """\
<root>/                          (the folder mnist_m/ of the authors' mnist_m.tar.gz, or its parent)
  mnist_m_train/                 28x28 RGB images (PNG)
  mnist_m_train_labels.txt       one line per image: "<file name> <label 0-9>", e.g. "00000000.png 5"
  mnist_m_test/                  (split "test")
  mnist_m_test_labels.txt"""


def read_label_list(path: Path, task: str = "mnist_m") -> list[tuple[str, int]]:
    """``[(file name, label)]`` from a ``"<name> <label>"`` list; a bad line names file and line."""
    out = []
    for n, line in enumerate(read_text_file(task, path, LAYOUT).splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or not 0 <= int(parts[1]) <= 9 or "/" in parts[0]:
            raise malformed(task, path, f"line {n}: expected '<file name> <label 0-9>', got {line.strip()!r}", LAYOUT)
        out.append((parts[0], int(parts[1])))
    return out


class MnistMDataset(LoaderDataset):
    """Images of ``folder`` named by the label list → ``(float [3, size, size] in [0, 1], long)``."""

    def __init__(self, folder: Path, entries: list[tuple[str, int]], size: int = 32,
                 transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.folder, self.files, self.size = folder, [name for name, _ in entries], size
        self.labels = torch.tensor([label for _, label in entries], dtype=torch.long)

    @property
    def targets(self) -> Tensor:
        """One class label per item: the declared way (:func:`~modwire.tasks.base.class_targets`)."""
        return self.labels

    def __len__(self) -> int:
        return len(self.files)

    def sample_path(self, index: int) -> Path:
        """The image file of item ``index``."""
        return self.folder / self.files[index]

    def image_files(self) -> list[Path]:
        """Every image file, in item order (``modwire.tasks.check.check_dataset`` opens them)."""
        return [self.folder / name for name in self.files]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        from PIL import Image

        path = self.folder / self.files[index]
        try:
            with Image.open(path) as im:
                rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)              # [H, W, 3]
        except Exception as exc:  # missing, an HTML page, a truncated PNG: a BadSampleError naming the file
            if not path.exists() and not path.is_symlink():
                problem = "listed in the labels file but missing"
                raise MissingSampleError(f"mnist_m: image {path} is {problem}", path=path, reason=problem,
                                         task="mnist_m") from None
            raise bad_sample("mnist_m", path, image_problem(path, exc), LAYOUT) from None
        x = torch.from_numpy(rgb.copy()).permute(2, 0, 1).float().div_(255.0)   # [3, H, W]
        return self._out(upsample(x, self.size), self.labels[index])


def build_mnist_m(split: str, root: Any = None, size: int = 32, transform: Callable | None = None) -> MnistMDataset:
    """MNIST-M ``train`` (59,001 in the authors' archive) / ``test`` (9,001), resized to ``size``."""
    if split not in ("train", "test"):
        raise UserError(f"mnist_m: split must be 'train' or 'test', got {split!r}")
    path = require_root("mnist_m", root, LAYOUT)
    labels = first_existing("mnist_m", f"label list mnist_m_{split}_labels.txt",
                            [path / f"mnist_m_{split}_labels.txt", path / "mnist_m" / f"mnist_m_{split}_labels.txt"],
                            LAYOUT, path)
    folder = first_existing("mnist_m", f"image folder mnist_m_{split}/", [labels.parent / f"mnist_m_{split}"],
                            LAYOUT, path, directory=True)
    return MnistMDataset(folder, read_label_list(labels), size, transform)


register_task(TaskInfo(
    name="mnist_m", kind="loader",
    description="MNIST-M (authors' mnist_m.tar.gz layout: image folders + label lists), RGB resized 28->32",
    describe=lambda p: (InputSpec.image(3, p["size"], p["size"]), 10), splits=("train", "test"),
    params={"root": None, "size": 32, "transform": None}, param_bounds={"size": INT_COUNT}, class_names=DIGIT_CLASSES,
), build_mnist_m)
