"""Metrics, computed from a whole split's predictions (not averaged per batch)."""
from __future__ import annotations

from torch import Tensor


def topk_accuracy(logits: Tensor, targets: Tensor, k: int = 1) -> float:
    """Fraction of rows whose target is among the k largest logits. logits [N, C], targets [N]."""
    k = min(k, logits.shape[-1])
    return (logits.topk(k, dim=-1).indices == targets[:, None]).any(-1).float().mean().item()


def r2_score(pred: Tensor, target: Tensor) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` over all elements."""
    pred, target = pred.reshape(-1).double(), target.reshape(-1).double()
    ss_res = ((target - pred) ** 2).sum()
    ss_tot = ((target - target.mean()) ** 2).sum()
    return (1 - ss_res / ss_tot).item()


METRICS = {
    "top1": lambda out, y: topk_accuracy(out, y, 1),
    "top5": lambda out, y: topk_accuracy(out, y, 5),
    "r2": r2_score,
}


def compute_metrics(names: tuple[str, ...], outputs: Tensor, targets: Tensor) -> dict[str, float]:
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise KeyError(f"unknown metric(s) {unknown}; valid: {sorted(METRICS)}")
    return {n: METRICS[n](outputs, targets) for n in names}


