"""Any image-classification dataset stored as class folders (task ``image_folder``).

For example CIFAR-10 distributed as PNG/JPEG folders trains with one command::

    modwire train configs/cpu/nac_fashion_mnist.yaml --set data.task=image_folder \
        --set data.params.root=data/cifar10 --set data.val_split=test

The classes are the sub-folders of ``train/`` (sorted by name: class ``i`` is the
``i``-th name); every held-out folder present must hold the same class folders, else
the error lists the differences. Images of any size and mode (RGB, grayscale, palette,
RGBA) are decoded with Pillow (the ``images`` extra, imported on first use), converted
to RGB and brought to ``image_size`` × ``image_size`` (:func:`~.images.load_rgb`:
shorter side scaled, centre crop; or ``resize="stretch"``); ``channels=1`` then takes
the luma ``0.299 R + 0.587 G + 0.114 B`` (ITU-R 601-2, as Pillow's ``"L"`` mode).
Items: ``(float [channels, image_size, image_size] in [0, 1], long label)``.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import (FormatError, found_listing, layout_message, list_files, missing,
                      report_placeholders, require_root)
from .images import RESIZED_BOUNDS, RESIZED_CHOICES, LabelledFiles, _pil, class_dirs, decode_rgb
from ...fields import Choices

TASK = "image_folder"
SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
# The folders each split reads, in order of preference: "val" falls back to a test/ folder
# (datasets such as CIFAR-10 ship only train/ and test/); "test" means test/ only.
SPLIT_FOLDERS = {"train": ("train",), "val": ("val", "valid", "validation", "test"), "test": ("test",)}
HELD_OUT = ("val", "valid", "validation", "test")
LUMA = (0.299, 0.587, 0.114)

LAYOUT = """\
<root>/
  train/<class>/*.jpg|jpeg|png|bmp|gif|webp|tif|tiff   one folder per class; classes = sorted folder names
  val/<class>/...    (or valid/, validation/; split "val" falls back to test/)
  test/<class>/...   the same class folders in every split"""


def split_folder(path: Path, split: str) -> Path:
    """The folder that holds ``split``, or an error listing every folder tried."""
    tried = [path / name for name in SPLIT_FOLDERS[split]]
    found = next((p for p in tried if p.is_dir()), None)
    if found is None:
        raise missing(TASK, f"no folder for split {split!r}; tried {', '.join(map(str, tried))}", LAYOUT, path)
    return found


def class_names(path: Path) -> list[str]:
    """The class folders of ``train/``, checked to be the same in every held-out folder present."""
    train = split_folder(path, "train")
    classes = class_dirs(train)
    if not classes:
        raise missing(TASK, "no class folders in train/", LAYOUT, train)
    for name in HELD_OUT:
        if not (path / name).is_dir():
            continue
        other = class_dirs(path / name)
        if other != classes:
            only_train, only_other = sorted(set(classes) - set(other)), sorted(set(other) - set(classes))
            raise FormatError(layout_message(
                TASK, f"the class folders of {name}/ differ from those of train/: only in train/: {only_train}; "
                      f"only in {name}/: {only_other}", LAYOUT, found_listing(path / name)))
    return classes


class ImageFolderDataset(LabelledFiles):
    """``(path, label)`` pairs decoded on access into ``(float [channels, size, size], long)``."""

    def __init__(self, samples: list[tuple[Path, int]], classes: list[str], size: int, channels: int,
                 resize: str = "center_crop", transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.samples, self.classes, self.size, self.channels, self.resize = samples, classes, size, channels, resize

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        path, label = self.samples[index]
        # an HTML page saved as .jpg, a truncated file, a git-lfs pointer: a BadSampleError naming it
        x = decode_rgb(path, self.size, self.resize, TASK, LAYOUT, lead="not an image Pillow can decode")  # [3, S, S]
        if self.channels == 1:
            x = torch.einsum("c,chw->hw", torch.tensor(LUMA), x)[None]      # [1, S, S]
        return self._out(x, torch.tensor(label, dtype=torch.long))


def build_image_folder(split: str, root: Any = None, image_size: int = 32, channels: int = 3,
                       resize: str = "center_crop", transform: Callable | None = None) -> ImageFolderDataset:
    """The images of ``split`` (see the module docstring for the layout and the conversions)."""
    path = require_root(TASK, root, LAYOUT)
    classes = class_names(path)
    if len(classes) == 1:
        warnings.warn(f"{TASK}: {path / 'train'} holds one class folder only, {classes[0]!r}: every label is 0, "
                      f"so there is nothing to classify (put one folder per class under train/)", stacklevel=2)
    folder = split_folder(path, split)
    samples, empty, placeholders, total = [], [], {}, 0
    for label, name in enumerate(classes):
        files, held = list_files(folder / name, lambda n: Path(n).suffix.lower() in SUFFIXES)
        for kind, paths in held.items():
            placeholders.setdefault(kind, []).extend(paths)
        total += len(files) + sum(map(len, held.values()))
        empty += [name] * (not files)
        samples += [(p, label) for p in files]
    report_placeholders(TASK, placeholders, total, folder, LAYOUT)
    if not samples or (split == "train" and empty):
        what = "no images" if not samples else f"no images in the class folders {empty[:10]}"
        raise missing(TASK, f"{what} under {folder.name}/ (suffixes {', '.join(SUFFIXES)})", LAYOUT, folder)
    _pil()  # a missing Pillow fails here, naming the extra to install, not in the first batch
    return ImageFolderDataset(samples, classes, image_size, channels, resize, transform)


def describe(params: dict) -> tuple[InputSpec, int]:
    """``[channels, image_size, image_size]`` images; the class count is that of the folders."""
    classes = class_names(require_root(TASK, params["root"], LAYOUT))
    return InputSpec.image(params["channels"], params["image_size"], params["image_size"]), len(classes)


register_task(TaskInfo(
    name=TASK, kind="loader",
    description=("Any image classification folders <root>/train/<class>/*.jpg|png|..., <root>/val/<class>/ or "
                 "test/<class>/; resized to image_size (default 32), RGB or grayscale (channels 3 or 1); "
                 "classes = the folder names"),
    inputs=InputSpec.image(3, 32, 32), describe=describe,  # class count: from the folders (root)
    splits=("train", "val", "test"),
    params={"root": None, "image_size": 32, "channels": 3, "resize": "center_crop", "transform": None},
    param_bounds=RESIZED_BOUNDS,
    param_choices={**RESIZED_CHOICES, "channels": Choices((1, 3), note="1: grayscale, 3: RGB")},
), build_image_folder)
