"""Check a dataset's files before training: ``check_dataset(task, split, params) -> DataCheckReport``.

A run that meets an undecodable image (an HTML page saved as ``.jpg``, a truncated JPEG, a
git-lfs pointer) stops mid-epoch, or with ``data.bad_samples: skip`` drops it
(:class:`~modwire.tasks.base.SkipBadSamples`). This pre-scan finds every such file at once:

* loaders that read one image file per item (``image_folder``, ``tiny_imagenet``,
  ``tiny_imagenet_r``, ``imagenet``, ``oxford_pet``, ``mnist_m``, and the MNIST-M part of
  ``digits_multitask``) declare their files (``image_files()``); each file is opened with
  Pillow and, in the default ``mode="decode"``, fully decoded and converted to RGB, as training
  does (a truncated JPEG is only found by decoding it); ``mode="verify"`` runs Pillow's
  ``verify()`` instead: the header and, for PNG, the chunk checksums, without decoding the pixel
  data: several times faster, but a truncated JPEG passes. Files are checked by ``workers``
  threads (Pillow decodes without holding the GIL).
* every other dataset (in-memory arrays, ``.npz`` per item, text) is checked by reading each
  of its items as training would (``mode="items"``, chosen automatically): an item that raises
  is listed with the error.

Building the split may warn (placeholders left out, validation rows of unknown classes
skipped, a class folder alone): the report keeps those warnings. A split that cannot be built
at all raises its :class:`~modwire.errors.UserError` as building it for training would.
"""
from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from torch.utils.data import Dataset, Subset

from ..errors import UserError
from ..fields import check_argument
from .base import BadSampleError, build_dataset, item_path

MODES = ("decode", "verify", "items")
#: How each mode reads a file or item, in words (the report's summary).
MODE_WORDS = {"decode": "fully decoded with Pillow", "verify": "checked with Pillow's verify() (no pixel decoding)",
              "items": "read item by item as training does"}


@dataclass(frozen=True)
class BadFile:
    """One unreadable file (or item): ``index`` of its item in the split (None: not known), ``path``
    (``""`` for an item without a file of its own) and ``reason`` in words."""

    index: int | None
    path: str
    reason: str


@dataclass
class DataCheckReport:
    """What :func:`check_dataset` found. ``mode``: how files were read (:data:`MODES`);
    ``checked``: files (``items`` mode: items) read; ``items``: items in the split; ``bad``: every
    unreadable file; ``warnings``: what building the split warned; ``seconds``: the scan's time.
    ``ok`` / ``exit_code`` (0 ok, 1 bad files) / :meth:`summary` / :meth:`to_dict`."""

    task: str
    split: str
    mode: str
    checked: int
    items: int
    bad: list[BadFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.bad

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def summary(self, limit: int = 20) -> str:
        """A printable report: one headline, then up to ``limit`` bad files (``0``: all) with their
        reasons, then the warnings of building the split."""
        what = "items" if self.mode == "items" else "image files"
        head = (f"task {self.task!r}, split {self.split!r}: {self.checked:,} {what} {MODE_WORDS[self.mode]} "
                f"in {self.seconds:.1f} s: ")
        head += ("all readable" if self.ok else
                 f"{len(self.bad):,} unreadable (a run stops at the first one; data.bad_samples: skip drops them)")
        lines = [head]
        shown = self.bad if not limit else self.bad[:limit]
        for b in shown:
            where = b.path or f"item {b.index}"
            lines.append(f"  {where}: {b.reason}")
        if len(shown) < len(self.bad):
            lines.append(f"  ... and {len(self.bad) - len(shown):,} more")
        if self.warnings:
            lines.append("warnings while building the split:")
            lines += [f"  {w}" for w in self.warnings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON): the fields, ``bad`` as a list of dicts, and ``ok``."""
        out = asdict(self)
        out["ok"] = self.ok
        return out


def check_dataset(task: str, split: str, params: Mapping[str, Any] | None = None, *, mode: str = "decode",
                  workers: int | None = None, progress: Callable[[int, int], None] | None = None) -> DataCheckReport:
    """Open every file of ``split`` of ``task`` (built with ``params``, e.g. ``cfg.data.params``) and list
    each one that cannot be read, with why (module docstring). ``mode``: ``"decode"`` (default: a full
    decode, as training), ``"verify"`` (Pillow's structural check only, faster) or ``"items"`` (read
    every item through the dataset); a dataset without image files is always read item by item.
    ``workers``: threads for image files (default ``min(8, CPUs)``). ``progress(done, total)`` is
    called now and then. Raises the split's own error when it cannot be built."""
    check_argument("mode", mode, MODES, "check_dataset")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UserError(f"check_dataset: workers must be an int >= 1, got {workers!r}")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = build_dataset(task, split, **dict(params or {}))
    said = list(dict.fromkeys(str(w.message) for w in caught))
    files = None if mode == "items" else image_files(dataset)
    if files is None:
        mode = "items"
        bad, checked = _check_items(dataset, progress), len(dataset)
    else:
        bad, checked = _check_files(files, mode, workers or min(8, os.cpu_count() or 1), progress), len(files)
    return DataCheckReport(task, split, mode, checked, len(dataset), bad, said, time.perf_counter() - start)


def image_files(dataset: Dataset) -> list[tuple[int, Path]] | None:
    """``(item index, image file)`` of every item of ``dataset`` that reads one, through ``Subset`` views,
    wrappers keeping a ``dataset`` attribute and multi-part datasets (``parts``, ``ends``: the digits
    multi-task); None when none of its items reads an image file."""
    own = getattr(type(dataset), "image_files", None)
    if callable(own):
        return list(enumerate(dataset.image_files()))
    if isinstance(dataset, Subset):
        inner = image_files(dataset.dataset)
        if inner is None:
            return None
        where = {i: p for i, p in inner}
        return [(k, where[i]) for k, i in enumerate(dataset.indices) if i in where]
    parts, ends = getattr(dataset, "parts", None), getattr(dataset, "ends", None)
    if isinstance(parts, list) and isinstance(ends, list) and len(parts) == len(ends):
        out: list[tuple[int, Path]] = []
        for k, (_, part) in enumerate(parts):
            inner = image_files(part)
            offset = ends[k - 1] if k else 0
            out += [(offset + i, p) for i, p in inner or ()]
        return out or None
    inner = getattr(dataset, "__dict__", {}).get("dataset")
    return image_files(inner) if isinstance(inner, Dataset) else None


def check_image(path: Path, mode: str = "decode") -> str | None:
    """Why the image file ``path`` cannot be read (:func:`~.loaders._common.image_problem`), or None.
    ``decode``: open, decode, convert to RGB (what training does); ``verify``: Pillow's ``verify()``."""
    from PIL import Image

    from .loaders._common import image_problem

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # e.g. DecompressionBombWarning, EXIF warnings
            with Image.open(path) as im:
                if mode == "verify":
                    im.verify()
                else:
                    im.convert("RGB")
    except Exception as exc:  # UnidentifiedImageError, a truncated file, a missing file, ...
        return image_problem(Path(path), exc)
    return None


def _check_files(files: list[tuple[int, Path]], mode: str, workers: int,
                 progress: Callable[[int, int], None] | None) -> list[BadFile]:
    bad: list[BadFile] = []
    total = len(files)
    step = max(1, min(1000, total // 100))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done, ((index, path), problem) in enumerate(
                zip(files, pool.map(lambda f: check_image(f[1], mode), files, chunksize=64)), 1):
            if problem is not None:
                bad.append(BadFile(index, str(path), problem))
            if progress is not None and (done % step == 0 or done == total):
                progress(done, total)
    return bad


def _check_items(dataset: Dataset, progress: Callable[[int, int], None] | None) -> list[BadFile]:
    bad: list[BadFile] = []
    total = len(dataset)
    step = max(1, min(1000, total // 100))
    for i in range(total):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dataset[i]
        except BadSampleError as exc:
            path = exc.path if exc.path is not None else item_path(dataset, i)
            bad.append(BadFile(i, "" if path is None else str(path), exc.reason or str(exc).split("\n")[0]))
        except Exception as exc:  # any other failure of one item: listed, the scan goes on
            path = item_path(dataset, i)
            bad.append(BadFile(i, "" if path is None else str(path),
                               f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
        if progress is not None and ((i + 1) % step == 0 or i + 1 == total):
            progress(i + 1, total)
    return bad
