"""ModelNet40 point clouds from Princeton OFF meshes or the resampled text files.

Input: float ``[num_points, 3]`` (xyz; the normals of the resampled files are not
used), centred on the points' mean and scaled to unit maximum radius (``normalize``).

OFF meshes: polygons are fan-triangulated and ``num_points`` points are drawn
uniformly on the surface (a triangle with probability proportional to its area, a
point uniformly inside it), with a generator seeded by ``(seed, index)``, so a
sample is the same every time it is read. Labels are indices in the official
alphabetical list of the 40 ModelNet40 classes (:data:`MODELNET40_CLASSES`), so a
subset of classes (e.g. ModelNet10) keeps its ModelNet40 labels.

Resampled format (``modelnet40_normal_resampled``): labels follow
``modelnet40_shape_names.txt``; ``pick="first"`` takes the first ``num_points``
rows (as the usual PointNet++ pipeline does), ``pick="random"`` a seeded random subset.
"""
from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import LoaderDataset, malformed, missing, require_root, text_problem
from ...errors import UserError
from ...fields import INT_COUNT

MODELNET40_CLASSES = (
    "airplane", "bathtub", "bed", "bench", "bookshelf", "bottle", "bowl", "car", "chair", "cone",
    "cup", "curtain", "desk", "door", "dresser", "flower_pot", "glass_box", "guitar", "keyboard", "lamp",
    "laptop", "mantel", "monitor", "night_stand", "person", "piano", "plant", "radio", "range_hood", "sink",
    "sofa", "stairs", "stool", "table", "tent", "toilet", "tv_stand", "vase", "wardrobe", "xbox",
)

OFF_LAYOUT = """\
format="off":
<root>/                          (the folder ModelNet40/, or its parent)
  <class>/train/<class>_NNNN.off  Princeton OFF: "OFF", "nv nf ne" (possibly on the OFF
  <class>/test/<class>_NNNN.off   line itself: "OFF490 518 0"), nv lines "x y z", nf lines "k i1 .. ik\""""

RESAMPLED_LAYOUT = """\
format="resampled":
<root>/                          (the folder modelnet40_normal_resampled/, or its parent)
  modelnet40_shape_names.txt     one class per line; line i is class i
  modelnet40_train.txt           sample ids, one per line, e.g. airplane_0001
  modelnet40_test.txt
  <class>/<class>_NNNN.txt       lines "x,y,z,nx,ny,nz\""""

LAYOUT = OFF_LAYOUT + "\n" + RESAMPLED_LAYOUT
FORMATS = ("auto", "off", "resampled")
PICKS = ("first", "random")


def read_off(path: Path, task: str = "modelnet40") -> tuple[np.ndarray, np.ndarray]:
    """``(vertices float64 [V, 3], triangles int64 [T, 3])`` of an OFF file (polygons fan-triangulated)."""
    def bad(problem: str) -> Exception:
        return malformed(task, path, problem, OFF_LAYOUT)

    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = [ln for ln in (raw.split("#", 1)[0].strip() for raw in text.splitlines()) if ln]
    if not lines or not lines[0].startswith("OFF"):
        html = text_problem(text[:64].encode(), "an OFF mesh") if lines else None
        raise bad(("the file is " + html if html and "HTML" in html else
                   f"first line must start with 'OFF', got {lines[0][:40]!r}") if lines else "empty file")
    counts, body = (lines[0][3:].split(), lines[1:]) if lines[0][3:].strip() else \
        ((lines[1].split() if len(lines) > 1 else []), lines[2:])
    try:
        nv, nf = int(counts[0]), int(counts[1])
    except (IndexError, ValueError):
        raise bad(f"expected the counts 'nv nf ne' after OFF, got {' '.join(counts)[:40]!r}") from None
    if nv < 3 or nf < 1:
        raise bad(f"needs at least 3 vertices and 1 face, header says {nv} and {nf}")
    if len(body) < nv + nf:
        raise bad(f"truncated: header says {nv} vertices + {nf} faces, found {len(body)} lines")
    try:
        tokens = " ".join(body[:nv]).split()
        if len(tokens) == 3 * nv:
            verts = np.array(tokens, dtype=np.float64).reshape(nv, 3)
        else:
            verts = np.array([ln.split()[:3] for ln in body[:nv]], dtype=np.float64)
        if verts.shape != (nv, 3):
            raise ValueError
    except ValueError:
        raise bad("vertex lines must hold three numbers 'x y z'") from None
    tris = _triangles(body[nv: nv + nf], bad)
    if tris.size and (tris.min() < 0 or tris.max() >= nv):
        raise bad(f"face vertex index out of range [0, {nv}): {int(tris.min())}..{int(tris.max())}")
    if not np.isfinite(verts).all():
        raise bad("non-finite vertex coordinates")
    return verts, tris


def _triangles(face_lines: list[str], bad: Callable[[str], Exception]) -> np.ndarray:
    nf = len(face_lines)
    tokens = " ".join(face_lines).split()
    if len(tokens) == 4 * nf:  # fast path: all triangles, no colours
        try:
            arr = np.array(tokens, dtype=np.int64).reshape(nf, 4)
            if (arr[:, 0] == 3).all():
                return arr[:, 1:]
        except ValueError:
            pass
    out: list[list[int]] = []
    for n, ln in enumerate(face_lines):
        t = ln.split()
        try:
            k = int(t[0])
            idx = [int(v) for v in t[1: 1 + k]]
        except (ValueError, IndexError):
            raise bad(f"face {n}: expected 'k i1 .. ik', got {ln[:40]!r}") from None
        if k < 3 or len(idx) < k:
            raise bad(f"face {n}: a polygon needs k >= 3 vertex indices, got {ln[:40]!r}")
        out += [[idx[0], idx[i], idx[i + 1]] for i in range(1, k - 1)]  # fan triangulation
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def sample_surface(verts: np.ndarray, tris: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` points uniform on the surface of a triangle mesh (area-weighted triangle, then barycentric)."""
    a, b, c = verts[tris[:, 0]], verts[tris[:, 1]], verts[tris[:, 2]]
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    total = area.sum()
    if not np.isfinite(total) or total <= 0:
        raise UserError("the mesh has zero surface area")
    pick = rng.choice(len(area), size=n, p=area / total)
    r1, r2 = np.sqrt(rng.random(n))[:, None], rng.random(n)[:, None]
    return (1 - r1) * a[pick] + r1 * (1 - r2) * b[pick] + r1 * r2 * c[pick]


def normalize_points(points: np.ndarray) -> np.ndarray:
    """Zero mean, unit maximum distance from the origin."""
    points = points - points.mean(axis=0)
    radius = np.linalg.norm(points, axis=1).max()
    return points / radius if radius > 0 else points


class ModelNetDataset(LoaderDataset):
    """``(path, label)`` → ``(float [num_points, 3], long)``, computed on access."""

    def __init__(self, samples: list[tuple[Path, int]], classes: list[str], fmt: str, num_points: int,
                 seed: int, pick: str, normalize: bool, transform: Callable | None = None) -> None:
        super().__init__(transform)
        self.samples, self.classes, self.format = samples, classes, fmt
        self.num_points, self.seed, self.pick, self.normalize = num_points, seed, pick, normalize

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def targets(self) -> Tensor:
        """The class label of every item (declared: ``data.max_samples`` draws a stratified subset)."""
        return torch.tensor([label for _, label in self.samples], dtype=torch.long)

    def points(self, index: int) -> np.ndarray:
        """The raw (not normalised) points of sample ``index``."""
        path, _ = self.samples[index]
        rng = np.random.default_rng([self.seed, index])
        n = self.num_points
        if self.format == "off":
            verts, tris = read_off(path)
            try:
                return sample_surface(verts, tris, n, rng)
            except ValueError as exc:
                raise malformed("modelnet40", path, str(exc), OFF_LAYOUT) from None
        with open(path, encoding="utf-8", errors="replace") as f:
            rows = f if self.pick == "random" else islice(f, n)
            try:
                pts = np.array([ln.replace(",", " ").split()[:3] for ln in rows if ln.strip()], dtype=np.float64)
            except ValueError:
                raise malformed("modelnet40", path, "lines must be 'x,y,z,nx,ny,nz' numbers",
                                RESAMPLED_LAYOUT) from None
        if pts.ndim != 2 or pts.shape[0] == 0 or pts.shape[1] != 3:
            raise malformed("modelnet40", path, "no 'x,y,z,...' rows", RESAMPLED_LAYOUT)
        if self.pick == "random" or pts.shape[0] < n:
            keep = rng.choice(pts.shape[0], size=n, replace=pts.shape[0] < n)
            pts = pts[np.sort(keep)] if self.pick == "random" else np.concatenate(
                [pts, pts[rng.choice(pts.shape[0], size=n - pts.shape[0])]])
        return pts

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if index < 0:
            index += len(self)
        pts = self.points(index)
        if self.normalize:
            pts = normalize_points(pts)
        return self._out(torch.from_numpy(pts.astype(np.float32)), torch.tensor(self.samples[index][1]))


def _off_samples(path: Path, split: str) -> list[tuple[Path, int]]:
    index = {c: i for i, c in enumerate(MODELNET40_CLASSES)}
    class_dirs = [d for d in sorted(path.iterdir()) if _is_class_dir(d)]
    unknown = [d.name for d in class_dirs if d.name not in index]
    if unknown:
        raise missing("modelnet40", f"class folders {unknown} are not ModelNet40 classes "
                                    f"({', '.join(MODELNET40_CLASSES[:4])}, ...)", OFF_LAYOUT, path)
    samples = []
    for d in class_dirs:
        if (d / split).is_dir():
            samples += [(p, index[d.name]) for p in sorted((d / split).iterdir())
                        if p.suffix.lower() == ".off" and p.is_file() and not p.name.startswith(".")]
    if not samples:
        raise missing("modelnet40", f"no <class>/{split}/*.off files", OFF_LAYOUT, path)
    return samples


def _resampled_samples(path: Path, split: str) -> tuple[list[tuple[Path, int]], list[str]]:
    names_file, list_file = path / "modelnet40_shape_names.txt", path / f"modelnet40_{split}.txt"
    for f in (names_file, list_file):
        if not f.is_file():
            raise missing("modelnet40", f"no file {f.name}", RESAMPLED_LAYOUT, path)
    classes = names_file.read_text(encoding="utf-8").split()
    index = {c: i for i, c in enumerate(classes)}
    samples = []
    for n, sid in enumerate(list_file.read_text(encoding="utf-8").split(), 1):
        cls = sid.rsplit("_", 1)[0]
        if cls not in index:
            raise malformed("modelnet40", list_file, f"line {n}: sample {sid!r} is of no class in "
                                                     f"{names_file.name}", RESAMPLED_LAYOUT)
        p = path / cls / f"{sid}.txt"
        if not p.is_file():
            raise missing("modelnet40", f"{cls}/{sid}.txt (line {n} of {list_file.name}) not found",
                          RESAMPLED_LAYOUT, path / cls if (path / cls).is_dir() else path)
        samples.append((p, index[cls]))
    if not samples:
        raise malformed("modelnet40", list_file, "no sample ids", RESAMPLED_LAYOUT)
    return samples, classes


def _is_class_dir(d: Path) -> bool:
    return d.is_dir() and not d.name.startswith((".", "__")) and ((d / "train").is_dir() or (d / "test").is_dir())


def _data_folders(path: Path) -> tuple[Path, ...]:
    return path, path / "modelnet40_normal_resampled", path / "ModelNet40"


def _detect(path: Path, format: str) -> tuple[Path, str] | None:
    """The data folder and its format: ``path`` itself, or the official folder name inside it."""
    for p in _data_folders(path):
        if format in ("auto", "resampled") and (p / "modelnet40_shape_names.txt").is_file():
            return p, "resampled"
        if format in ("auto", "off") and p.is_dir() and any(_is_class_dir(d) for d in p.iterdir()):
            return p, "off"
    return None


def build_modelnet40(split: str, root: Any = None, format: str = "auto", num_points: int = 1024, seed: int = 0,
                     pick: str = "first", normalize: bool = True,
                     transform: Callable | None = None) -> ModelNetDataset:
    """ModelNet40 ``train`` (9,843) / ``test`` (2,468) shapes as ``[num_points, 3]`` point clouds."""
    task = "modelnet40"
    path = require_root(task, root, LAYOUT)
    found = _detect(path, format)
    if found is None:
        tried = "\n".join(f"  {p}/" for p in _data_folders(path))
        raise missing(task, f"no ModelNet40 data in format {format!r}; tried the folders:\n{tried}",
                      {"off": OFF_LAYOUT, "resampled": RESAMPLED_LAYOUT}.get(format, LAYOUT), path)
    path, fmt = found
    if fmt == "off":
        samples, classes = _off_samples(path, split), list(MODELNET40_CLASSES)
    else:
        samples, classes = _resampled_samples(path, split)
    return ModelNetDataset(samples, classes, fmt, num_points, seed, pick, normalize, transform)


register_task(TaskInfo(
    name="modelnet40", kind="loader",
    description="ModelNet40 point clouds [N, 3] (OFF meshes sampled by area, or resampled text), unit sphere",
    describe=lambda p: (InputSpec.vectors(p["num_points"], 3), 40),  # an unordered set of xyz points
    splits=("train", "test"),
    params={"root": None, "format": "auto", "num_points": 1024, "seed": 0, "pick": "first", "normalize": True,
            "transform": None},
    param_bounds={"num_points": INT_COUNT}, param_choices={"format": FORMATS, "pick": PICKS},
), build_modelnet40)
