"""One writer per run directory.

A run holds ``fcntl.flock`` on ``<run>/.lock`` (pid and host written inside) for as long
as it writes the directory. A directory the lock created and the run never wrote into (a config
refused once the data was read) is removed on release. A second run on the same directory fails at once with
:class:`RunLockedError` naming the holder. The kernel releases the lock when its process
dies, however it dies (SIGKILL included), so a ``.lock`` file left behind by a dead run
never blocks the next one. (``flock`` is advisory and local to one machine; on network
file systems that do not support it, two hosts are not kept apart.)
"""
from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from ..files import WriteError

LOCK_FILE = ".lock"


class RunLockedError(RuntimeError):
    """Another live process is writing this run directory."""


class RunLock:
    """``with RunLock(run_dir): ...`` — exclusive, non-blocking, released on exit or death."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run = Path(run_dir)
        self.path = self.run / LOCK_FILE
        self._fd: int | None = None
        self._created = False                       # the lock made the run directory (release may remove it)

    def acquire(self) -> "RunLock":
        import fcntl

        try:
            self._created = not self.run.exists()
            self.run.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            error = WriteError(f"cannot write the run directory {self.run}: {e.strerror or e} "
                               f"({e.filename or self.path})")
            error.errno = e.errno
            raise error from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise
            raise RunLockedError(f"run directory {self.run} is in use by another run ({self._holder()}); "
                                 f"wait for it to finish, stop it, or choose another out_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def _holder(self) -> str:
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        return text or "holder unknown"

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            if self._created and os.listdir(self.run) == [LOCK_FILE]:   # a run refused before it wrote
                self.path.unlink()                                       # anything leaves no directory
                self.run.rmdir()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
