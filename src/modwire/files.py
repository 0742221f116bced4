"""The one way modwire writes a file: nothing half-written is ever seen, a full disk is a clear error.

* :func:`atomic_write` / :func:`atomic_write_text`: write a temporary file next to the target, flush
  and fsync it, rename it over the target (``os.replace``), fsync the directory. A kill at any moment
  leaves the old file or the new one, never a mix; a failure removes the temporary file.
* :func:`append_line`: one record appended to a log (``metrics.jsonl``, ``resumes.jsonl``, a study's
  results log); a failed append (disk full) cuts the file back to its previous length, so no torn
  line is left behind.
* :func:`write_error`: any failed write (``ENOSPC``, ``EDQUOT``, ``EROFS``, ...) as one sentence naming
  the file, what is free and that what was written before is kept; the ``modwire`` command prints it
  on one line and exits 1.
* :func:`read_lines`: a log's lines; a torn last line (a kill mid-append on a file system that does
  not cut it back) is dropped with a warning.

Files are created with ``open``, so their permissions follow the user's umask (``tempfile.mkstemp``
would make them 0600). A full disk (``ENOSPC``, ``EDQUOT``) raises :class:`DiskFullError`, naming the
path, the bytes it needed and the bytes free.
"""
from __future__ import annotations

import errno
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable

FULL = (errno.ENOSPC, errno.EDQUOT)


class WriteError(OSError):
    """A write failed; the message names the file and says what was kept."""


class DiskFullError(WriteError):
    """A write failed for lack of space; what was on disk before is intact."""


def space_note(path: str | os.PathLike, needed: int | None) -> str:
    """``no space left to write PATH: it needs about N bytes, F bytes free on its file system``."""
    try:
        free = f"{shutil.disk_usage(Path(path).parent).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    need = f"needs about {needed:,} bytes, " if needed else "has "
    return f"no space left to write {path}: it {need}{free} on its file system"


def disk_full(path: str | os.PathLike, needed: int | None, cause: BaseException) -> DiskFullError:
    """A :class:`DiskFullError` for ``path``: what it needed, what is free, what is kept."""
    error = DiskFullError(f"{space_note(path, needed)}; the previous version is kept. Free some space (or "
                          f"choose another out_dir) and run again")
    error.errno = getattr(cause, "errno", None) or errno.ENOSPC   # (no filename: str() stays the message)
    return error


def is_disk_full(e: BaseException) -> bool:
    """An OSError for lack of space, or a library error that says so (safetensors' writer)."""
    return getattr(e, "errno", None) in FULL or "No space left" in str(e) or "Disk quota" in str(e)


WRITE_ERRORS = (*FULL, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG)


def write_error(e: OSError) -> str | None:
    """The sentence for a failed write, or a file the system would not let modwire read or write
    (``EACCES``, ``EPERM``, ``EIO``); None for any other OSError (a missing file is the user's path,
    reported elsewhere). A :class:`WriteError` already says it all."""
    if isinstance(e, WriteError):
        return str(e)                   # modwire's own (a checkpoint, a full disk, the run directory)
    if getattr(e, "errno", None) not in WRITE_ERRORS:
        return None
    where = e.filename or "a file"
    if e.errno in FULL:
        return (f"{space_note(where, None)}; the files written before are kept (each is replaced whole or not "
                f"at all). Free some space (or choose another output directory) and run again")
    # EACCES / EPERM / EIO may come from a read too: say what the system said, about which file
    verb = "cannot write" if e.errno in (errno.EROFS, errno.EFBIG) else "cannot access"
    return f"{verb} {where}: {e.strerror or e}; the files modwire wrote before are kept"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give a file the permissions ``open`` would have (``0o666`` less the umask): some writers
    (safetensors) create their files 0600."""
    os.chmod(path, 0o666 & ~umask())


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, needed: int | None = None) -> Path:
    """Write ``path`` through ``write(tmp)`` (which creates ``tmp``), fsync, rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        follow_umask(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full(path, needed, e) from None
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    data = text.encode()
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), needed=len(data))


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` and a newline; on failure cut the file back to where it was. Unbuffered
    (``os.write``): a buffered file would retry the failed write when it is cut back or closed."""
    path, data = Path(path), (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written == 0:            # a short write that makes no progress: the disk is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                view = view[written:]
        except BaseException as e:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            if is_disk_full(e):
                raise disk_full(path, len(data), e) from None
            raise
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The complete lines of a log. A last line without its newline was torn by a kill during an
    append: dropped, with a warning naming the file."""
    text = Path(path).read_text()
    lines = text.split("\n")
    if lines[-1]:
        warnings.warn(f"{path}: its last line was cut off (a write interrupted by a kill or a full disk); "
                      f"dropped: {lines[-1][:80]!r}", stacklevel=2)
    return [line for line in lines[:-1] if line]
