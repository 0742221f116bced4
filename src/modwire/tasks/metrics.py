"""Metrics, computed from a whole split's predictions (not averaged per batch).

``top1`` / ``top5``: accuracy of logits ``[N, C]`` against labels ``[N]``. ``r2``: coefficient of
determination of predictions ``[N]`` / ``[N, F]``; with ``F > 1`` outputs per sample (one per
CLS token, e.g. Fuzzy Boolean's functions) the mean over outputs of the per-output R², and
``r2_std`` its standard deviation over outputs (NI Table 1 reports both).

Sequence targets (task loss ``token_cross_entropy``: logits ``[N, T, V]``, next-token ids ``[N, T]``,
id ``IGNORE_INDEX`` = -100 not scored): ``perplexity`` = ``exp`` of the mean token cross-entropy
(natural log) over every scored token of the split, ``token_top1`` the fraction of tokens whose
target is the arg-max. Both follow from three additive sums (:func:`token_sums`), so an
evaluation can accumulate them batch by batch instead of holding ``N·T·V`` logits.
``LOWER_IS_BETTER`` names the metrics whose best value is the smallest (perplexity).

``exact_match`` / ``label_accuracy``: multi-label logits ``[N, C]`` (class ``c`` predicted present
when its logit is > 0, i.e. sigmoid > 0.5) against 0/1 targets ``[N, C]``: the fraction of rows
with all ``C`` labels right (NFM Table 5's accuracy on multi-digit images), and the fraction of
all ``N·C`` labels right.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import UnknownNameError, UserError

IGNORE_INDEX = -100
LOWER_IS_BETTER = frozenset({"perplexity"})


def topk_accuracy(logits: Tensor, targets: Tensor, k: int = 1) -> float:
    """Fraction of rows whose target is among the k largest logits. logits [N, C], targets [N]."""
    k = min(k, logits.shape[-1])
    return (logits.topk(k, dim=-1).indices == targets[:, None]).any(-1).float().mean().item()


def r2_per_column(pred: Tensor, target: Tensor) -> Tensor:
    """R² of each output column, float64 ``[F]``: ``1 - SS_res / SS_tot`` per column of
    ``pred, target [N, F]`` (``[N]`` or ``[N, 1]``: one column)."""
    target = target.reshape(pred.shape) if target.numel() == pred.numel() else target
    pred, target = pred.double().reshape(pred.shape[0], -1), target.double().reshape(target.shape[0], -1)
    ss_res = ((target - pred) ** 2).sum(0)
    ss_tot = ((target - target.mean(0)) ** 2).sum(0)
    # a constant target column (a one-sample split, a constant function) has SS_tot = 0: R² is
    # 1 for an exact fit, else 0, as scikit-learn's force_finite, instead of a silent inf / NaN
    exact = torch.where(ss_res == 0, torch.ones_like(ss_res), torch.zeros_like(ss_res))
    return torch.where(ss_tot == 0, exact, 1 - ss_res / torch.where(ss_tot == 0, torch.ones_like(ss_tot), ss_tot))


def r2_score(pred: Tensor, target: Tensor) -> float:
    """Coefficient of determination. One output column (``[N]``, ``[N, 1]``): ``1 - SS_res /
    SS_tot`` over all rows. Several (``[N, F]``, e.g. the ``F`` functions of Fuzzy Boolean, NI
    §4.1): the mean over columns of each column's R² (scikit-learn's
    ``r2_score(multioutput="uniform_average")``; NI Table 1's "mean R² over tasks"), not one R²
    of all values pooled, which would credit a model for the spread between functions."""
    return r2_per_column(pred, target).mean().item()


def r2_std(pred: Tensor, target: Tensor) -> float:
    """Standard deviation over output columns of their R² (NI Table 1's "± StdDev over tasks";
    population form, ``ddof = 0``); 0 for one column."""
    return r2_per_column(pred, target).std(unbiased=False).item()


def token_sums(logits: Tensor, targets: Tensor) -> Tensor:
    """float64 ``[3]``: (sum of token cross-entropies, scored tokens, correct arg-max tokens) of
    logits ``[..., V]`` against ids ``[...]`` (``IGNORE_INDEX`` not scored)."""
    if logits.dim() != targets.dim() + 1 or logits.shape[:-1] != targets.shape or targets.dtype.is_floating_point:
        raise UserError(f"token metrics expect logits [..., V] and integer targets [...] of the same leading "
                        f"shape, got logits {list(logits.shape)} and targets {list(targets.shape)} ({targets.dtype})")
    flat, y = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    scored = y != IGNORE_INDEX
    ce = F.cross_entropy(flat, y, ignore_index=IGNORE_INDEX, reduction="sum")
    correct = ((flat.argmax(-1) == y) & scored).sum()
    return torch.stack([ce.double(), scored.sum().double(), correct.double()]).cpu()


TOKEN_METRICS = {
    "perplexity": lambda s: math.exp(min(s[0].item() / max(s[1].item(), 1.0), 700.0)),  # exp(700) ~ 1e304
    "token_top1": lambda s: s[2].item() / max(s[1].item(), 1.0),
}


def token_metrics(names: tuple[str, ...], sums: Tensor) -> dict[str, float]:
    """``{"loss": mean token CE, name: value}`` from :func:`token_sums` (summed over batches)."""
    unknown = [n for n in names if n not in TOKEN_METRICS]
    if unknown:
        raise UnknownNameError(f"unknown token metric(s) {unknown}; valid: {sorted(TOKEN_METRICS)}")
    if sums[1].item() == 0:          # not perplexity 1: nothing was scored
        raise UserError(f"token metrics: no target token was scored (every target is IGNORE_INDEX={IGNORE_INDEX})")
    return {"loss": sums[0].item() / max(sums[1].item(), 1.0), **{n: TOKEN_METRICS[n](sums) for n in names}}


def _multilabel_correct(logits: Tensor, targets: Tensor) -> Tensor:
    """bool ``[N, C]``: whether each label's prediction (logit > 0) matches its 0/1 target."""
    if logits.shape != targets.shape or logits.dim() != 2:
        raise UserError(f"multi-label metrics need logits and targets of the same shape [N, C], got "
                        f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    return (logits > 0) == (targets > 0.5)


def exact_match(logits: Tensor, targets: Tensor) -> float:
    """Fraction of rows whose every label is right. logits, targets ``[N, C]``."""
    return _multilabel_correct(logits, targets).all(-1).float().mean().item()


def label_accuracy(logits: Tensor, targets: Tensor) -> float:
    """Fraction of the ``N·C`` labels that are right. logits, targets ``[N, C]``."""
    return _multilabel_correct(logits, targets).float().mean().item()


METRICS = {
    "top1": lambda out, y: topk_accuracy(out, y, 1),
    "top5": lambda out, y: topk_accuracy(out, y, 5),
    "r2": r2_score,
    "r2_std": r2_std,
    **{name: (lambda out, y, f=f: f(token_sums(out, y))) for name, f in TOKEN_METRICS.items()},
    "exact_match": exact_match,
    "label_accuracy": label_accuracy,
}


def compute_metrics(names: tuple[str, ...], outputs: Tensor, targets: Tensor) -> dict[str, float]:
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise UnknownNameError(f"unknown metric(s) {unknown}; valid: {sorted(METRICS)}")
    return {n: METRICS[n](outputs, targets) for n in names}


