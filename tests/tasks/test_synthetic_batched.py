"""Issue 25, item 7: the built-in generators hand a DataLoader whole batches (``__getitems__``), the
image generators drawn at once (vectorised); every item equals the one-at-a-time item, bit for bit,
and the faster geometry and rendering equal their definitions (the former numpy forms, kept here)."""
import numpy as np
import pytest
import torch

from modwire.tasks import build_dataset, get_task
from modwire.tasks.synthetic import sort_of_clevr as soc
from modwire.tasks.synthetic import triangle as tri
from modwire.tasks.synthetic._common import sample_rng
from modwire.training import make_loader

SMALL = {
    "triangle": {"size": 200},
    "sort_of_clevr": {"size": 6},
    "sort_of_clevr_conditional": {"size": 4},
    "sort_of_clevr_image": {"size": 4},
    "listops": {"size": 12, "min_len": 20, "max_len": 120},
    "fuzzy_boolean": {"size": 12},
    "multi_digit": {"size": 12},
    "digits_multitask_offline": {"size": 12},
}


def equal(a, b) -> bool:
    """Items (tuples / dicts of tensors) equal in type, dtype, shape and every value."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_batch_of_items_equals_the_items_one_at_a_time(name):
    ds = build_dataset(name, "val", **SMALL[name])
    n = len(ds)
    idx = [n - 1, 0, 3, 3, -2, 7 % n, n // 2]                  # repeats, negative, any order
    batch = ds.__getitems__(idx)
    assert len(batch) == len(idx) and all(equal(b, ds[i]) for b, i in zip(batch, idx))
    assert ds.__getitems__([]) == []
    with pytest.raises(IndexError):
        ds.__getitems__([0, n])


@pytest.mark.parametrize("name", ["triangle", "sort_of_clevr"])
def test_a_loader_batch_equals_the_collated_items(name):
    ds, info = build_dataset(name, "train", **SMALL[name]), get_task(name)
    loader = make_loader(ds, 8, None, info, 0, drop_last=False)
    x, y = next(iter(loader))
    ref = (info.collate or torch.utils.data.default_collate)([ds[i] for i in range(8)])
    assert torch.equal(x, ref[0]) and torch.equal(y, ref[1])


# ----------------------------------------------------------------------------- triangle: the former forms

def _reference_triangle(seed, split, index, min_side=8.0, ratio=1.1):
    """``sample_triangle`` as first written, with numpy arrays of 2-3 points."""
    rng = sample_rng(seed, split, index)

    def sides(v):
        return np.linalg.norm(v - np.roll(v, -1, axis=0), axis=1)

    if index % 2 == tri.EQUILATERAL:
        while True:
            v1, v2 = rng.integers(tri.LO, tri.HI + 1, size=(2, 2)).astype(np.float64)
            angle = np.pi / 3 * (1 if rng.random() < 0.5 else -1)
            c, s = np.cos(angle), np.sin(angle)
            d = v2 - v1
            v3 = v1 + np.array([c * d[0] - s * d[1], s * d[0] + c * d[1]])
            if np.linalg.norm(d) >= max(min_side, 1.0) and np.all((v3 >= tri.LO) & (v3 <= tri.HI)):
                v = np.stack([v1, v2, v3])
                break
    else:
        while True:
            v = rng.integers(tri.LO, tri.HI + 1, size=(3, 2)).astype(np.float64)
            s = sides(v)
            if s.min() >= max(min_side, 1.0) and not s.max() <= ratio * s.min():
                break
    d = rng.uniform(-tri.JITTER, tri.JITTER, size=(3, tri.POINTS_PER_CLUSTER // 2, 2))
    return v, np.concatenate([v[:, None] + d, v[:, None] - d], axis=1)


@pytest.mark.parametrize("min_side,ratio", [(8.0, 1.1), (2.5, 1.5), (0.0, 1.0)])
def test_triangle_geometry_equals_the_numpy_definition(min_side, ratio):
    for split in ("train", "test"):
        for i in range(600):
            t = tri.sample_triangle(7, split, i, min_side, ratio)
            v, points = _reference_triangle(7, split, i, min_side, ratio)
            assert np.array_equal(t.vertices, v) and np.array_equal(t.points, points), (split, i)


def test_triangle_render_batch_equals_render_pixel_for_pixel():
    points = np.stack([tri.sample_triangle(1, "train", i).points for i in range(300)])
    assert np.array_equal(tri.render_batch(points), np.stack([tri.render(p) for p in points]))
    # points at and a hair off integers and the image border: the window holds every pixel of each disc
    rng = np.random.default_rng(0)
    hair = rng.choice([0.0, 1e-15, -1e-15, 0.5, 2.0 ** -40, -(2.0 ** -40), 1.9999999999999998], size=(200, 24, 2))
    edge = np.clip(rng.integers(0, 65, size=(200, 24, 2)) + hair, 0, 64)
    assert np.array_equal(tri.render_batch(edge), np.stack([tri.render(p) for p in edge]))
    assert tri.render_batch(np.zeros((0, 24, 2))).shape == (0, 64, 64)


# ----------------------------------------------------------------------------- Sort-of-CLEVR

def _reference_scene(rng, holdout=0):
    """``sample_scene`` as first written (numpy centre checks, ``np.delete`` ambiguity test)."""
    pairs = np.array(soc.HOLDOUT_ORDER[:holdout], dtype=np.int64).reshape(-1, 2)

    def ambiguous(centers, shapes):
        d2 = ((centers[:, None] - centers[None]) ** 2).sum(-1)
        for k in range(len(centers)):
            others = np.delete(np.arange(len(centers)), k)
            for extreme in (d2[k, others].min(), d2[k, others].max()):
                if len(set(shapes[others[d2[k, others] == extreme]].tolist())) > 1:
                    return True
        return False

    while True:
        centers = []
        while len(centers) < len(soc.COLORS):
            c = rng.integers(soc.HALF_SIZE, soc.IMAGE_SIZE - soc.HALF_SIZE, size=2)
            if all(((c - o) ** 2).sum() >= soc.MIN_CENTER_DIST2 for o in centers):
                centers.append(c)
        shapes = rng.integers(0, 2, size=len(soc.COLORS))
        flip = shapes[pairs[:, 0]] == pairs[:, 1]
        shapes[pairs[flip, 0]] = 1 - pairs[flip, 1]
        if not ambiguous(np.stack(centers), shapes):
            break
    questions = np.stack([rng.integers(0, len(soc.COLORS), size=soc.NUM_QUESTIONS),
                          np.repeat([0, 1], soc.NUM_QUESTIONS // 2), rng.integers(0, 3, size=soc.NUM_QUESTIONS)], 1)
    return np.stack(centers), shapes, questions


@pytest.mark.parametrize("holdout", [0, 4])
def test_sort_of_clevr_scenes_and_images_equal_their_definitions(holdout):
    for i in range(300):
        scene = soc.sample_scene(sample_rng(3, "train", i), holdout)
        ref = _reference_scene(sample_rng(3, "train", i), holdout)
        assert all(np.array_equal(a, b) for a, b in zip((scene.centers, scene.shapes, scene.questions), ref)), i
        if i < 100:
            assert np.array_equal(soc.render(scene), soc.render_reference(scene)), i
