"""Image folders: Tiny-ImageNet and ImageNet-R-style renditions mapped onto its classes.

Inputs are float tensors ``[3, H, W]`` with values in ``[0, 1]`` (RGB; grayscale or
palette images are converted to RGB). No mean/std normalisation is applied: that is
the trainer's or the augmentation's job (pass ``transform=``, a callable applied to
the tensor). Decoding needs Pillow (the ``images`` extra), imported on first use.

Class indices follow the order of the lines of ``wnids.txt`` (the file shipped with
Tiny-ImageNet), not the sorted order of the folder names. Some public copies ship a
``wnids.txt`` with more than 200 ids: the ids without a ``train/<wnid>/`` folder are
dropped with a warning that names them (the others keep their order), and a list
that still does not hold exactly 200 ids is refused (Tiny-ImageNet models have 200
outputs): never a silently different class count or order.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ..base import BadSampleError, InputSpec, TaskInfo, register_task
from ._common import (LoaderDataset, bad_sample, first_dir, first_existing, image_problem, list_files, malformed,
                      missing, read_text_file, report_placeholders, require_root)
from ...fields import INT_COUNT

TINY_CLASSES = 200
TINY_LAYOUT = """\
<root>/                        (the folder tiny-imagenet-200/, or its parent)
  wnids.txt                    one WordNet id per line; line i is class i (200 ids; ids without a
                               train/<wnid>/ folder are dropped with a warning)
  train/<wnid>/images/*.JPEG   64x64 images of class <wnid>
  val/images/*.JPEG
  val/val_annotations.txt      lines: <file>\\t<wnid>\\t<x0>\\t<y0>\\t<x1>\\t<y1>"""

R_LAYOUT = """\
<root>/                        (e.g. imagenet-r/)
  <wnid>/*.jpg|*.jpeg|*.png    one folder per class, named by its WordNet id
wnids=<path to Tiny-ImageNet wnids.txt> (labels = its line numbers; other folders are skipped)
  or wnids=None (labels = index of the folder in sorted order)"""

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
RESIZE_MODES = ("center_crop", "stretch")
#: The rules of the parameters every resizing image loader has (``TaskInfo.param_bounds`` / ``param_choices``).
RESIZED_BOUNDS = {"image_size": INT_COUNT}
RESIZED_CHOICES = {"resize": RESIZE_MODES}


def _pil():
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("image loaders need Pillow: pip install 'modwire[images]'") from exc
    return Image


def load_rgb(path: Path, size: int, resize: str = "center_crop") -> Tensor:
    """Decode ``path`` to a float ``[3, size, size]`` tensor in [0, 1].

    An image of another size is resized: ``center_crop`` scales the shorter side to
    ``size`` (bicubic, antialiased) and crops the centre; ``stretch`` scales both sides.
    """
    Image = _pil()
    with Image.open(path) as im:
        im = im.convert("RGB")
        if im.size != (size, size):
            if resize == "stretch":
                im = im.resize((size, size), Image.Resampling.BICUBIC)
            else:
                w, h = im.size
                s = size / min(w, h)
                nw, nh = max(size, round(w * s)), max(size, round(h * s))
                im = im.resize((nw, nh), Image.Resampling.BICUBIC)
                left, top = (nw - size) // 2, (nh - size) // 2
                im = im.crop((left, top, left + size, top + size))
        arr = np.array(im, dtype=np.uint8)  # [H, W, 3], a writable copy
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255.0)


class LabelledFiles(LoaderDataset):
    """A dataset whose items are image files with a class label, ``samples = [(path, label), …]``: its
    length, its declared ``targets``, and each item's file (for errors and ``modwire data check``)."""

    samples: list[tuple[Path, int]]

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def targets(self) -> Tensor:
        """The class label of every item (declared: ``data.max_samples`` draws a stratified subset)."""
        return torch.tensor([label for _, label in self.samples], dtype=torch.long)

    def sample_path(self, index: int) -> Path:
        """The image file of item ``index``."""
        return self.samples[index][0]

    def image_files(self) -> list[Path]:
        """Every image file, in item order (``modwire.tasks.check.check_dataset`` opens them)."""
        return [p for p, _ in self.samples]


class ImageListDataset(LabelledFiles):
    """``(path, label)`` pairs decoded on access into ``([3, size, size] float, long)``."""

    def __init__(self, samples: list[tuple[Path, int]], classes: list[str], size: int,
                 resize: str = "center_crop", transform: Callable | None = None, *, task: str = "images",
                 layout: str = "<root>/<class>/*.jpg|*.jpeg|*.png") -> None:
        super().__init__(transform)
        self.samples, self.classes, self.size, self.resize = samples, classes, size, resize
        self.task, self.layout = task, layout  # for the error of an unreadable image

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        path, label = self.samples[index]
        image = decode_rgb(path, self.size, self.resize, self.task, self.layout)
        return self._out(image, torch.tensor(label, dtype=torch.long))


def decode_rgb(path: Path, size: int, resize: str, task: str, layout: str, lead: str = "") -> Tensor:
    """:func:`load_rgb`, or a :class:`~modwire.tasks.base.BadSampleError` naming the file and why it
    cannot be decoded (an HTML page or a git-lfs pointer saved under an image name, a truncated
    file, ...; :func:`~._common.image_problem`, after ``lead``) instead of Pillow's traceback."""
    try:
        return load_rgb(path, size, resize)
    except BadSampleError:
        raise
    except Exception as exc:  # PIL's UnidentifiedImageError, a truncated file, a decompression bomb, ...
        problem = image_problem(path, exc)
        if lead and not problem.startswith(lead):
            problem = f"{lead}: {problem}"
        raise bad_sample(task, path, problem, layout) from None


def read_wnids(path: Path, task: str, layout: str) -> list[str]:
    """The WordNet ids of a ``wnids.txt`` (one per line), in file order; repeated ids are refused."""
    try:
        lines = path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        raise missing(task, f"class list {path.name} not found", layout, path.parent) from None
    except UnicodeDecodeError as exc:
        raise malformed(task, path, f"not text ({exc})", layout) from None
    if not lines:
        raise malformed(task, path, "no WordNet ids in it", layout)
    if len(set(lines)) != len(lines):
        dup = sorted({w for w in lines if lines.count(w) > 1})
        raise malformed(task, path, f"repeated WordNet ids {dup[:5]}", layout)
    return lines


def class_dirs(path: Path) -> list[str]:
    """The names of the sub-folders of ``path`` (hidden ``.*`` and ``__*`` ones skipped), sorted."""
    return sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def _image_name(suffixes: Sequence[str] = IMAGE_SUFFIXES) -> Callable[[str], bool]:
    return lambda name: Path(name).suffix.lower() in suffixes


def build_tiny_imagenet(split: str, root: Any = None, transform: Callable | None = None) -> ImageListDataset:
    """Tiny-ImageNet ``train`` (100,000 images) or ``val`` (10,000 images); 200 classes: those of
    ``wnids.txt`` (:func:`tiny_imagenet_classes`: ``train/`` folders of other ids are left out with a
    warning naming them). Validation rows of an id that is not a class are skipped with a warning
    that counts them; git-lfs / git-annex placeholders are left out with a warning
    (:func:`~._common.report_placeholders`)."""
    task = "tiny_imagenet"
    path = require_root(task, root, TINY_LAYOUT)
    path = first_existing(task, "class list wnids.txt", [path / "wnids.txt", path / "tiny-imagenet-200" / "wnids.txt"],
                          TINY_LAYOUT, path).parent
    wnids = tiny_imagenet_classes(path, task)
    index = {w: i for i, w in enumerate(wnids)}
    samples: list[tuple[Path, int]] = []
    placeholders: dict[str, list[Path]] = {}
    if split == "train":
        empty, total = [], 0
        for w in wnids:
            folder = path / "train" / w / "images"
            if not folder.is_dir():
                raise missing(task, f"no folder train/{w}/images for class {w} of wnids.txt", TINY_LAYOUT,
                              first_dir(path / "train" / w, path / "train", path))
            files, held = list_files(folder, _image_name())
            for kind, paths in held.items():
                placeholders.setdefault(kind, []).extend(paths)
            total += len(files) + sum(map(len, held.values()))
            empty += [w] * (not files)
            samples += [(p, index[w]) for p in files]
        report_placeholders(task, placeholders, total, path / "train", TINY_LAYOUT)
        if empty:
            only = " (only placeholders)" if placeholders else ""
            raise missing(task, f"no images in train/{empty[0]}/images{only}"
                                + (f" and {len(empty) - 1} other class folder(s)" if len(empty) > 1 else ""),
                          TINY_LAYOUT, path / "train" / empty[0] / "images")
    else:
        ann, images = path / "val" / "val_annotations.txt", path / "val" / "images"
        if not ann.is_file() or not images.is_dir():
            raise missing(task, "val/val_annotations.txt or val/images/ not found", TINY_LAYOUT,
                          first_dir(path / "val", path))
        files, placeholders = list_files(images, lambda name: True)
        present = {p.name for p in files}
        held = {p.name for paths in placeholders.values() for p in paths}
        report_placeholders(task, placeholders, len(files) + len(held), images, TINY_LAYOUT)
        unknown: dict[str, int] = {}
        rows = 0
        for n, line in enumerate(read_text_file(task, ann, TINY_LAYOUT).splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 2:
                raise malformed(task, ann, f"line {n} has no <TAB>-separated wnid: {line!r}", TINY_LAYOUT)
            rows += 1
            name, w = fields[0].strip(), fields[1].strip()
            if w not in index:
                unknown[w] = unknown.get(w, 0) + 1
                continue
            if name in held:
                continue                            # a placeholder: left out, with the warning above
            if name not in present:
                raise missing(task, f"val/images/{name} (line {n} of val_annotations.txt) not found",
                              TINY_LAYOUT, images)
            samples.append((images / name, index[w]))
        skipped = ""
        if unknown:
            count = sum(unknown.values())
            named = sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{w} ({k} row{'s' if k != 1 else ''})" for w, k in named[:10])
            shown += f", ... ({len(named) - 10} more ids)" if len(named) > 10 else ""
            skipped = (f"{count} of the {rows} rows of {ann} name a wnid that is not one of the {len(wnids)} "
                       f"classes of {path / 'wnids.txt'}: {shown}")
        if not samples:
            raise malformed(task, ann, f"no annotations of a class of wnids.txt{'; ' + skipped if skipped else ''}",
                            TINY_LAYOUT)
        if skipped:
            warnings.warn(f"{task}: skipped {skipped}", stacklevel=2)
    return ImageListDataset(samples, wnids, 64, transform=transform, task=task, layout=TINY_LAYOUT)


def tiny_imagenet_classes(path: Path, task: str = "tiny_imagenet") -> list[str]:
    """The 200 class ids of the Tiny-ImageNet folder ``path``: the lines of ``wnids.txt`` that have a
    ``train/<wnid>/`` folder, in file order (the others are dropped with a warning naming them; without
    a ``train/`` folder nothing can be checked and none is dropped). Folders of ``train/`` whose name
    is not in ``wnids.txt`` are left out with a warning naming them. Not 200: a ``FormatError``
    (more than 200: it names the ids that have no validation row, the likely extras)."""
    file = path / "wnids.txt"
    wnids = read_wnids(file, task, TINY_LAYOUT)
    if (path / "train").is_dir():
        dropped = [w for w in wnids if not (path / "train" / w).is_dir()]
        if dropped:
            shown = ", ".join(dropped[:10]) + (f", ... ({len(dropped) - 10} more)" if len(dropped) > 10 else "")
            warnings.warn(f"{task}: dropped {len(dropped)} of the {len(wnids)} ids of {file} that have no "
                          f"train/<wnid>/ folder: {shown}", stacklevel=3)
            wnids = [w for w in wnids if w not in set(dropped)]
        listed = set(wnids)
        extra = [f for f in class_dirs(path / "train") if f not in listed]
        if extra:
            shown = ", ".join(extra[:10]) + (f", ... ({len(extra) - 10} more)" if len(extra) > 10 else "")
            warnings.warn(f"{task}: ignored {len(extra)} folder{'s' if len(extra) != 1 else ''} of {path / 'train'} "
                          f"that {'are' if len(extra) != 1 else 'is'} not a class of {file}: {shown}", stacklevel=3)
    if len(wnids) != TINY_CLASSES:
        kept = " with a train/<wnid>/ folder" if (path / "train").is_dir() else ""
        hint = _without_val_rows(path, wnids) if len(wnids) > TINY_CLASSES else ""
        raise malformed(task, file, f"{len(wnids)} WordNet ids{kept}, expected {TINY_CLASSES} (Tiny-ImageNet's "
                                    f"classes; a model for this task has {TINY_CLASSES} outputs){hint}", TINY_LAYOUT)
    return wnids


def _without_val_rows(path: Path, wnids: list[str]) -> str:
    """``"; the ids without a validation row ..."``: the likely extras of a list of more than 200 ids."""
    ann = path / "val" / "val_annotations.txt"
    try:
        seen = {line.split("\t")[1].strip() for line in ann.read_text(encoding="utf-8-sig").splitlines()
                if line.count("\t") >= 1}
    except (OSError, UnicodeDecodeError):
        return ""
    lone = [w for w in wnids if w not in seen]
    if not seen or not lone:
        return ""
    shown = ", ".join(lone[:10]) + (f", ... ({len(lone) - 10} more)" if len(lone) > 10 else "")
    return (f"; {len(lone)} of them have no row in {ann} (the extras? remove them from wnids.txt and "
            f"train/): {shown}")


def build_tiny_imagenet_r(split: str, root: Any = None, wnids: Any = None, image_size: int = 64,
                          resize: str = "center_crop", transform: Callable | None = None) -> ImageListDataset:
    """ImageNet-R-style folders ``<root>/<wnid>/*`` as an evaluation set for Tiny-ImageNet models.

    ``wnids``: a path to Tiny-ImageNet's ``wnids.txt`` (read as :func:`tiny_imagenet_classes` does,
    so the labels match a model trained on that folder) or a sequence of wnids; labels are
    positions in it and folders of other classes are skipped (ImageNet-R and
    Tiny-ImageNet share only some classes). ``None``: the folders themselves, sorted,
    are the classes. Images are resized to ``image_size`` (see :func:`load_rgb`).
    """
    task = "tiny_imagenet_r"
    path = require_root(task, root, R_LAYOUT)
    folders = class_dirs(path)
    if wnids is None:
        classes = folders
    elif isinstance(wnids, (str, Path)):
        classes = tiny_imagenet_classes(Path(wnids).parent, task)  # the same 200 ids, in the same order, as training
    else:
        classes = [str(w) for w in wnids]
    return ImageListDataset(_folder_samples(task, path, folders, classes, R_LAYOUT), classes, image_size, resize,
                            transform, task=task, layout=R_LAYOUT)


def _folder_samples(task: str, path: Path, folders: list[str], classes: list[str], layout: str) -> list:
    """``(image path, label)`` for the images in ``path/<wnid>/`` of every folder named in ``classes``."""
    index = {w: i for i, w in enumerate(classes)}
    used = [f for f in folders if f in index]
    if not used:
        raise missing(task, f"no class folder named by one of the {len(classes)} wnids "
                            f"(e.g. {classes[:3]})" if classes else "no class folders", layout, path)
    samples, placeholders, total = [], {}, 0
    for w in used:
        files, held = list_files(path / w, _image_name())
        for kind, paths in held.items():
            placeholders.setdefault(kind, []).extend(paths)
        total += len(files) + sum(map(len, held.values()))
        samples += [(p, index[w]) for p in files]
    report_placeholders(task, placeholders, total, path, layout, stacklevel=4)
    if not samples:
        raise missing(task, "no .jpg/.jpeg/.png images in the class folders", layout, path / used[0])
    return samples


IMAGENET_LAYOUT = """\
<root>/                        (ILSVRC-2012 in the usual class-folder layout)
  train/<wnid>/*.JPEG          one folder per class (1000); classes = sorted folder names
  val/<wnid>/*.JPEG            validation images sorted into the same class folders"""


def build_imagenet(split: str, root: Any = None, image_size: int = 224, resize: str = "center_crop",
                   transform: Callable | None = None) -> ImageListDataset:
    """ImageNet (NAC Table 5) from class folders. Images are decoded and brought to
    ``image_size`` (shorter side, centre crop) at load time; random-resized-crop
    augmentation then works on that ``image_size`` image."""
    task = "imagenet"
    path = require_root(task, root, IMAGENET_LAYOUT)
    if not (path / "train").is_dir():
        raise missing(task, "no train/ folder", IMAGENET_LAYOUT, path)
    classes = sorted(p.name for p in (path / "train").iterdir() if p.is_dir() and not p.name.startswith("."))
    if not (path / split).is_dir():
        raise missing(task, f"no {split}/ folder", IMAGENET_LAYOUT, path)
    folders = sorted(p.name for p in (path / split).iterdir() if p.is_dir())
    return ImageListDataset(_folder_samples(task, path / split, folders, classes, IMAGENET_LAYOUT), classes,
                            image_size, resize, transform, task=task, layout=IMAGENET_LAYOUT)


def _resized_rgb(num_classes: int):
    """The description of a task whose RGB images are brought to ``params["image_size"]``."""
    def describe(params: dict) -> tuple[InputSpec, int]:
        return InputSpec.image(3, params["image_size"], params["image_size"]), num_classes
    return describe


register_task(TaskInfo(
    name="tiny_imagenet", kind="loader",
    description="Tiny-ImageNet (200 classes, 64x64 RGB in [0,1], not normalised) from the official folder layout",
    num_classes=200, inputs=InputSpec.image(3, 64, 64),
    metrics=("top1", "top5"), splits=("train", "val"), params={"root": None, "transform": None},
), build_tiny_imagenet)

register_task(TaskInfo(
    name="tiny_imagenet_r", kind="loader",
    description="ImageNet-R-style renditions <root>/<wnid>/*.jpg on Tiny-ImageNet class indices, resized to 64x64",
    describe=_resized_rgb(200),
    metrics=("top1", "top5"), splits=("test",),
    params={"root": None, "wnids": None, "image_size": 64, "resize": "center_crop", "transform": None},
    param_bounds=RESIZED_BOUNDS, param_choices=RESIZED_CHOICES,
), build_tiny_imagenet_r)

register_task(TaskInfo(
    name="imagenet", kind="loader",
    description="ImageNet-1k (NAC Table 5) from train/<wnid>/ and val/<wnid>/ class folders, at 224x224",
    describe=_resized_rgb(1000),
    metrics=("top1", "top5"), splits=("train", "val"),
    params={"root": None, "image_size": 224, "resize": "center_crop", "transform": None},
    param_bounds=RESIZED_BOUNDS, param_choices=RESIZED_CHOICES,
), build_imagenet)
