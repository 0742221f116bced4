"""Checksums of saved files: ``manifest.json`` lists the sha256 of every file a
checkpoint holds, written after them and verified before they are read, so bytes
changed on disk (a flipped bit, a partial copy, an overwritten tensor) are an error
that names the file instead of weights that load and are silently wrong."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_FILE = "manifest.json"


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
    path = d / MANIFEST_FILE
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def verify_manifest(directory: str | os.PathLike, *, required: bool = False) -> bool:
    """Check every file listed in ``directory/manifest.json`` against its sha256.

    Returns False when there is no manifest (older checkpoints, plain ``save_pretrained``
    directories) unless ``required``; raises ValueError naming the file that is missing
    or whose bytes changed."""
    d = Path(directory)
    path = d / MANIFEST_FILE
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing: cannot verify the checkpoint in {d}")
        return False
    try:
        files = json.loads(path.read_text())["files"]
        items = list(files.items())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a readable checksum manifest ({type(e).__name__}: {e})") from None
    for name, digest in items:
        f = d / name
        if not f.is_file():
            raise ValueError(f"checkpoint {d} is incomplete: {name} is listed in {MANIFEST_FILE} but missing")
        if sha256_file(f) != digest:
            raise ValueError(f"checkpoint file {f} is corrupted: its sha256 differs from the one recorded in "
                             f"{path} when it was saved (the file was modified or damaged on disk)")
    return True
