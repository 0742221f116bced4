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

Held-out colour–shape combinations (NFM §4.3, Table 7: "omitting N color-shape combinations from
the training set and testing on the original N = 12 combinations"): parameter ``holdout = N``
(0-6, default 0) removes the first ``N`` pairs of :data:`HOLDOUT_ORDER` from the **train** split
only: (red, circle), (green, rectangle), (blue, circle), (orange, rectangle), (gray, circle),
(yellow, rectangle) (the paper does not say which; one shape per colour, alternating, so both
shapes stay in training; every scene shows every colour, so at most one shape of each colour can
be held out). A training object of a held-out pair is drawn with the other shape instead (the
scene is otherwise the same draw, so ``holdout = 0`` gives the unchanged dataset and the shapes of
the other colours stay fair coins). Validation and test splits always show all 12 pairs.
:func:`held_out_pairs` lists them.

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

Conditional variant (task ``sort_of_clevr_conditional``; the multimodal setting of the
conditional NAC, NAC §2.2 "Conditional Circuit Generator", §4.4 and App. G): the same
scenes, questions and answers (item ``i`` asks the same question about the same image
and has the same target as item ``i`` of ``sort_of_clevr`` with the same ``seed``,
``size`` and ``patch_size``), but the two modalities are split. The item is
``({"x": float32 [N, 3 p² + 2], "condition": int64 [3]}, answer)``:

* ``x`` (the executor's input): the patch tokens without the question, patch ⊕ position
  (:func:`image_tokens`; 77 wide for ``p = 5``), i.e. the ``sort_of_clevr`` tokens with
  the 11 question columns removed;
* ``condition`` (the circuit generator's input): the question as 3 token ids of one
  14-id vocabulary (:data:`CONDITION_VOCAB`, :func:`condition_ids`):

  ====== =====================================================================
  ids    meaning
  ====== =====================================================================
  0-5    colour, in ``COLORS`` order (red, green, blue, orange, gray, yellow)
  6, 7   question type: 6 non-relational, 7 relational
  8-10   non-relational subtype: 8 shape, 9 left, 10 top
  11-13  relational subtype: 11 nearest_shape, 12 farthest_shape, 13 count_same_shape
  ====== =====================================================================

  so ``condition = [colour, 6 + relational, 8 + 3·relational + subtype]`` and a subtype id
  alone identifies its type. :func:`question_type` maps it to one of 6 classes
  (``subtype id - 8``, named by :data:`QUESTION_TYPE_NAMES`), for colouring circuit
  embeddings by question type as in NAC Fig. 6.

Image variant (task ``sort_of_clevr_image``; AiT §5.8: the question "embedded with an embedding
layer that consists of a learnable linear projection and layer normalization before and after
the linear projection ... concatenated to image patch embeddings", which a set model does with
``question_dim``, :class:`~modwire.models.set_model.QuestionEmbedding`): the same items again, as
``({"x": float32 [3, 75, 75], "question": float32 [1, 11]}, answer)``, the image channels-first in
[0, 1] (the model cuts its own patches) and the 11-d question vector above.

:func:`question_ids`, :func:`is_relational`, :func:`question_type` and
:func:`question_kind` read the question from any representation: the tokens of
``sort_of_clevr`` (``[N, d]`` / ``[B, N, d]`` float), condition ids (``[3]`` / ``[B, 3]``
integer), the (batched) ``{"x", "condition"}`` dict of ``sort_of_clevr_conditional`` or the
``{"x", "question"}`` dict of ``sort_of_clevr_image``.
"""
from __future__ import annotations

import dataclasses

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..base import InputSpec, TaskInfo, register_task
from ._common import GENERATOR_BOUNDS, GeneratedDataset, sample_rng, split_size
from ...errors import UserError
from ...fields import Bounds, Choices

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

# Condition vocabulary of ``sort_of_clevr_conditional`` (see the module docstring).
TYPE_ID = len(COLORS)  # 6 + relational: 6 non-relational, 7 relational
SUBTYPE_ID = TYPE_ID + 2  # 8 + 3 * relational + subtype: 8-10 non-relational, 11-13 relational
CONDITION_VOCAB = (COLORS + ("non_relational", "relational")
                   + NON_RELATIONAL_SUBTYPES + RELATIONAL_SUBTYPES)  # id -> name, 14 ids
CONDITION_VOCAB_SIZE = len(CONDITION_VOCAB)
CONDITION_LEN = 3  # (colour, type, subtype)
# NFM Table 7's held-out (colour, shape) pairs: the first ``holdout`` of these (module docstring).
HOLDOUT_ORDER = ((0, 1), (1, 0), (2, 1), (3, 0), (4, 1), (5, 0))
QUESTION_TYPE_NAMES = tuple(f"non_relational/{n}" for n in NON_RELATIONAL_SUBTYPES) + tuple(
    f"relational/{n}" for n in RELATIONAL_SUBTYPES)  # class of question_type(): 3 * relational + subtype


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
    """Whether an object's nearest or farthest other object is tied between a square and a circle
    (the answer to a nearest / farthest question would not be defined). Integer arithmetic in Python."""
    pts, kinds = centers.tolist(), shapes.tolist()
    for k, (x, y) in enumerate(pts):
        d2 = {j: (x - a) ** 2 + (y - b) ** 2 for j, (a, b) in enumerate(pts) if j != k}
        for extreme in (min(d2.values()), max(d2.values())):
            if len({kinds[j] for j, d in d2.items() if d == extreme}) > 1:
                return True
    return False


def held_out_pairs(holdout: int) -> tuple[tuple[str, str], ...]:
    """The (colour, shape) names omitted from the train split by ``holdout = N`` (NFM Table 7;
    ``0 <= N <= 6``: :data:`PARAM_BOUNDS`)."""
    return tuple((COLORS[c], SHAPES[s]) for c, s in HOLDOUT_ORDER[:holdout])


def sample_scene(rng: np.random.Generator, holdout: int = 0) -> Scene:
    """A scene (module docstring); ``holdout = N``: objects of the first N :data:`HOLDOUT_ORDER` pairs
    take the other shape (used for the train split only)."""
    pairs = np.array(HOLDOUT_ORDER[:holdout], dtype=np.int64).reshape(-1, 2)
    while True:
        centers: list[np.ndarray] = []
        centers_xy: list[tuple[int, int]] = []
        while len(centers) < len(COLORS):
            c = rng.integers(HALF_SIZE, IMAGE_SIZE - HALF_SIZE, size=2)
            x, y = c.tolist()                                    # integers: exact in Python
            if all((x - a) ** 2 + (y - b) ** 2 >= MIN_CENTER_DIST2 for a, b in centers_xy):
                centers.append(c)
                centers_xy.append((x, y))
        shapes = rng.integers(0, 2, size=len(COLORS))
        flip = shapes[pairs[:, 0]] == pairs[:, 1]
        shapes[pairs[flip, 0]] = 1 - pairs[flip, 1]
        if not _ambiguous(np.stack(centers), shapes):
            break
    half = NUM_QUESTIONS // 2
    questions = np.stack([rng.integers(0, len(COLORS), size=NUM_QUESTIONS),
                          np.repeat([0, 1], half),
                          rng.integers(0, 3, size=NUM_QUESTIONS)], axis=1)
    return Scene(np.stack(centers), shapes, questions)


_GRID_Y, _GRID_X = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]


_OFFSET = np.arange(-HALF_SIZE, HALF_SIZE + 1)
#: The pixels an object covers about its centre, ``[11, 11]`` (row dy, column dx): the square's
#: ``|dx|, |dy| <= 5``, the circle's ``dx² + dy² <= 25``.
_STAMPS = (np.ones((2 * HALF_SIZE + 1,) * 2, dtype=bool),
           _OFFSET[None, :] ** 2 + _OFFSET[:, None] ** 2 <= HALF_SIZE ** 2)


def render(scene: Scene) -> np.ndarray:
    """``[75, 75, 3]`` float32 image in [0, 1] (white background): object ``k`` (a square of side 11 or
    a disc of radius 5 about its integer centre) painted in colour ``k`` over the earlier ones."""
    img = np.ones((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
    for k, ((x, y), shape) in enumerate(zip(scene.centers.tolist(), scene.shapes.tolist())):
        # centres lie in [5, 70): the 11 x 11 window about one is inside the image
        img[y - HALF_SIZE:y + HALF_SIZE + 1, x - HALF_SIZE:x + HALF_SIZE + 1][_STAMPS[shape]] = RGB[k]
    return img


def render_reference(scene: Scene) -> np.ndarray:
    """:func:`render` by its definition, over the whole grid (the check of the windowed drawing)."""
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


def image_tokens(img: np.ndarray, patch_size: int) -> np.ndarray:
    """Patch tokens without the question: ``[N, 3 p²]`` pixels ⊕ ``[N, 2]`` positions → ``[N, 3 p² + 2]``."""
    return np.concatenate([patchify(img, patch_size), patch_positions(IMAGE_SIZE // patch_size)], axis=1)


def tokens(img: np.ndarray, q: np.ndarray, patch_size: int) -> np.ndarray:
    """Patch tokens carrying the question: pixels ⊕ ``q`` (11) ⊕ position → ``[N, 3 p² + 13]``."""
    t = image_tokens(img, patch_size)
    q = np.broadcast_to(q, (len(t), QUESTION_DIM))
    return np.concatenate([t[:, :-POS_DIM], q, t[:, -POS_DIM:]], axis=1)


def condition_ids(color: int, relational: int, subtype: int) -> np.ndarray:
    """The question as ``int64 [3]`` ids of :data:`CONDITION_VOCAB`: (colour, type, subtype)."""
    rel = int(relational)
    return np.array([color, TYPE_ID + rel, SUBTYPE_ID + 3 * rel + subtype], dtype=np.int64)


def question_of(x: Tensor) -> Tensor:
    """The 11-d question vector(s) of an input ``[N, d]`` or a batch ``[B, N, d]``."""
    return x[..., 0, -(QUESTION_DIM + POS_DIM):-POS_DIM]


def question_ids(inputs: Tensor | Mapping[str, Tensor]) -> Tensor:
    """The question(s) as condition ids ``int64 [..., 3]`` (colour, type, subtype; see the module docstring).

    ``inputs``: ``sort_of_clevr`` tokens ``[N, d]`` / ``[B, N, d]`` (float), condition ids
    ``[3]`` / ``[B, 3]`` (integer), a ``{"x", "condition"}`` or a ``{"x", "question"}`` (question
    ``[(B,) 1, 11]``) (batched) dict. Ids out of the
    vocabulary, or whose type and subtype disagree, raise ``ValueError``.
    """
    if isinstance(inputs, Mapping) and "question" in inputs:    # sort_of_clevr_image: [(B,) 1, 11] vectors
        return _vector_ids(inputs["question"][..., 0, :])
    if isinstance(inputs, Mapping):
        inputs = inputs["condition"]
    if inputs.is_floating_point() and inputs.shape[-1] != CONDITION_LEN:  # tokens: decode the one-hot question
        return _vector_ids(question_of(inputs))
    if inputs.shape[-1:] != (CONDITION_LEN,):
        raise UserError(f"condition ids must be [..., {CONDITION_LEN}], got {list(inputs.shape)}")
    color, typ, sub = inputs.long().unbind(-1)
    ok = ((color >= 0) & (color < len(COLORS)) & ((typ == TYPE_ID) | (typ == TYPE_ID + 1))
          & (sub >= SUBTYPE_ID + 3 * (typ - TYPE_ID)) & (sub < SUBTYPE_ID + 3 * (typ - TYPE_ID) + 3))
    if not bool(ok.all()):
        raise UserError(f"not a question of CONDITION_VOCAB (colour 0-5, type 6-7, subtype 8-10 for type 6 "
                        f"and 11-13 for type 7): {inputs[~ok][:4].tolist()}")
    return inputs.long()


def _vector_ids(q: Tensor) -> Tensor:
    """One-hot question vectors ``[..., 11]`` (:func:`question_vector`) → condition ids ``[..., 3]``."""
    if q.shape[-1] != QUESTION_DIM:
        raise UserError(f"question vectors must be [..., {QUESTION_DIM}] (one-hot colour, type, subtype), "
                        f"got {list(q.shape)}")
    rel = (q[..., TYPE_OFFSET + 1] > 0.5).long()
    sub = q[..., SUBTYPE_OFFSET:].argmax(-1)
    return torch.stack([q[..., :len(COLORS)].argmax(-1), TYPE_ID + rel, SUBTYPE_ID + 3 * rel + sub], -1)


def is_relational(x: Tensor | Mapping[str, Tensor]) -> Tensor:
    """Bool mask: is the question of each input relational? One input → 0-d, a batch → ``[B]``.
    ``x``: anything :func:`question_ids` reads (tokens, condition ids or the dict input)."""
    return question_ids(x)[..., 1] == TYPE_ID + 1


def question_type(condition: Tensor | Mapping[str, Tensor]) -> Tensor:
    """Type-and-subtype class of each question, ``int64``, ``[3]`` → 0-d, ``[B, 3]`` → ``[B]``:
    0-2 the non-relational subtypes, 3-5 the relational ones (``3·relational + subtype``), named
    by :data:`QUESTION_TYPE_NAMES` (NAC Fig. 6 colours circuit embeddings by such a label).
    Also reads what :func:`question_ids` reads."""
    return question_ids(condition)[..., 2] - SUBTYPE_ID


def question_kind(x: Tensor | Mapping[str, Tensor]) -> str:
    """``"relational"`` or ``"non_relational"`` for one input (tokens ``[N, d]``, ids ``[3]`` or its dict)."""
    rel = is_relational(x)
    if rel.dim() != 0:
        raise UserError(f"question_kind takes one input; use is_relational for a batch, "
                        f"got {list(rel.shape)} questions")
    return "relational" if bool(rel) else "non_relational"


def accuracy_by_kind(logits: Tensor, targets: Tensor,
                     inputs_or_mask: Tensor | Mapping[str, Tensor]) -> dict[str, float]:
    """Top-1 accuracy overall and on relational / non-relational questions.

    ``inputs_or_mask``: the inputs (``[B, N, d]`` tokens or the batched dict of the conditional
    or the image task) or an :func:`is_relational` mask ``[B]``. A kind without questions gets ``nan``.
    """
    is_mask = isinstance(inputs_or_mask, Tensor) and inputs_or_mask.dtype == torch.bool
    rel = inputs_or_mask if is_mask else is_relational(inputs_or_mask)
    correct = (logits.argmax(-1) == targets).float()
    out = {"top1": correct.mean().item()}
    for name, mask in (("top1_relational", rel), ("top1_non_relational", ~rel)):
        out[name] = correct[mask].mean().item() if mask.any() else float("nan")
    return out


CACHED_IMAGES = 4096      # rendered images a dataset keeps in memory (≤ ~280 MB)


class SortOfClevrDataset(GeneratedDataset):
    def __init__(self, split: str, seed: int, size, patch_size: int, holdout: int = 0) -> None:
        super().__init__(split, seed, NUM_QUESTIONS * split_size(size, split))
        self.patch_size = patch_size
        self.holdout = int(holdout) if split == "train" else 0   # NFM Table 7: train split only
        # Rendered images, kept (up to CACHED_IMAGES, ~68 KB each): a shuffled epoch asks for each
        # image 20 times, so each scene is drawn and rendered once instead of 20 times.
        self._cache: dict[int, tuple[Scene, np.ndarray]] = {}

    def scene(self, image_index: int) -> Scene:
        return sample_scene(sample_rng(self.seed, self.split, image_index), self.holdout)

    def _image(self, image_index: int) -> tuple[Scene, np.ndarray]:
        got = self._cache.get(image_index)
        if got is None:
            scene = self.scene(image_index)
            got = (scene, render(scene))
            if len(self._cache) < CACHED_IMAGES:
                self._cache[image_index] = got
        return got

    def question(self, index: int) -> tuple[np.ndarray, tuple[int, int, int], Tensor]:
        """Item ``index``'s image ``[75, 75, 3]``, question (colour, relational, subtype) and answer (0-d)."""
        scene, img = self._image(index // NUM_QUESTIONS)
        color, rel, sub = (int(v) for v in scene.questions[index % NUM_QUESTIONS])
        y = answer(scene.centers, scene.shapes, color, rel, sub)
        return img, (color, rel, sub), torch.tensor(y, dtype=torch.long)

    def item(self, index: int) -> tuple[Tensor, Tensor]:
        img, q, y = self.question(index)
        x = tokens(img, question_vector(*q), self.patch_size)
        return torch.from_numpy(np.ascontiguousarray(x)), y

    def items(self, indices: list[int]) -> list[tuple[Tensor, Tensor]]:
        """The items of ``indices``, their tokens (:func:`tokens`, pixels ⊕ question ⊕ position)
        written at once into one ``[B, N, 3 p² + 13]`` array."""
        if type(self).item is not SortOfClevrDataset.item:      # the conditional / image variants
            return super().items(indices)
        got = [self.question(i) for i in indices]
        if not got:
            return []
        p, n = self.patch_size, IMAGE_SIZE // self.patch_size
        pix = 3 * p * p
        out = np.empty((len(got), n * n, pix + QUESTION_DIM + POS_DIM), dtype=np.float32)
        imgs = np.stack([img for img, _, _ in got])                             # [B, H, W, 3]
        out[:, :, :pix] = (imgs.reshape(len(got), n, p, n, p, 3).transpose(0, 1, 3, 2, 4, 5)
                           .reshape(len(got), n * n, pix))
        out[:, :, pix:pix + QUESTION_DIM] = np.stack([question_vector(*q) for _, q, _ in got])[:, None]
        out[:, :, pix + QUESTION_DIM:] = patch_positions(n)
        return list(zip(torch.from_numpy(out), (y for _, _, y in got)))


class SortOfClevrConditionalDataset(SortOfClevrDataset):
    """The same items split by modality (NAC §4.4, App. G): ``({"x": image tokens [N, 3 p² + 2],
    "condition": question ids int64 [3]}, answer)``."""

    def item(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        img, q, y = self.question(index)
        x = torch.from_numpy(np.ascontiguousarray(image_tokens(img, self.patch_size)))
        return {"x": x, "condition": torch.from_numpy(condition_ids(*q))}, y


class SortOfClevrImageDataset(SortOfClevrDataset):
    """The same items for a set model with a question token (AiT §5.8): ``({"x": image float32
    [3, 75, 75] in [0, 1], "question": question vector float32 [1, 11]}, answer)``."""

    def __init__(self, split: str, seed: int, size, holdout: int = 0) -> None:
        super().__init__(split, seed, size, patch_size=IMAGE_SIZE, holdout=holdout)  # no tokens are cut: the model patchifies

    def item(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        img, q, y = self.question(index)
        x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))       # [3, 75, 75]
        return {"x": x, "question": torch.from_numpy(question_vector(*q))[None]}, y


DEFAULT_SIZE = {"train": 9_800, "val": 200, "test": 200}  # images (Santoro et al.: 10k images)


def build(split: str, seed: int = 0, size=None, patch_size: int = 5, holdout: int = 0) -> SortOfClevrDataset:
    """Sort-of-CLEVR split. ``size``: number of *images* (int or ``{split: n}``; 20 items each;
    default 9800/200/200). ``patch_size`` must divide 75; tokens are ``3·p² + 13`` wide.
    ``holdout``: colour-shape pairs omitted from the train split (NFM Table 7; module docstring)."""
    return SortOfClevrDataset(split, seed, DEFAULT_SIZE if size is None else size, patch_size, holdout)


def build_conditional(split: str, seed: int = 0, size=None, patch_size: int = 5,
                      holdout: int = 0) -> SortOfClevrConditionalDataset:
    """Conditional Sort-of-CLEVR split; parameters as :func:`build`. Image tokens are ``3·p² + 2`` wide."""
    return SortOfClevrConditionalDataset(split, seed, DEFAULT_SIZE if size is None else size, patch_size, holdout)


def build_image(split: str, seed: int = 0, size=None, holdout: int = 0) -> SortOfClevrImageDataset:
    """Sort-of-CLEVR split with the image and the question as separate inputs; ``size`` and
    ``holdout`` as :func:`build`."""
    return SortOfClevrImageDataset(split, seed, DEFAULT_SIZE if size is None else size, holdout)


def input_dim(patch_size: int = 5) -> int:
    return 3 * patch_size ** 2 + QUESTION_DIM + POS_DIM


def image_input_dim(patch_size: int = 5) -> int:
    """Width of the conditional task's image tokens (no question columns): ``3·p² + 2``."""
    return 3 * patch_size ** 2 + POS_DIM


def num_patches(patch_size: int) -> int:
    """Tokens per image, ``(75 / p)²`` (``p`` divides 75: :data:`PARAM_CHOICES`)."""
    return (IMAGE_SIZE // patch_size) ** 2


#: What the parameters accept (``TaskInfo.param_bounds`` / ``param_choices`` of every variant).
PARAM_BOUNDS = {**GENERATOR_BOUNDS, "holdout": Bounds(
    lo=0, hi=len(COLORS), integer=True,
    note="held-out colour-shape combinations, NFM Table 7; one shape per colour at most")}
PARAM_CHOICES = {"patch_size": Choices(tuple(p for p in range(1, IMAGE_SIZE + 1) if IMAGE_SIZE % p == 0),
                                       note=f"the divisors of the image side {IMAGE_SIZE}")}


def describe(params: dict) -> tuple[InputSpec, int]:
    """A set of ``(75/p)²`` tokens ``[3·p² + 13]`` (patch, question, position: the position is a
    feature, so the set is unordered); 10 answers."""
    return InputSpec.vectors(num_patches(params["patch_size"]), input_dim(params["patch_size"])), len(ANSWERS)


def describe_conditional(params: dict) -> tuple[dict[str, InputSpec], int]:
    """``x``: the set of ``(75/p)²`` image tokens ``[3·p² + 2]``; ``condition``: the question as
    ``CONDITION_LEN`` ids (colour, type, subtype), whose order is their meaning; 10 answers."""
    p = params["patch_size"]
    return {"x": InputSpec.vectors(num_patches(p), image_input_dim(p)),
            "condition": InputSpec.tokens(CONDITION_LEN, CONDITION_VOCAB_SIZE)}, len(ANSWERS)


def describe_image(params: dict) -> tuple[dict[str, InputSpec], int]:
    """``x``: the ``3 × 75 × 75`` image; ``question``: one 11-d question vector; 10 answers."""
    return {"x": InputSpec.image(3, IMAGE_SIZE, IMAGE_SIZE), "question": InputSpec.vectors(1, QUESTION_DIM)}, \
        len(ANSWERS)


def _non_relational(x: Tensor | Mapping[str, Tensor]) -> Tensor:
    return ~is_relational(x)


def _info(name: str, description: str, describe, *, patches: bool = True) -> TaskInfo:
    """The TaskInfo of every variant: same answers, splits, parameters (``patch_size`` where the
    task cuts tokens) and subsets."""
    return TaskInfo(
        name=name, kind="generator", description=description, describe=describe, loss="cross_entropy", metrics=("top1",), splits=("train", "val", "test"),
        params={"seed": 0, "size": dict(DEFAULT_SIZE), **({"patch_size": 5} if patches else {}), "holdout": 0},
        param_bounds=PARAM_BOUNDS, param_choices=PARAM_CHOICES if patches else {},
        subsets={"relational": is_relational, "non_relational": _non_relational}, class_names=ANSWERS,
    )


INFO = _info(
    "sort_of_clevr",
    ("Sort-of-CLEVR: answer one question (10 answers) about a 75x75 image of 6 coloured "
     "squares/circles. Input: 225 tokens = 5x5 patch (75) + question (11) + position (2). "
     "Report accuracy split by question kind (relational / non-relational): see "
     "modwire.tasks.synthetic.sort_of_clevr.accuracy_by_kind / is_relational. size counts images "
     "(20 items each); tokens are 3*patch_size**2 + 13 wide."),
    describe,
)
CONDITIONAL_INFO = _info(
    "sort_of_clevr_conditional",
    ("Sort-of-CLEVR for a conditional NAC (NAC 4.4 / App. G): the same items as sort_of_clevr, "
     "input {'x': 225 image tokens = 5x5 patch (75) + position (2), 'condition': the question as 3 "
     "ids (colour 0-5, type 6-7, subtype 8-13)}; 10 answers; relational / non-relational subsets. "
     "Image tokens are 3*patch_size**2 + 2 wide."),
    describe_conditional,
)
CONDITIONAL_INFO = dataclasses.replace(CONDITIONAL_INFO, categories=(question_type, QUESTION_TYPE_NAMES))

IMAGE_INFO = dataclasses.replace(_info(
    "sort_of_clevr_image",
    ("Sort-of-CLEVR for a set model with a question token (AiT 5.8): the same items as sort_of_clevr, "
     "input {'x': the 75x75 RGB image [3, 75, 75] in [0,1], 'question': the 11-d question vector [1, 11] "
     "(one-hot colour, type, subtype)}; 10 answers; relational / non-relational subsets."),
    describe_image, patches=False), categories=(question_type, QUESTION_TYPE_NAMES))

register_task(INFO, build)
register_task(CONDITIONAL_INFO, build_conditional)
register_task(IMAGE_INFO, build_image)
