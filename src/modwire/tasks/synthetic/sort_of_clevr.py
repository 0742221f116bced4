"""Sort-of-CLEVR (Santoro et al. 2017; AiT Sec. 4 and App. A.1; implementation notes §5).

Scene (one per image index, from its per-sample generator): a white 75×75×3 canvas with
6 objects, one per colour in ``COLORS`` order (red, green, blue, orange, gray, yellow),
each a square or a circle (fair coin) of half-size 5. Centres are integer points
uniform in ``[5, 70)²`` (x = column, y = row), redrawn until the squared distance to
every earlier centre is ≥ 100. A whole scene is redrawn when a relational answer would
be ambiguous (the nearest or farthest other object of some object is tied between two
objects of different shapes), so every label is well defined.
Rendering: a square covers the pixels with ``|col - x| <= 5`` and ``|row - y| <= 5``, a
circle those with ``(col - x)² + (row - y)² <= 25``; objects are painted in colour order
(corners of nearby squares can overlap, as in the original; a centre pixel is never
covered by another object since centres are ≥ 10 px apart).

Questions: 20 per image, 10 non-relational then 10 relational, each with a uniform
colour and a uniform subtype:

* non-relational: 0 shape of the object (``rectangle``/``circle``); 1 is it on the
  left (``x < 37.5``: yes/no); 2 is it on the top (``y < 37.5``: yes/no);
* relational: 0 shape of the nearest other object; 1 shape of the farthest other
  object; 2 how many objects have the same shape as it (itself included: 1-6).

Question vector (11 dims): one-hot colour (6) ⊕ one-hot type (2: non-relational,
relational) ⊕ one-hot subtype (3). Answers index ``ANSWERS`` = [yes, no, rectangle,
circle, 1, 2, 3, 4, 5, 6] (10 classes).

Items: index ``i`` is question ``i % 20`` about image ``i // 20`` (so a split of
``size`` images has ``20 * size`` items, and ``size`` counts *images*). The input is a set
of tokens ``[N, d]`` (float32): the image (values in [0, 1]) cut into ``patch_size`` ×
``patch_size`` patches in row-major order (default 5 → 15×15 = 225 patches), each token
= the patch's pixels flattened as (row, col, channel) (75 values) ⊕ the question vector
(11) ⊕ the patch centre's normalised position (row, col) = ``((i + 0.5) / n, (j + 0.5) / n)``
(2), so ``d = 3 p² + 13`` = 88. A set model reads image and question together and the
question can be read back from any token (:func:`is_relational`, :func:`question_kind`),
which lets a trainer report relational and non-relational accuracy separately
(:func:`accuracy_by_kind`). The target is a 0-d ``LongTensor`` answer index.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..base import TaskInfo, register_task
from ._common import GeneratedDataset, check_seed, sample_rng, split_size

IMAGE_SIZE = 75
HALF_SIZE = 5
MIN_CENTER_DIST2 = 100
COLORS = ("red", "green", "blue", "orange", "gray", "yellow")
RGB = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 156, 0), (128, 128, 128), (255, 255, 0)],
               dtype=np.float32) / 255.0
SHAPES = ("rectangle", "circle")  # shape id 0 = square ("rectangle" in the answers), 1 = circle
ANSWERS = ("yes", "no", "rectangle", "circle", "1", "2", "3", "4", "5", "6")
YES, NO, RECTANGLE, CIRCLE = 0, 1, 2, 3
NUM_QUESTIONS = 20  # per image: 10 non-relational, then 10 relational
NON_RELATIONAL_SUBTYPES = ("shape", "left", "top")
RELATIONAL_SUBTYPES = ("nearest_shape", "farthest_shape", "count_same_shape")
QUESTION_DIM = len(COLORS) + 2 + 3  # 11
POS_DIM = 2
TYPE_OFFSET = len(COLORS)  # q[6] = non-relational, q[7] = relational
SUBTYPE_OFFSET = len(COLORS) + 2


@dataclass(frozen=True)
class Scene:
    """``centers [6, 2]`` integer (x, y); ``shapes [6]`` (0 square, 1 circle), object k has colour k;
    ``questions [20, 3]`` rows (colour, relational 0/1, subtype)."""

    centers: np.ndarray
    shapes: np.ndarray
    questions: np.ndarray


def answer(centers: np.ndarray, shapes: np.ndarray, color: int, relational: int, subtype: int) -> int:
    """Answer index of a question about the object of colour ``color``."""
    x, y = centers[color]
    if not relational:
        if subtype == 0:
            return RECTANGLE + int(shapes[color])
        if subtype == 1:
            return YES if x < IMAGE_SIZE / 2 else NO
        return YES if y < IMAGE_SIZE / 2 else NO
    if subtype == 2:
        return 3 + int((shapes == shapes[color]).sum())  # "1" has index 4
    d2 = ((centers - centers[color]) ** 2).sum(1).astype(np.float64)
    if subtype == 0:
        d2[color] = np.inf
        return RECTANGLE + int(shapes[int(np.argmin(d2))])
    return RECTANGLE + int(shapes[int(np.argmax(d2))])


def _ambiguous(centers: np.ndarray, shapes: np.ndarray) -> bool:
    d2 = ((centers[:, None] - centers[None]) ** 2).sum(-1)
    for k in range(len(centers)):
        others = np.delete(np.arange(len(centers)), k)
        for extreme in (d2[k, others].min(), d2[k, others].max()):
            tied = others[d2[k, others] == extreme]
            if len(set(shapes[tied].tolist())) > 1:
                return True
    return False


def sample_scene(rng: np.random.Generator) -> Scene:
    while True:
        centers: list[np.ndarray] = []
        while len(centers) < len(COLORS):
            c = rng.integers(HALF_SIZE, IMAGE_SIZE - HALF_SIZE, size=2)
            if all(((c - o) ** 2).sum() >= MIN_CENTER_DIST2 for o in centers):
                centers.append(c)
        shapes = rng.integers(0, 2, size=len(COLORS))
        if not _ambiguous(np.stack(centers), shapes):
            break
    half = NUM_QUESTIONS // 2
    questions = np.stack([rng.integers(0, len(COLORS), size=NUM_QUESTIONS),
                          np.repeat([0, 1], half),
                          rng.integers(0, 3, size=NUM_QUESTIONS)], axis=1)
    return Scene(np.stack(centers), shapes, questions)


_GRID_Y, _GRID_X = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]


def render(scene: Scene) -> np.ndarray:
    """``[75, 75, 3]`` float32 image in [0, 1] (white background)."""
    img = np.ones((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
    for k, ((x, y), shape) in enumerate(zip(scene.centers, scene.shapes)):
        dx, dy = _GRID_X - x, _GRID_Y - y
        if shape == 0:
            mask = (np.abs(dx) <= HALF_SIZE) & (np.abs(dy) <= HALF_SIZE)
        else:
            mask = dx ** 2 + dy ** 2 <= HALF_SIZE ** 2
        img[mask] = RGB[k]
    return img


def question_vector(color: int, relational: int, subtype: int) -> np.ndarray:
    q = np.zeros(QUESTION_DIM, dtype=np.float32)
    q[color] = 1
    q[TYPE_OFFSET + int(relational)] = 1
    q[SUBTYPE_OFFSET + subtype] = 1
    return q


def patchify(img: np.ndarray, patch_size: int) -> np.ndarray:
    """``[H, W, C]`` → ``[(H/p)·(W/p), p·p·C]``, patches row-major, pixels (row, col, channel)."""
    h, w, c = img.shape
    n, m = h // patch_size, w // patch_size
    return (img.reshape(n, patch_size, m, patch_size, c).transpose(0, 2, 1, 3, 4)
            .reshape(n * m, patch_size * patch_size * c))


def patch_positions(n: int) -> np.ndarray:
    """Normalised (row, col) centres of an ``n × n`` patch grid, row-major: ``[n², 2]`` in (0, 1)."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return ((np.stack([i, j], -1).reshape(-1, 2) + 0.5) / n).astype(np.float32)


def tokens(img: np.ndarray, q: np.ndarray, patch_size: int) -> np.ndarray:
    patches = patchify(img, patch_size)
    pos = patch_positions(IMAGE_SIZE // patch_size)
    return np.concatenate([patches, np.broadcast_to(q, (len(patches), QUESTION_DIM)), pos], axis=1)


def question_of(x: Tensor) -> Tensor:
    """The 11-d question vector(s) of an input ``[N, d]`` or a batch ``[B, N, d]``."""
    return x[..., 0, -(QUESTION_DIM + POS_DIM):-POS_DIM]


def is_relational(x: Tensor) -> Tensor:
    """Bool mask: is the question of each input relational? ``[N, d]`` → 0-d, ``[B, N, d]`` → ``[B]``."""
    return question_of(x)[..., TYPE_OFFSET + 1] > 0.5


def question_kind(x: Tensor) -> str:
    """``"relational"`` or ``"non_relational"`` for one input ``[N, d]``."""
    if x.dim() != 2:
        raise ValueError(f"question_kind takes one input [N, d]; use is_relational for a batch, got {list(x.shape)}")
    return "relational" if bool(is_relational(x)) else "non_relational"


def accuracy_by_kind(logits: Tensor, targets: Tensor, inputs_or_mask: Tensor) -> dict[str, float]:
    """Top-1 accuracy overall and on relational / non-relational questions.

    ``inputs_or_mask``: the inputs ``[B, N, d]`` or an :func:`is_relational` mask ``[B]``.
    A kind without questions gets ``nan``.
    """
    rel = inputs_or_mask if inputs_or_mask.dtype == torch.bool else is_relational(inputs_or_mask)
    correct = (logits.argmax(-1) == targets).float()
    out = {"top1": correct.mean().item()}
    for name, mask in (("top1_relational", rel), ("top1_non_relational", ~rel)):
        out[name] = correct[mask].mean().item() if mask.any() else float("nan")
    return out


class SortOfClevrDataset(GeneratedDataset):
    def __init__(self, split: str, seed: int, size, patch_size: int) -> None:
        super().__init__(split, seed, NUM_QUESTIONS * split_size(size, split))
        if not isinstance(patch_size, int) or patch_size < 1 or IMAGE_SIZE % patch_size:
            raise ValueError(f"patch_size must divide {IMAGE_SIZE} (1, 3, 5, 15, 25, 75), got {patch_size!r}")
        self.patch_size = patch_size
        self._cache: tuple[int, Scene, np.ndarray] | None = None  # last image (items come 20 per image)

    def scene(self, image_index: int) -> Scene:
        return sample_scene(sample_rng(self.seed, self.split, image_index))

    def _image(self, image_index: int) -> tuple[Scene, np.ndarray]:
        if self._cache is None or self._cache[0] != image_index:
            scene = self.scene(image_index)
            self._cache = (image_index, scene, render(scene))
        return self._cache[1], self._cache[2]

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        scene, img = self._image(index // NUM_QUESTIONS)
        color, rel, sub = (int(v) for v in scene.questions[index % NUM_QUESTIONS])
        x = tokens(img, question_vector(color, rel, sub), self.patch_size)
        y = answer(scene.centers, scene.shapes, color, rel, sub)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.tensor(y, dtype=torch.long)


DEFAULT_SIZE = {"train": 9_800, "val": 200, "test": 200}  # images (Santoro et al.: 10k images)


def build(split: str, seed: int = 0, size=None, patch_size: int = 5) -> SortOfClevrDataset:
    """Sort-of-CLEVR split. ``size``: number of *images* (int or ``{split: n}``; 20 items each;
    default 9800/200/200). ``patch_size`` must divide 75; tokens are ``3·p² + 13`` wide."""
    return SortOfClevrDataset(split, check_seed(seed), DEFAULT_SIZE if size is None else size, patch_size)


def input_dim(patch_size: int = 5) -> int:
    return 3 * patch_size ** 2 + QUESTION_DIM + POS_DIM


INFO = TaskInfo(
    name="sort_of_clevr",
    kind="generator",
    description=("Sort-of-CLEVR: answer one question (10 answers) about a 75x75 image of 6 coloured "
                 "squares/circles. Input: 225 tokens = 5x5 patch (75) + question (11) + position (2). "
                 "Report accuracy split by question kind (relational / non-relational): see "
                 "modwire.tasks.synthetic.sort_of_clevr.accuracy_by_kind / is_relational. size counts images "
                 "(20 items each); model input_dim must be 3*patch_size**2 + 13 if patch_size changes."),
    num_classes=len(ANSWERS),
    model_overrides={"tokenizer": "linear", "input_dim": input_dim(5)},
    loss="cross_entropy",
    metrics=("top1",),
    splits=("train", "val", "test"),
    params={"seed": 0, "size": dict(DEFAULT_SIZE), "patch_size": 5},
    subsets={"relational": is_relational, "non_relational": lambda x: ~is_relational(x)},
)

register_task(INFO, build)
