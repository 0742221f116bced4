"""Analyses of the Associative Transformer (AiT) and of its ViT baseline (AiT §5.5-5.6, App. A.4,
A.6, A.7): what the paper's Figures 2, 7, 10 and 11 show, as numbers.

* **Attention sparsity** of self-attention heads (App. A.4, Eq. 9, Figure 7):
  :func:`attention_sparsity` scores one attention row by the smallest number ``s`` of patches
  whose ``s`` largest weights sum to at least 0.9; :func:`sparsity_scores` averages the scores of
  each head and patch over the samples of a loader ("the scores from different input samples were
  averaged"), giving per layer one distribution over patches per head; :func:`head_medians` gives
  the median ``s̄`` the paper prints and sorts the heads by.
* **Slot maps** (§5.5 "Prior specialization", Figure 2): :func:`slot_attention_maps` cuts each
  sample's patch tokens out of the bottleneck attention (Eq. 3, after top-k) and lays them on the
  patch grid: one map per memory slot and image.
* **Patch diversity** (§5.6, App. A.6, Figure 10): "the ratio of distinct patches in all the
  selected patches by the bottleneck attention", per bottleneck head (:func:`patch_diversity`),
  for a model over a loader (:func:`model_patch_diversity`) and over the checkpoints of a run
  (:func:`diversity_over_training`).
* **Hopfield energy** before and after retrieval (App. A.7, Eq. 7, Figure 11a):
  :func:`collect_energies` and :func:`energy_summary` (means, and the fraction of tokens whose
  energy decreased).

The AiT's records are ``AiTRecord.workspace`` (one :class:`~modwire.nn.workspace.WorkspaceRecord`
per layer; any object with the same fields works): ``weights [P, A, M, L]`` (``P`` = 1 for the
paper's squashed batch pool with pool position ``l = b·N + n``, ``P = B`` for the per-sample pool
with ``L = N``), ``energy_before`` / ``energy_after [B, N]`` and ``num_tokens`` ``N`` (weights are
None when the memory forward is off in evaluation, energies None without Hopfield retrieval: the
analyses needing them say so). Models run
in eval mode without gradients, so an AiT's stored memory is not changed (AiT §4.2). Plots are in
:mod:`modwire.analysis.plots` (matplotlib imported there, lazily).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..models.capabilities import Records
from ..errors import UserError, UserTypeError

__all__ = ["attention_sparsity", "slot_similarity", "checkpoint_dirs", "collect_energies", "diversity_counts",
           "diversity_over_training", "energy_summary", "head_medians", "model_patch_diversity",
           "patch_diversity", "pool_layout", "slot_attention_maps", "sparsity_scores"]


# ----------------------------------------------------------------------------- running a model

def _inputs(batch: Any) -> Any:
    """A loader item's inputs: ``(x, y)`` → ``x``; a bare tensor or dict is the input itself."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def _record(model: torch.nn.Module, batch: Any):
    """``model.forward_record`` on one batch (moved to the model's device), no gradients."""
    from ..training import to_device

    if not isinstance(model, Records):
        raise UserTypeError(f"expected a model with forward_record (a ViT or an AiT), got {type(model).__name__}")
    device = next(iter(model.parameters()), torch.empty(0)).device
    x = to_device(_inputs(batch), device)
    with torch.no_grad():
        return model.forward_record(**x) if isinstance(x, dict) else model.forward_record(x)


def _batches(batches: Iterable, max_batches: int | None) -> Iterable:
    if max_batches is not None and max_batches < 1:
        raise UserError(f"max_batches must be at least 1 (or None for all), got {max_batches}")
    for i, batch in enumerate(batches):
        if max_batches is not None and i >= max_batches:
            return
        yield batch


def _weights(record: Any) -> Tensor:
    """A record's bottleneck weights, or a ValueError when the write was skipped."""
    if record.weights is None:
        raise UserError("the workspace record has no bottleneck weights: the memory forward was off "
                        "(evaluation with memory_forward = False, AiT Figure 8 (2)); turn it on to analyse them")
    return record.weights


def _records(model: torch.nn.Module, batch: Any) -> list:
    """The workspace records (one per layer) of one forward, or a TypeError for a model without."""
    records = [r for r in getattr(_record(model, batch), "workspace", None) or [] if r is not None]
    if not records:                                   # not an AiT, or the "without memory" ablation
        raise UserTypeError(f"{type(model).__name__} records no global workspace (no AiTRecord.workspace record): "
                            f"expected an AiT with at least one workspace layer")
    return list(records)


# ----------------------------------------------------------------------------- App. A.4, Eq. 9

def attention_sparsity(weights: Tensor, mass: float = 0.9, *, tol: float | None = None) -> Tensor:
    """AiT App. A.4, Eq. 9: ``argmin_s Σ_{j≤s} A^{i,j} ≥ mass`` with the weights of row ``i`` in
    decreasing order, i.e. the smallest number of patches whose weights add up to ``mass``.

    ``weights [..., N]`` (a ViT layer's ``[B, H, N, N]``: row ``i`` is patch ``i``'s attention
    over the ``N`` patches, itself and any CLS token included, as the paper's 65 = 64 + 1) →
    ``[...]`` int64 scores in ``1..N`` (``[B, H, N]``). Vectorised: one sort and one cumulative sum.

    Ties do not matter (the sum of the ``s`` largest weights is the same whichever of equal
    weights are taken). The bound is inclusive, up to rounding: a partial sum within ``tol`` of
    ``mass`` reaches it (default ``N`` × the machine epsilon of the weights' dtype), so ten weights
    of 0.1 need 9 for 0.9 although nine 0.1 add up to 0.8999999999999999 in float64. A row whose
    total stays below ``mass`` (a masked row) scores ``N``."""
    if not 0.0 < mass <= 1.0:
        raise UserError(f"mass must be in (0, 1], got {mass}")
    if not weights.is_floating_point() or weights.dim() < 1 or weights.shape[-1] == 0:
        raise UserError(f"expected floating-point attention weights [..., N] with N >= 1, got "
                        f"{weights.dtype} of shape {tuple(weights.shape)}")
    n = weights.shape[-1]
    w = weights.detach().to(torch.float64)
    if torch.isnan(w).any() or (w < 0).any():
        raise UserError("attention weights must be non-negative and not NaN (softmax outputs)")
    if tol is None:
        tol = n * torch.finfo(weights.dtype).eps
    partial = w.sort(dim=-1, descending=True).values.cumsum(dim=-1)         # [..., N], non-decreasing
    short = (partial < mass - tol).sum(dim=-1)                                # prefixes below the mass
    return (short + 1).clamp_max(n)


def sparsity_scores(model: torch.nn.Module, batches: Iterable, *, mass: float = 0.9,
                    max_batches: int | None = None) -> list[Tensor]:
    """Eq. 9 scores of every self-attention head of ``model`` (a ViT, or an AiT's self-attention),
    averaged over the samples of ``batches`` (AiT App. A.4: "the scores from different input
    samples were averaged"): per layer a float64 ``[H, N]`` (head, patch ``i``) whose row ``h`` is
    the distribution Figure 7 draws for head ``h``. ``batches``: loader items ``(x, y)`` or inputs;
    at most ``max_batches`` of them."""
    sums: list[Tensor] | None = None
    count = 0
    model.eval()
    for batch in _batches(batches, max_batches):
        attention = _record(model, batch).propagator_attention
        if not attention:
            raise UserTypeError(f"{type(model).__name__} records no self-attention weights (propagator_attention)")
        scores = [attention_sparsity(a, mass).sum(dim=0, dtype=torch.float64).cpu() for a in attention]
        sums = scores if sums is None else [s + t for s, t in zip(sums, scores)]
        count += attention[0].shape[0]
    if sums is None:
        raise UserError("no batches to score: the loader is empty")
    return [s / count for s in sums]


def head_medians(scores: Tensor) -> Tensor:
    """The median ``s̄`` of each head's distribution (AiT Figure 7): ``[H, N]`` → ``[H]`` (the
    midpoint of the two middle values for an even ``N``)."""
    if scores.dim() != 2:
        raise UserError(f"expected per-head scores [H, N], got shape {tuple(scores.shape)}")
    return torch.quantile(scores.to(torch.float64), 0.5, dim=-1)


# ----------------------------------------------------------------------------- Figure 2

def pool_layout(record: Any) -> tuple[int, int]:
    """``(B, N)``: how many samples a record's pool holds and their tokens each. The squashed pool
    (``P = 1``) has ``L = B·N``; the per-sample pool ``P = B`` pools with ``L = N``."""
    w, n = _weights(record), int(record.num_tokens)
    if w.dim() != 4:
        raise UserError(f"expected bottleneck weights [P, A, M, L], got shape {tuple(w.shape)}")
    p, length = w.shape[0], w.shape[-1]
    if n < 1 or (p == 1 and length % n) or (p > 1 and length != n):
        raise UserError(f"bottleneck weights {tuple(w.shape)} do not fit num_tokens={n}: expected L = B*N "
                        f"with one pool (P = 1), or L = N with one pool per sample (P = B)")
    return (length // n, n) if p == 1 else (p, n)


def _per_sample(record: Any) -> Tensor:
    """The bottleneck weights per sample ``[B, A, M, N]`` (squashed pool position ``b·N + n``)."""
    b, n = pool_layout(record)
    w = _weights(record).detach().float()
    if w.shape[0] == 1:
        return w[0].unflatten(-1, (b, n)).permute(2, 0, 1, 3)          # [A, M, B, N] → [B, A, M, N]
    return w


def slot_attention_maps(record: Any, grid: tuple[int, int], *, head: int | None = None,
                        samples: Sequence[int] | None = None) -> Tensor:
    """AiT Figure 2: each memory slot's bottleneck attention (Eq. 3, after top-k: 0 where a patch
    was not selected) over each image's patches, ``[S, M, rows, cols]``.

    For sample ``b`` of the squashed pool the weights are ``weights[0, :, :, b·N:(b+1)·N]``, of the
    per-sample pool ``weights[b]``. ``head``: one bottleneck head, or None for the mean over heads.
    Tokens past the ``rows·cols`` patches (a question token, CLS tokens: appended after them) are
    dropped. ``samples``: which samples (default all ``B``)."""
    rows, cols = grid
    w = _per_sample(record)                                             # [B, A, M, N]
    if rows * cols > w.shape[-1]:
        raise UserError(f"a {rows}x{cols} patch grid needs {rows * cols} tokens, the pool has {w.shape[-1]} "
                        f"per sample")
    if head is not None and not -w.shape[1] <= head < w.shape[1]:
        raise UserError(f"head {head} out of range: the workspace has {w.shape[1]} bottleneck heads")
    w = w[..., : rows * cols]
    maps = w.mean(dim=1) if head is None else w[:, head]                # [B, M, rows·cols]
    if samples is not None:
        bad = [s for s in samples if not 0 <= s < maps.shape[0]]
        if bad:
            raise UserError(f"samples {bad} out of range: the pool holds {maps.shape[0]} samples")
        maps = maps[list(samples)]
    return maps.unflatten(-1, (rows, cols))


# ----------------------------------------------------------------------------- §5.6, Figure 10

def slot_similarity(memory: Tensor) -> float:
    """Mean cosine similarity between distinct slots of one memory ``γ [M, D]``: 1 when every slot
    points the same way (the memory has collapsed), about 0 for unrelated slots."""
    g = torch.nn.functional.normalize(memory.detach().double(), dim=-1)
    s = g @ g.T                                                             # [M, M]
    m = len(s)
    return float((s.sum() - s.diagonal().sum()) / (m * m - m))


def diversity_counts(weights: Tensor) -> tuple[Tensor, Tensor]:
    """``(distinct, total)`` int64 ``[A]`` of the bottleneck selection ``weights [P, A, M, L]``
    (selected = weight > 0): ``distinct``, pool positions selected by at least one slot of the
    head; ``total``, (slot, position) selections. Pools are added up (each is its own competition,
    so their positions are distinct from each other's)."""
    if weights.dim() != 4:
        raise UserError(f"expected bottleneck weights [P, A, M, L], got shape {tuple(weights.shape)}")
    selected = weights.detach() > 0
    return selected.any(dim=2).sum(dim=(0, 2)).cpu(), selected.sum(dim=(0, 2, 3)).cpu()


def patch_diversity(record: Any) -> Tensor:
    """AiT §5.6 / App. A.6: "the ratio of distinct patches in all the selected patches by the
    bottleneck attention", per bottleneck head: float64 ``[A]``, ``distinct / total`` (see
    :func:`diversity_counts`); 1 when no two slots share a patch, ``1/M`` when all ``M`` slots
    select the same patches; NaN for a head that selected nothing. ``record``: a workspace
    record or its ``weights [P, A, M, L]``."""
    weights = record if isinstance(record, Tensor) else _weights(record)
    distinct, total = diversity_counts(weights)
    return distinct.double() / total.double()


def model_patch_diversity(model: torch.nn.Module, batches: Iterable, *,
                          max_batches: int | None = None) -> Tensor:
    """The patch diversity of every workspace layer of an AiT over ``batches``: float64
    ``[layers, A]``, the distinct and total counts of each batch's pool added up (the mean of
    the per-batch ratios when every batch selects as many patches)."""
    distinct = total = None
    model.eval()
    for batch in _batches(batches, max_batches):
        counts = [diversity_counts(_weights(r)) for r in _records(model, batch)]
        d, t = torch.stack([c[0] for c in counts]), torch.stack([c[1] for c in counts])
        distinct, total = (d, t) if distinct is None else (distinct + d, total + t)
    if distinct is None:
        raise UserError("no batches to measure: the loader is empty")
    return distinct.double() / total.double()


def checkpoint_dirs(run: str | os.PathLike) -> list[Path]:
    """The checkpoint directories of a run (``<run>/checkpoints/<tag>-<step>/`` holding weights),
    one per step (``best-<s>`` and ``last-<s>`` hold the same model weights; the first name is
    kept), in order of step. The trainer keeps only ``best`` and ``last``; checkpoints saved
    elsewhere can be passed to :func:`diversity_over_training` directly."""
    from ..models.base import WEIGHTS_FILE
    from ..training.checkpoint import checkpoint_step

    root = Path(run) / "checkpoints"
    if not root.is_dir():
        raise FileNotFoundError(f"no checkpoints/ directory in {run}: expected a training run directory")
    found = {p.resolve() for p in root.iterdir()
             if not p.name.startswith(".") and (p / WEIGHTS_FILE).is_file()}
    if not found:
        raise FileNotFoundError(f"{root} holds no checkpoint (a directory with {WEIGHTS_FILE})")
    by_step: dict[int, Path] = {}
    for p in sorted(found, key=lambda p: (checkpoint_step(p) or 0, p.name)):
        by_step.setdefault(checkpoint_step(p) or 0, p)
    return list(by_step.values())


def diversity_over_training(checkpoints: str | os.PathLike | Sequence[Any], batches: Iterable, *,
                            max_batches: int | None = None) -> list[tuple[int | None, Tensor]]:
    """AiT Figure 10 as numbers: the patch diversity (``[layers, A]``, :func:`model_patch_diversity`)
    of each checkpoint, ``[(step, diversity), ...]`` in order. ``checkpoints``: a run directory
    (:func:`checkpoint_dirs`), or a sequence of checkpoint directories and / or models (a model's
    step is its position in the sequence). ``batches`` is iterated once per checkpoint."""
    from ..models import from_pretrained
    from ..training.checkpoint import checkpoint_step

    items = checkpoint_dirs(checkpoints) if isinstance(checkpoints, (str, os.PathLike)) else list(checkpoints)
    if not items:
        raise UserError("no checkpoints or models given")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, torch.nn.Module):
            model, step = item, i
        else:
            model, step = from_pretrained(item), checkpoint_step(Path(item).resolve())
        out.append((step, model_patch_diversity(model, batches, max_batches=max_batches)))
    return out


# ----------------------------------------------------------------------------- App. A.7, Figure 11

def collect_energies(model: torch.nn.Module, batches: Iterable, *,
                     max_batches: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """The Hopfield energy (AiT Eq. 7) of every token before and after retrieval (Eq. 8), per
    workspace layer of an AiT: ``[(before [S, N], after [S, N]), ...]`` over the ``S`` samples of
    ``batches`` (float64, on the CPU)."""
    parts: list[list[tuple[Tensor, Tensor]]] = []
    model.eval()
    for batch in _batches(batches, max_batches):
        records = _records(model, batch)
        if any(r.energy_before is None or r.energy_after is None for r in records):
            raise UserError("the workspace records no Hopfield energies: its retrieval is not the Hopfield "
                            "network of AiT Eq. 7-8 (retrieval='attention', the Table 2 'W/O Hopfield' ablation)")
        parts.append([(r.energy_before.detach().double().cpu(), r.energy_after.detach().double().cpu())
                      for r in records])
    if not parts:
        raise UserError("no batches to measure: the loader is empty")
    return [(torch.cat([p[k][0] for p in parts]), torch.cat([p[k][1] for p in parts])) for k in range(len(parts[0]))]


def energy_summary(energies: Sequence[Any]) -> list[dict[str, float]]:
    """Per layer: ``mean_before``, ``mean_after`` (AiT Eq. 7, over tokens), ``mean_change``
    (after − before; negative when retrieval lowers the energy, as App. A.7 expects),
    ``fraction_decreased`` (tokens whose energy went strictly down) and ``tokens``.
    ``energies``: ``(before, after)`` pairs (:func:`collect_energies`) or workspace records."""
    out = []
    for item in energies:
        before, after = item if isinstance(item, tuple) else (item.energy_before, item.energy_after)
        if before is None or after is None:
            raise UserError("no Hopfield energies recorded (retrieval='attention', Table 2 'W/O Hopfield')")
        before, after = before.detach().double().flatten(), after.detach().double().flatten()
        if before.shape != after.shape or before.numel() == 0:
            raise UserError(f"energies before {tuple(before.shape)} and after {tuple(after.shape)} retrieval "
                            f"must have the same, non-zero number of tokens")
        out.append({"mean_before": before.mean().item(), "mean_after": after.mean().item(),
                    "mean_change": (after - before).mean().item(),
                    "fraction_decreased": (after < before).double().mean().item(), "tokens": before.numel()})
    return out

