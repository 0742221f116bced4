"""Checksums of saved files: ``manifest.json`` lists the sha256 of every file a
checkpoint holds, written after them and verified before they are read, so bytes
changed on disk (a flipped bit, a partial copy, an overwritten tensor) are an error
that names the file instead of weights that load and are silently wrong."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .errors import UserError
from .files import atomic_write_text

MANIFEST_FILE = "manifest.json"
# modwire.training writes this checkpoint summary only together with a manifest: a directory
# that holds it but no manifest lost its manifest, and its files cannot be trusted.
_WRITTEN_WITH_MANIFEST = "checkpoint.json"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str | os.PathLike, names: list[str]) -> Path:
    """Write ``directory/manifest.json`` with the sha256 of each file in ``names``."""
    d = Path(directory)
    data = {"algorithm": "sha256", "files": {n: sha256_file(d / n) for n in sorted(names)}}
    return atomic_write_text(d / MANIFEST_FILE, json.dumps(data, indent=1) + "\n")


def verify_manifest(directory: str | os.PathLike, *, required: bool = False) -> bool:
    """Check every file listed in ``directory/manifest.json`` against its sha256.

    Returns False when there is no manifest (older checkpoints, plain ``save_pretrained``
    directories) unless ``required`` or the directory is a checkpoint written with one (it
    holds ``checkpoint.json``); raises ValueError naming the file that is missing or whose
    bytes changed."""
    d = Path(directory)
    path = d / MANIFEST_FILE
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing: cannot verify the checkpoint in {d}")
        if (d / _WRITTEN_WITH_MANIFEST).is_file():
            raise FileNotFoundError(f"{path} is missing: the checkpoint in {d} was saved with a checksum manifest "
                                    f"(it holds {_WRITTEN_WITH_MANIFEST}), so its files cannot be verified; "
                                    f"restore it, or use another checkpoint of the run")
        return False
    try:
        files = json.loads(path.read_text())["files"]
        items = list(files.items())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{path} is not a readable checksum manifest ({type(e).__name__}: {e})") from None
    for name, digest in items:
        f = d / name
        if not f.is_file():
            raise UserError(f"checkpoint {d} is incomplete: {name} is listed in {MANIFEST_FILE} but missing")
        if sha256_file(f) != digest:
            raise UserError(f"checkpoint file {f} is corrupted: its sha256 differs from the one recorded in "
                            f"{path} when it was saved (the file was modified or damaged on disk)")
    return True
