"""Oxford-IIIT Pet (Parkhi et al. 2012; AiT §5.1, App. A.1) from its official on-disk layout.

37 breeds of cats and dogs. The split lists ``annotations/trainval.txt`` (split ``train``, 3,680
images) and ``annotations/test.txt`` (split ``test``, 3,669 images) hold one line per image,
``<Image> <CLASS-ID> <SPECIES> <BREED-ID>`` (CLASS-ID 1..37, SPECIES 1 cat / 2 dog, BREED-ID
1..25 among cats / 1..12 among dogs; lines starting with ``#`` are comments); the image is
``images/<Image>.jpg``. The label is ``CLASS-ID - 1``; the class names are the breed part of the
image names (``great_pyrenees_100`` → ``great_pyrenees``; capitalised names are cats).

Decoding reuses :func:`~modwire.tasks.loaders.images.load_rgb` (Pillow, the ``images`` extra): a
few of the official files are grayscale, RGBA (PNG data under a ``.jpg`` name) or CMYK, and all
are converted to RGB. Items: ``(float [3, image_size, image_size] in [0, 1], long label)``, not
normalised (the training pipeline does it; ``data.augment: resized_crop_flip`` is AiT App. A.1).

Size (AiT App. A.1: "We utilized random resized cropping with size 256×256×3 and resized all
images to size 224×224×3"): the two numbers cannot both be the model's input, which is 224×224
(16×16 patches, AiT Table 6). We read "resized all images to 224×224" literally: every image is
stretched to ``image_size`` × ``image_size`` (default 224, ``resize="stretch"``, the whole photo
kept, aspect ratio not); ``resize="center_crop"`` keeps the aspect ratio and drops the sides
instead. Training then takes a random resized crop of that image back to ``image_size``
(:func:`~modwire.tasks.augment.resized_crop_flip_transform`); evaluation uses the resized image
as it is. The paper's 256 is not used.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ..base import TaskInfo, register_task
from ._common import first_existing, list_files, malformed, missing, read_text_file, report_placeholders, require_root
from .images import RESIZED_BOUNDS, RESIZED_CHOICES, ImageListDataset, _pil, _resized_rgb

TASK = "oxford_pet"
NUM_CLASSES = 37
SPLIT_FILES = {"train": "trainval.txt", "test": "test.txt"}
LAYOUT = """\
<root>/                          (the folder oxford-iiit-pet/, or its parent)
  images/<Image>.jpg             the photos, e.g. images/Abyssinian_1.jpg, images/great_pyrenees_100.jpg
  annotations/trainval.txt       split "train": lines "<Image> <CLASS-ID> <SPECIES> <BREED-ID>", e.g.
                                 "Abyssinian_100 1 1 1" (CLASS-ID 1..37, SPECIES 1 cat / 2 dog; '#' lines: comments)
  annotations/test.txt           split "test", same format"""


def read_split_list(path: Path) -> list[tuple[str, int]]:
    """``(image name, label = CLASS-ID - 1)`` for each line of a split list, in file order."""
    entries = []
    for n, line in enumerate(read_text_file(TASK, path, LAYOUT).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 4:
            raise malformed(TASK, path, f"line {n} has {len(fields)} fields, expected 4 "
                                        f"(<Image> <CLASS-ID> <SPECIES> <BREED-ID>): {line!r}", LAYOUT)
        try:
            class_id, species, _ = (int(v) for v in fields[1:])
        except ValueError:
            raise malformed(TASK, path, f"line {n}: CLASS-ID, SPECIES and BREED-ID must be integers: {line!r}",
                            LAYOUT) from None
        if not 1 <= class_id <= NUM_CLASSES or species not in (1, 2):
            raise malformed(TASK, path, f"line {n}: CLASS-ID must lie in 1..{NUM_CLASSES} and SPECIES be 1 (cat) "
                                        f"or 2 (dog), got {class_id} and {species}: {line!r}", LAYOUT)
        entries.append((fields[0], class_id - 1))
    if not entries:
        raise malformed(TASK, path, "no image lines in it", LAYOUT)
    return entries


def class_names(entries: list[tuple[str, int]], path: Path) -> list[str]:
    """The 37 breed names (label order) read off the image names; a label with two names is refused,
    a label absent from ``entries`` is named ``class_<CLASS-ID>``."""
    names: dict[int, str] = {}
    for image, label in entries:
        breed = image.rsplit("_", 1)[0]
        if names.setdefault(label, breed) != breed:
            raise malformed(TASK, path, f"CLASS-ID {label + 1} is given to images of two breeds, "
                                        f"{names[label]!r} and {breed!r} (image {image!r})", LAYOUT)
    return [names.get(k, f"class_{k + 1}") for k in range(NUM_CLASSES)]


def _locate(root: Any, split: str) -> tuple[Path, Path]:
    """``(split list, images folder)`` under ``root`` or ``root/oxford-iiit-pet``."""
    path = require_root(TASK, root, LAYOUT)
    name = SPLIT_FILES[split]
    listing = first_existing(TASK, f"split list annotations/{name} for split {split!r}",
                             [path / "annotations" / name, path / "oxford-iiit-pet" / "annotations" / name],
                             LAYOUT, path)
    base = listing.parent.parent
    if not (base / "images").is_dir():
        raise missing(TASK, f"no images/ folder next to {listing.parent}", LAYOUT, base)
    return listing, base / "images"


def build_oxford_pet(split: str, root: Any = None, image_size: int = 224, resize: str = "stretch",
                     transform: Callable | None = None) -> ImageListDataset:
    """Split ``train`` (``trainval.txt``) or ``test`` (``test.txt``); images brought to ``image_size``
    by ``resize`` (module docstring). Every listed image must be in ``images/``."""
    listing, images = _locate(root, split)
    entries = read_split_list(listing)
    present = set(os.listdir(images))
    absent = [f"{image}.jpg" for image, _ in entries if f"{image}.jpg" not in present]
    listed = {f"{image}.jpg" for image, _ in entries}
    _, found = list_files(images, listed.__contains__)       # git-lfs / git-annex placeholders of listed images
    report_placeholders(TASK, found, len(listed), images, LAYOUT)   # all: an error; some: a warning
    held = {p.name for paths in found.values() for p in paths}
    entries = [(image, label) for image, label in entries if f"{image}.jpg" not in held]
    if absent:
        raise missing(TASK, f"{len(absent)} of the {len(entries)} images listed in annotations/{listing.name} are "
                            f"not in images/ (e.g. {absent[:3]}): an incomplete copy?", LAYOUT, images)
    _pil()  # a missing Pillow fails here, naming the extra to install, not in the first batch
    samples = [(images / f"{image}.jpg", label) for image, label in entries]
    return ImageListDataset(samples, class_names(entries, listing), image_size, resize, transform, task=TASK,
                            layout=LAYOUT)


register_task(TaskInfo(
    name=TASK, kind="loader",
    description=("Oxford-IIIT Pet (37 breeds) from images/*.jpg and annotations/trainval.txt (split train) / "
                 "test.txt (split test); RGB in [0,1], stretched to image_size (default 224, AiT App. A.1)"),
    describe=_resized_rgb(NUM_CLASSES), splits=("train", "test"),
    params={"root": None, "image_size": 224, "resize": "stretch", "transform": None},
    param_bounds=RESIZED_BOUNDS, param_choices=RESIZED_CHOICES,
), build_oxford_pet)
