"""Batch-level Mixup / CutMix with label smoothing, and the soft-target loss they need
(DeiT / NAC App. C: mixup alpha 0.8, cutmix alpha 1.0, label smoothing 0.1)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .transforms import _need, _randint
from ...errors import UserError

__all__ = ["MixParams", "MixupCutmix", "smooth_one_hot", "soft_target_cross_entropy"]


def _beta(g: torch.Generator, a: float, b: float) -> float:
    """Beta(a, b) sample; torch's Beta takes no generator, so numpy is seeded from ``g``."""
    seed = int(torch.randint(0, 2**62, (), generator=g).item())
    return float(np.random.default_rng(seed).beta(a, b))


def smooth_one_hot(y: Tensor, num_classes: int, smoothing: float = 0.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Label-smoothed one-hot targets ``[B, num_classes]`` for labels ``y [B]``:
    ``1 - smoothing + smoothing / num_classes`` on the label, ``smoothing / num_classes`` elsewhere."""
    off = smoothing / num_classes
    out = torch.full((y.shape[0], num_classes), off, dtype=dtype, device=y.device)
    return out.scatter_(1, y.long()[:, None], 1 - smoothing + off)


def soft_target_cross_entropy(logits: Tensor, soft_targets: Tensor, reduction: str = "mean") -> Tensor:
    """``-sum_c t_c log softmax(logits)_c`` per row; logits and soft_targets ``[B, C]``.
    ``reduction``: ``"mean"`` (scalar), ``"sum"`` or ``"none"`` (``[B]``)."""
    loss = -(soft_targets * F.log_softmax(logits, dim=-1)).sum(-1)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise UserError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


@dataclass(frozen=True)
class MixParams:
    """One batch's mixing draw. ``mode``: ``"none"``, ``"mixup"`` or ``"cutmix"``; ``lam``:
    weight of the un-flipped batch (for cutmix: 1 - box area fraction); ``box``:
    ``(y0, y1, x0, x1)`` pasted from the flipped batch (cutmix only); ``order``: the partner of
    each sample, ``[B]`` (``pairing="permutation"``; None: the batch flipped along dim 0)."""

    mode: str
    lam: float
    box: tuple[int, int, int, int] | None = None
    order: Tensor | None = None


class MixupCutmix:
    """Batch-level Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019) with label smoothing.

    With probability ``prob`` the batch is mixed with itself flipped along dim 0 (sample
    ``i`` with sample ``B - 1 - i``): CutMix with probability ``switch_prob`` (when both
    alphas are > 0), else Mixup. ``lam ~ Beta(alpha, alpha)``; for CutMix a box of area
    ``(1 - lam) H W`` centred uniformly at random is clipped to the image and ``lam`` is
    recomputed from the clipped area. Targets: ``lam * smooth(y) + (1 - lam) * smooth(y.flip(0))``.
    ``x [B, C, H, W], y [B] -> (x_mixed [B, C, H, W], y_soft [B, num_classes])``; inputs are not modified.
    Defaults are DeiT's (NAC App. C). ``pairing="permutation"`` pairs sample ``i`` with sample
    ``perm[i]`` of a random permutation instead (Verma et al.'s Input Mixup, NFM Table 2: ``mixup_alpha
    1.0, cutmix_alpha 0``). The last draw is kept in ``last_params``.
    """

    PAIRINGS = ("flip", "permutation")

    def __init__(self, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, prob: float = 1.0,
                 switch_prob: float = 0.5, label_smoothing: float = 0.1, *, num_classes: int,
                 pairing: str = "flip"):
        if pairing not in self.PAIRINGS:
            raise UserError(f"MixupCutmix pairing: got {pairing!r}, expected one of {list(self.PAIRINGS)}")
        self.mixup_alpha, self.cutmix_alpha, self.prob = mixup_alpha, cutmix_alpha, prob
        self.switch_prob, self.label_smoothing, self.num_classes = switch_prob, label_smoothing, num_classes
        self.pairing = pairing
        self.last_params: MixParams | None = None

    def sample_params(self, height: int, width: int, generator: torch.Generator) -> MixParams:
        """Draw the mixing mode, ``lam`` and (for CutMix) the box for ``height x width`` images."""
        g = generator
        if torch.rand((), generator=g).item() >= self.prob:
            return MixParams("none", 1.0)
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = torch.rand((), generator=g).item() < self.switch_prob
        elif self.cutmix_alpha > 0:
            use_cutmix = True
        elif self.mixup_alpha > 0:
            use_cutmix = False
        else:
            return MixParams("none", 1.0)
        if not use_cutmix:
            return MixParams("mixup", _beta(g, self.mixup_alpha, self.mixup_alpha))
        lam = _beta(g, self.cutmix_alpha, self.cutmix_alpha)
        cut = math.sqrt(1 - lam)
        cut_h, cut_w = int(height * cut), int(width * cut)
        cy, cx = _randint(g, 0, height), _randint(g, 0, width)
        y0, y1 = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
        x0, x1 = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
        lam = 1 - (y1 - y0) * (x1 - x0) / (height * width)
        return MixParams("cutmix", lam, (y0, y1, x0, x1))

    def apply(self, x: Tensor, y: Tensor, params: MixParams) -> tuple[Tensor, Tensor]:
        """Mix ``x`` and build soft targets for a given draw."""
        y1 = smooth_one_hot(y, self.num_classes, self.label_smoothing)
        if params.mode == "none":
            return x, y1
        partner = (lambda t: t.flip(0)) if params.order is None else (lambda t: t[params.order.to(t.device)])
        if params.mode == "mixup":
            x = params.lam * x + (1 - params.lam) * partner(x)
        else:
            y0, y1_, x0, x1 = params.box
            patch = partner(x[..., y0:y1_, x0:x1])                   # only the box of the partner images
            x = x.clone()
            x[..., y0:y1_, x0:x1] = patch
        y2 = smooth_one_hot(partner(y), self.num_classes, self.label_smoothing)
        return x, params.lam * y1 + (1 - params.lam) * y2

    def __call__(self, x: Tensor, y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        g = _need(generator)
        params = self.sample_params(x.shape[-2], x.shape[-1], g)
        if self.pairing == "permutation" and params.mode != "none":
            params = replace(params, order=torch.randperm(x.shape[0], generator=g))
        self.last_params = params
        return self.apply(x, y, params)

    def __repr__(self) -> str:
        return (f"MixupCutmix(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, prob={self.prob}, "
                f"switch_prob={self.switch_prob}, label_smoothing={self.label_smoothing}, "
                f"num_classes={self.num_classes}, pairing={self.pairing!r})")
