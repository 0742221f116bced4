"""Where the studies read their configs and keep their results: a clone of the repository.

The studies' code is this package (``python -m modwire.experiments.NAME``); what they read and write
is not: the training configs (``configs/``) and the committed results (``experiments/results/NAME/``:
study.json, the run logs a rebuilt study.json names, the figures) live in the repository. :data:`ROOT`
is that clone:

* the repository this package runs from (``src/modwire/experiments`` of a clone, installed with
  ``pip install -e .`` or run with ``PYTHONPATH=src``), else
* the current directory, where it is a clone (``configs/`` and ``experiments/results/``), else
* ``None``: an installed package with no clone in sight. Then a study needs ``--out DIR`` (it never
  writes into site-packages: :func:`results_dir` is a clear error) and its configs are looked up in
  ``./configs`` (a missing one is a ``FileNotFoundError`` naming it); ``modwire reproduce`` and
  ``modwire results`` say that they need a clone.
"""
from __future__ import annotations

from pathlib import Path

from modwire.errors import UserError


def is_checkout(root: Path) -> bool:
    """Does ``root`` hold the studies' configs and results folder?"""
    return (root / "configs").is_dir() and (root / "experiments" / "results").is_dir()


#: the repository's root when this package runs from a clone (``src/modwire/experiments``)
PACKAGE_ROOT = Path(__file__).resolve().parents[3]


def find_checkout(package_root: Path = PACKAGE_ROOT, cwd: Path | None = None) -> Path | None:
    """The clone the studies read and write: this package's repository, else ``cwd`` (default the
    current directory) when it is one, else ``None``."""
    for root in (package_root, (cwd or Path.cwd()).resolve()):
        if is_checkout(root):
            return root
    return None


ROOT: Path | None = find_checkout()
#: the training configs the studies start from (``./configs`` without a clone: a clear "no such file")
CONFIGS = (ROOT or Path.cwd()) / "configs"
NO_CHECKOUT = (f"found no clone of the modwire repository (a folder with configs/ and experiments/results/) at "
               f"{PACKAGE_ROOT}, where this package sits in a clone, or in the current directory {Path.cwd()}")


def require_checkout(what: str) -> Path:
    """:data:`ROOT`, or a :class:`UserError` saying that ``what`` needs a clone."""
    if ROOT is None:
        raise UserError(f"{what} reads and writes experiments/results/ of a clone of the modwire repository: "
                        f"clone it and run inside it (pip install -e . there); {NO_CHECKOUT}")
    return ROOT


def results_dir(name: str) -> Path:
    """A study's default output folder, ``<clone>/experiments/results/NAME``; without a clone a
    :class:`UserError` asking for ``--out`` (never a folder inside the installed package)."""
    if ROOT is None:
        raise UserError(f"{name}: give --out DIR (the default, experiments/results/{name}, is a folder of a clone "
                        f"of the repository; {NO_CHECKOUT})")
    return ROOT / "experiments" / "results" / name
