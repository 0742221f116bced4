"""Helpers shared by the loaders: locating ``root``, errors that show the expected layout.

Every loader takes ``root`` (no default download location: nothing is ever
downloaded). The one default root is where a system package installs a dataset
(:func:`system_dataset`: Debian's ``dataset-*`` packages write ``/usr/share/datasets/<name>``);
the environment variable ``MODWIRE_SYSTEM_DATASETS`` moves that directory (the test suite
points it at an empty one, so no test can read a dataset installed on the machine). A missing or malformed dataset raises ``FileNotFoundError`` or
``ValueError`` whose message holds the expected directory layout as a small tree and
what was actually found. When a file may be in several places, :func:`first_existing`
tries them in order and its error lists every path tried. A file that should be
binary (idx, pickle, npz, image) but is empty, text or an HTML page (a failed
download saved under the dataset's name) is named as such by :func:`not_binary`.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import Tensor
from torch.utils.data import Dataset

from ..base import BadSampleError
from ...errors import UserError, UserTypeError


SYSTEM_DATASETS_ENV = "MODWIRE_SYSTEM_DATASETS"
SYSTEM_DATASETS = "/usr/share/datasets"


def system_dataset(name: str) -> Path:
    """Where a system package installs dataset ``name``: ``$MODWIRE_SYSTEM_DATASETS/<name>``, by default
    ``/usr/share/datasets/<name>`` (read at each call, so a change of the variable takes effect at once)."""
    return Path(os.environ.get(SYSTEM_DATASETS_ENV) or SYSTEM_DATASETS) / name


def found_listing(path: Path | None, limit: int = 12) -> str:
    """A short description of what is at ``path`` (for error messages)."""
    if path is None:
        return "no root given"
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is a file, not a directory"
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:  # pragma: no cover - permissions
        return f"{path} cannot be listed ({exc})"
    if not entries:
        return f"{path} is empty"
    names = [e.name + ("/" if e.is_dir() else "") for e in entries[:limit]]
    more = f" ... ({len(entries) - limit} more)" if len(entries) > limit else ""
    return f"{path} contains: {', '.join(names)}{more}"


def layout_message(task: str, problem: str, layout: str, found: str) -> str:
    return (f"{task}: {problem}\n"
            f"Expected layout (nothing is downloaded; get the dataset yourself and pass root=...):\n"
            f"{layout.rstrip()}\n"
            f"Found: {found}")


class LayoutError(FileNotFoundError):
    """A dataset directory or file is missing (message shows the expected layout)."""


class FormatError(UserError):
    """A dataset file exists but is malformed (message shows the expected format)."""


def missing(task: str, problem: str, layout: str, where: Path | None) -> LayoutError:
    return LayoutError(layout_message(task, problem, layout, found_listing(where)))


def malformed(task: str, path: Path | str, problem: str, layout: str) -> FormatError:
    try:
        found = f"{path} ({os.path.getsize(path)} bytes)"
    except OSError:
        found = str(path)
    return FormatError(layout_message(task, f"malformed file {path}: {problem}", layout, found))


def malformed_reason(exc: BaseException) -> str:
    """The problem a :func:`malformed` error states (its first line after ``malformed file <path>: ``)."""
    first = str(exc).split("\n")[0]
    marker = ": malformed file "
    return first.split(marker, 1)[1].split(": ", 1)[-1] if marker in first else first


def require_root(task: str, root: Any, layout: str) -> Path:
    """``root`` as an existing directory, or an error that explains the expected layout."""
    if root is None:
        raise UserError(layout_message(
            task, "the parameter root=... is required: the directory that holds the dataset",
            layout, "root=None"))
    path = Path(os.path.expanduser(str(root)))
    if not path.is_dir():
        absolute = "" if path.is_absolute() else f" (relative to the working directory: {path.absolute()})"
        raise missing(task, f"root {str(path)!r} is not a directory{absolute}", layout, path)
    return path


def first_dir(*candidates: Path) -> Path | None:
    return next((c for c in candidates if c.is_dir()), None)


def first_existing(task: str, what: str, candidates: Sequence[Path], layout: str, where: Path | None, *,
                   directory: bool = False) -> Path:
    """The first of ``candidates`` that is a file (a directory with ``directory=True``), or a
    ``LayoutError`` that lists every path tried, in order."""
    for c in candidates:
        if (c.is_dir() if directory else c.is_file()):
            return c
    tried = "\n".join(f"  {c}" for c in candidates)
    raise missing(task, f"no {what}; tried:\n{tried}", layout, where)


# ----------------------------------------------------------------------------- text where binary was expected

HTML_STARTS = (b"<!doctype", b"<html", b"<head", b"<body", b"<?xml", b"<meta", b"<title")


def looks_like_text(head: bytes) -> bool:
    """UTF-8 without control characters (a multi-byte character cut at the end is allowed)."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return False
    return not any(b < 32 and b not in b"\t\r\n" for b in head)


def text_problem(head: bytes, what: str) -> str | None:
    """Why the first bytes ``head`` of a file are not ``what`` (binary data) when they are empty
    or text; ``None`` when they look binary."""
    if not head:
        return f"the file is empty, not {what}"
    if not looks_like_text(head):
        return None
    start = head.lstrip()[:40].decode("utf-8", "replace").split("\n")[0]
    if head.lstrip()[:9].lower().startswith(HTML_STARTS):
        return (f"a text file, not {what}: it looks like an HTML page (starts with {start!r}): "
                f"a failed download?")
    return f"a text file, not {what} (it starts with {start!r})"


def not_binary(path: Path, what: str) -> str | None:
    """:func:`text_problem` of the file at ``path`` (reads its first 64 bytes)."""
    with open(path, "rb") as f:
        return text_problem(f.read(64), what)


def check_binary(task: str, path: Path, what: str, layout: str) -> None:
    """Raise a ``FormatError`` if ``path`` is empty, text or an HTML page instead of ``what``."""
    problem = not_binary(path, what)
    if problem is not None:
        raise malformed(task, path, problem, layout)


def read_text_file(task: str, path: Path, layout: str) -> str:
    """The UTF-8 text of ``path`` without a leading byte-order mark (some editors on Windows write
    one; it would become part of the first word or header), or a ``FormatError`` naming the file
    and the first bad byte."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise malformed(task, path, f"not UTF-8 text ({exc.reason} at byte {exc.start})", layout) from None


# ----------------------------------------------------------------------------- unreadable items, placeholders


def bad_sample(task: str, path: Path | str, problem: str, layout: str) -> BadSampleError:
    """The :class:`~modwire.tasks.base.BadSampleError` of one item's file (the message of
    :func:`malformed`; ``path`` and ``reason`` kept as attributes)."""
    message = str(malformed(task, path, problem, layout))
    return BadSampleError(message, path=Path(path), reason=problem, task=task)


def image_problem(path: Path, exc: BaseException | None = None) -> str:
    """Why the image file ``path`` cannot be decoded, in words: missing, a dangling link, a git-lfs /
    git-annex placeholder, empty, text or an HTML page, else Pillow's own reason ``exc``."""
    kind = placeholder_kind(path)
    if kind is not None:
        return f"a {kind} placeholder of content that was never fetched: {PLACEHOLDER_FETCH[kind]}"
    if not path.exists():
        return "the file does not exist"
    try:
        problem = not_binary(path, "an image")
    except OSError as err:
        return f"cannot be read ({err})"
    if problem is not None:
        return problem
    return f"not an image Pillow can decode ({exc})" if exc is not None else "not an image Pillow can decode"


#: How to fetch the content of a placeholder, by kind.
PLACEHOLDER_FETCH = {"git-lfs": "run `git lfs pull` in the dataset's repository",
                     "git-annex": "run `git annex get .` in the dataset's repository",
                     "dangling-link": "restore what the links point to (a git-annex copy: `git annex get .`)"}
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
PLACEHOLDER_MAX_BYTES = 1024      # pointer files are ~130-250 bytes; no image this small is checked


def placeholder_kind(path: Path, size: int | None = None) -> str | None:
    """``"git-lfs"``, ``"git-annex"`` or ``"dangling-link"`` when ``path`` stands in for content that
    was not fetched: a git-lfs pointer file (it starts with ``version https://git-lfs...``), a
    git-annex pointer file or dangling symbolic link into ``.../annex/objects/``, any other dangling
    link; else None. ``size``: the file's size when known (only small files are opened)."""
    try:
        if path.is_symlink() and not path.exists():
            return "git-annex" if "/annex/objects/" in os.readlink(path) else "dangling-link"
        if size is None:
            size = path.stat().st_size
        if size > PLACEHOLDER_MAX_BYTES:
            return None
        with open(path, "rb") as f:
            head = f.read(PLACEHOLDER_MAX_BYTES)
    except OSError:
        return None
    if head.startswith(LFS_POINTER):
        return "git-lfs"
    if b"/annex/objects/" in head and looks_like_text(head):
        return "git-annex"
    return None


def list_files(folder: Path, keep: Callable[[str], bool]) -> tuple[list[Path], dict[str, list[Path]]]:
    """``(files, placeholders)``: the regular files of ``folder`` whose name ``keep`` accepts (sorted;
    hidden ``.*`` files skipped), and those of them that are git-lfs / git-annex placeholders
    (:func:`placeholder_kind`), by kind, left out of ``files``. A dangling link is a placeholder too."""
    files: list[Path] = []
    found: dict[str, list[Path]] = {}
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        if e.name.startswith(".") or not keep(e.name):
            continue
        path = Path(e.path)
        try:
            if e.is_file():
                kind = placeholder_kind(path, e.stat().st_size)
            elif e.is_symlink() and not path.exists():
                kind = placeholder_kind(path)
            else:
                continue
        except OSError:
            continue
        if kind is None:
            files.append(path)
        else:
            found.setdefault(kind, []).append(path)
    return files, found


def report_placeholders(task: str, placeholders: dict[str, list[Path]], total: int, where: Path | str,
                        layout: str, stacklevel: int = 3) -> None:
    """Say what the placeholders of :func:`list_files` are: a warning naming their kind, count, a few
    of them and how to fetch the content (they are left out of the dataset); a ``LayoutError`` when
    every one of the ``total`` files found is a placeholder."""
    count = sum(len(v) for v in placeholders.values())
    if not count:
        return
    parts = []
    for kind, paths in sorted(placeholders.items()):
        shown = ", ".join(str(p) for p in paths[:3]) + (f", ... ({len(paths) - 3} more)" if len(paths) > 3 else "")
        parts.append(f"{len(paths)} {kind} placeholder{'s' if len(paths) != 1 else ''} (e.g. {shown}): "
                     f"{PLACEHOLDER_FETCH[kind]}")
    what = "; ".join(parts)
    if count >= total:
        raise LayoutError(layout_message(
            task, f"all {total} image files under {where} are placeholders of content that was never fetched "
                  f"(a git-lfs or git-annex repository cloned without its data): {what}", layout,
            found_listing(Path(where))))
    warnings.warn(f"{task}: left out {count} of the {total} image files under {where}, placeholders of content "
                  f"that was never fetched: {what}", stacklevel=stacklevel)


def check_transform(transform: Any) -> Callable[[Tensor], Tensor] | None:
    if transform is not None and not callable(transform):
        raise UserTypeError(f"transform must be a callable on the input tensor or None, got {type(transform).__name__}")
    return transform


class LoaderDataset(Dataset):
    """Base of the loaders' datasets: ``len``, an optional ``transform`` on the input."""

    def __init__(self, transform: Callable[[Tensor], Tensor] | None = None) -> None:
        self.transform = check_transform(transform)

    def _out(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return (self.transform(x) if self.transform is not None else x), y
