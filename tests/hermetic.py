"""The hermetic test run: no test reads data from outside the repository and its own temporary directory.

A pytest plugin (the suite's ``conftest.py`` imports its hooks; ``python -m pytest -p hermetic``
loads it anywhere). For the whole run it

* points every default data root at an empty directory: ``$MODWIRE_SYSTEM_DATASETS`` (where a
  loader with a default root looks, e.g. Fashion-MNIST's Debian path), and the caches a library
  could read data or weights from (``XDG_CACHE_HOME``, ``TORCH_HOME``, ``SCIKIT_LEARN_DATA``,
  ``HF_HOME``, ``MPLCONFIGDIR``); ``TMPDIR`` too, so nothing left in the temporary directory by an
  earlier run (a run directory, a compile cache) is found; and sets ``HF_HUB_OFFLINE=1``, so a
  Hub repo id is looked up in that (empty) cache alone, never online. Subprocesses inherit all of these;
* refuses, through an audit hook (:func:`sys.addaudithook`), any open or listing of a path under
  the machine's dataset directory or the user's data caches: the call raises :class:`HermeticError`
  and the test fails, even where the code under test catches the error;
* fails the run when it leaves new files in the repository (a run directory written to ``runs/``
  of the working copy is state that the next run may find).

The temporary directory is removed after a passing run and kept (its path printed) after a failing one.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from modwire.tasks.loaders import SYSTEM_DATASETS, SYSTEM_DATASETS_ENV

ROOT = Path(__file__).resolve().parents[1]
# where libraries keep downloaded data or weights in the user's home (read only by a non-hermetic test)
HOME_CACHES = (".cache", "scikit_learn_data", ".torch", ".keras")
# environment variables a loader or library honours for its data, each pointed into the run's directory
REDIRECTED = {"XDG_CACHE_HOME": "cache", "TORCH_HOME": "cache/torch", "SCIKIT_LEARN_DATA": "scikit_learn_data",
              "HF_HOME": "cache/huggingface", "MPLCONFIGDIR": "matplotlib", "TMPDIR": "tmp"}
# what a run may leave in the working copy: the install and the caches of the tools
ALLOWED_IN_REPO = {".git", ".venv", ".pytest_cache", "__pycache__", "build", "dist", ".whl", ".gl"}


class HermeticError(RuntimeError):
    """A test reached for data outside the repository and its temporary directory."""


class _State:
    base: Path | None = None            # the run's temporary directory
    forbidden: tuple[str, ...] = ()     # absolute path prefixes no test may open or list
    violations: list[str] = []          # what was refused, in order (a test's are reported with it)
    reported: int = 0                   # violations[:reported] are in a test's report already
    repo_files: set[str] = set()        # the working copy's files at the start


STATE = _State()


def forbidden_roots(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The machine's dataset directories and the user's data caches, as absolute path prefixes."""
    env = os.environ if environ is None else environ
    roots = {SYSTEM_DATASETS, env.get(SYSTEM_DATASETS_ENV, "") or SYSTEM_DATASETS}
    home = env.get("HOME") or os.path.expanduser("~")
    roots.update(os.path.join(home, name) for name in HOME_CACHES)
    roots.update(env[name] for name in REDIRECTED if env.get(name) and name != "TMPDIR")
    # never the repository or the interpreter's install, wherever they live
    needed = [os.path.abspath(p) + "/" for p in (ROOT, sys.prefix, sys.base_prefix)]
    prefixes = (os.path.abspath(r).rstrip("/") + "/" for r in roots if r)
    return tuple(sorted(r for r in prefixes if not any(n.startswith(r) for n in needed)))


def _path_of(arg) -> str | None:
    if isinstance(arg, int) or arg is None:
        return None                      # a file descriptor: opened (and checked) before
    try:
        path = os.fsdecode(os.fspath(arg))
    except TypeError:
        return None
    return os.path.abspath(path) + "/"      # "/" so that the root itself matches its prefix


def _audit(event: str, args: tuple) -> None:
    if event not in ("open", "os.listdir", "os.scandir") or not STATE.forbidden or not args:
        return
    path = _path_of(args[0])
    if path is None or not path.startswith(STATE.forbidden):
        return
    message = (f"hermetic test run: {event} {path.rstrip('/')!r} reads data from outside the repository and the "
               f"test's temporary directory (write a fixture in tmp_path instead; see tests/hermetic.py)")
    STATE.violations.append(message)
    raise HermeticError(message)


@contextmanager
def expect_violation() -> Iterator[list[str]]:
    """Within: a refused read is expected (the guard's own tests); yields the messages it caused."""
    start = len(STATE.violations)
    caught: list[str] = []
    try:
        yield caught
    finally:
        caught.extend(STATE.violations[start:])
        del STATE.violations[start:]
        STATE.reported = min(STATE.reported, start)


def _repo_files() -> set[str]:
    out = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in ALLOWED_IN_REPO and not d.endswith(".egg-info")]
        out.update(os.path.relpath(os.path.join(folder, f), ROOT) for f in files)
    return out


def pytest_configure(config) -> None:
    # the forbidden list is taken before the redirection, from the machine's own settings
    STATE.forbidden = forbidden_roots()
    base = Path(tempfile.mkdtemp(prefix="modwire-tests-"))
    STATE.base = base
    datasets = base / "system-datasets"       # empty: a loader's default root finds nothing
    datasets.mkdir()
    os.environ[SYSTEM_DATASETS_ENV] = str(datasets)
    for name, sub in REDIRECTED.items():
        (base / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(base / sub)
    os.environ["HF_HUB_OFFLINE"] = "1"      # read by huggingface_hub when imported, after this
    tempfile.tempdir = str(base / "tmp")
    STATE.repo_files = _repo_files()
    if not getattr(sys, "_modwire_hermetic_hook", False):   # an audit hook cannot be removed: add it once
        sys.addaudithook(_audit)
        sys._modwire_hermetic_hook = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fails the phase (setup, call, teardown) of a test that made a refused read, even when the code
    under test caught the error."""
    outcome = yield
    report = outcome.get_result()
    new, STATE.reported = STATE.violations[STATE.reported:], len(STATE.violations)
    if new and report.passed:
        report.outcome, report.longrepr = "failed", "\n".join(dict.fromkeys(new))


def pytest_sessionfinish(session, exitstatus) -> None:
    added = sorted(_repo_files() - STATE.repo_files)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda line: reporter.write_line(line, red=True)) if reporter else print
    if STATE.violations[STATE.reported:]:   # those outside a test (collection, a skipif condition)
        say("\n".join(dict.fromkeys(STATE.violations[STATE.reported:])))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if added:
        say(f"hermetic test run: the tests left {len(added)} new file(s) in the repository (write to tmp_path): "
            + ", ".join(added[:10]) + (" ..." if len(added) > 10 else ""))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if STATE.base is None:
        return
    if session.exitstatus == 0:
        shutil.rmtree(STATE.base, ignore_errors=True)
    else:
        say(f"hermetic test run: its temporary directory is kept for inspection: {STATE.base}")
