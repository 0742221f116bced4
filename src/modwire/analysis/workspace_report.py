"""The workspace analyses of a trained AiT as one report (AiT Figures 2, 7, 10, 11): what
``modwire analyze`` writes for a model with global-workspace layers
(:class:`~modwire.models.capabilities.HasWorkspace`) and what ``modwire.experiments.ait_analysis`` runs.

:func:`workspace_summary` gives, on a list of loader batches of the run's split (the squashed pool
competes within a batch, so the batch size matters):

* ``slot_maps``: every memory slot's bottleneck attention over the patches of the first images
  (AiT Figure 2b; one workspace layer, mean over bottleneck heads unless ``head``);
* ``diversity``: the patch diversity, distinct / selected patches of the bottleneck (§5.6,
  Figure 10), of every checkpoint the run kept (``best``, ``last``, ``weights-<step>``), per layer;
* ``energy``: the Hopfield energy (Eq. 7) of the tokens before and after retrieval (Figure 11a);
* ``sparsity``: the attention sparsity of each self-attention head (App. A.4, Eq. 9, Figure 7);
* ``slot_cosine``: the mean cosine similarity between the memory slots of each layer
  (:func:`~modwire.analysis.workspace.slot_similarity`; 1: collapsed);
* ``memory_unchanged``: whether the analyses left the stored memory as it was (AiT §4.2).

A part the model cannot give (no bottleneck weights with the memory forward off, no energies
without Hopfield retrieval, no patch grid, no self-attention) is reported under ``skipped`` with
the reason. The measurements are in :mod:`modwire.analysis.workspace`, the pictures in
:mod:`modwire.analysis.plots` (only with ``plots``).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError, UserTypeError
from ..models.capabilities import HasWorkspace
from .workspace import (_inputs, _records, checkpoint_dirs, collect_energies, diversity_over_training, energy_summary,
                        head_medians, slot_attention_maps, slot_similarity, sparsity_scores)

__all__ = ["buffers", "finite", "slot_map_summary", "sparsity_lines", "sparsity_summary", "workspace_lines",
           "workspace_summary"]


def buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every buffer (an AiT's memory slots among them)."""
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def finite(x: Any) -> Any:
    """Lists / floats with NaN and infinities as None (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    return x


def sparsity_summary(model: torch.nn.Module, batches: Sequence, out: Path, name: str, mass: float = 0.9,
                     plots: bool = True) -> dict[str, Any]:
    """AiT Figure 7 for one model (an AiT's or a ViT's self-attention): per layer, each head's
    median Eq. 9 score (heads in order); ``plots``: the violins as ``out/<name>_sparsity.png``."""
    scores = sparsity_scores(model, batches, mass=mass)
    if plots:
        from .plots import plot_attention_sparsity

        plot_attention_sparsity(scores, Path(out) / f"{name}_sparsity.png",
                                title=f"{name.upper()}: patches for {mass:g} of each row's attention (Eq. 9)")
    return {"tokens": scores[0].shape[-1], "mass": mass,
            "median_per_head": [head_medians(s).tolist() for s in scores]}


def slot_map_summary(model: torch.nn.Module, records: list, x: torch.Tensor, out: Path, *, layer: int = 0,
                     head: int | None = None, images: int = 4, plots: bool = True) -> dict[str, Any]:
    """AiT Figure 2b for the first ``images`` samples of one batch (``x``, its ``records``): which
    patches each slot selected (``selected_per_slot``); ``plots``: ``out/slot_maps.png``."""
    grid = model.embed.grid
    if grid is None:
        raise ValueError("slot maps need a model reading image patches")
    if not -len(records) <= layer < len(records):
        raise ValueError(f"--layer {layer} out of range: the model has {len(records)} workspace layers")
    shown = list(range(min(images, len(x))))
    maps = slot_attention_maps(records[layer], grid, head=head, samples=shown).cpu()
    if plots:
        from .plots import plot_slot_maps

        which = "mean over heads" if head is None else f"head {head}"
        plot_slot_maps(maps, Path(out) / "slot_maps.png", images=x[shown].cpu() if x.dim() == 4 else None,
                       title=f"bottleneck attention per memory slot, layer {layer % len(records) + 1} ({which})")
    return {"layer": layer % len(records), "head": head, "grid": list(grid),
            "selected_per_slot": (maps > 0).sum(dim=(-1, -2)).tolist()}


def _samples(batch: Any) -> int:
    x = _inputs(batch)
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def workspace_summary(model: torch.nn.Module, batches: Sequence, out: str | os.PathLike, *,
                      run: str | os.PathLike, checkpoints: Sequence[str | os.PathLike] = (), layer: int = 0,
                      head: int | None = None, images: int = 4, mass: float = 0.9, self_sparsity: bool = True,
                      plots: bool = True) -> dict[str, Any]:
    """Slot maps, patch diversity over the checkpoints of ``run`` (plus ``checkpoints``), Hopfield
    energies, self-attention sparsity and slot similarity of an AiT (module docstring), on
    ``batches`` (loader batches ``(x, y)``); the PNGs go to ``out`` when ``plots``."""
    out = Path(out)
    batches = list(batches)
    if not batches:
        raise UserError("no batches to analyse: the split is empty")
    records = _records(model, batches[0])              # UserTypeError: no workspace (not an AiT, or without memory)
    if not isinstance(model, HasWorkspace):
        raise UserTypeError(f"{type(model).__name__} declares no workspace layers (modwire.models.capabilities"
                            f".HasWorkspace)")
    before = buffers(model)
    result: dict[str, Any] = {"run": str(run), "samples": sum(_samples(b) for b in batches),
                              "layers": len(records), "skipped": {}}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            result[name] = fn()
        except (ValueError, TypeError) as e:          # what this model does not record
            result["skipped"][name] = str(e)

    x = _inputs(batches[0])
    attempt("slot_maps", lambda: slot_map_summary(model, records, x, out, layer=layer, head=head, images=images,
                                                  plots=plots))
    history: list = []
    attempt("diversity", lambda: _diversity(history, [*checkpoint_dirs(run), *map(Path, checkpoints)], batches))
    energies: list = []
    attempt("energy", lambda: _energy(energies, collect_energies(model, batches)))
    if plots:
        from .plots import plot_energy, plot_patch_diversity

        if history:
            plot_patch_diversity(history, out / "diversity.png")
        if energies:
            plot_energy(energies, out / "energy.png")
    if self_sparsity:
        attempt("sparsity", lambda: sparsity_summary(model, batches, out, "ait", mass, plots))
    result["slot_cosine"] = [slot_similarity(w.memory) for w in model.workspaces]   # 1: collapsed
    result["memory_unchanged"] = all(torch.equal(v, buffers(model)[k]) for k, v in before.items())
    return result


def _diversity(history: list, checkpoints: list[Path], batches: list) -> list[dict]:
    history.extend(diversity_over_training(checkpoints, batches))
    return [{"step": step, "per_head": d.tolist(), "mean": d.nanmean(dim=-1).tolist()} for step, d in history]


def _energy(energies: list, collected: list) -> list[dict]:
    energies.extend(collected)
    return energy_summary(energies)


def workspace_lines(ait: dict[str, Any]) -> list[str]:
    """A few lines a person reads from :func:`workspace_summary`: diversity per checkpoint, energy
    change, slot similarity, what was skipped, whether the memory was left unchanged."""
    lines = []
    for d in ait.get("diversity", []):
        lines.append(f"patch diversity at step {d['step']}: " + ", ".join(
            f"layer {k + 1} {v:.3f}" for k, v in enumerate(d["mean"])))
    for k, e in enumerate(ait.get("energy", [])):
        lines.append(f"layer {k + 1} Hopfield energy {e['mean_before']:.3f} -> {e['mean_after']:.3f} "
                     f"({100 * e['fraction_decreased']:.1f}% of tokens lower)")
    if "slot_cosine" in ait:
        lines.append("mean cosine between memory slots: " + ", ".join(
            f"layer {k + 1} {c:.3f}" for k, c in enumerate(ait["slot_cosine"])))
    lines += [f"skipped {name}: {why}" for name, why in ait["skipped"].items()]
    lines.append(f"memory unchanged by the analysis: {ait['memory_unchanged']}")
    return lines


def sparsity_lines(name: str, s: dict[str, Any]) -> list[str]:
    """Per layer, the sorted head medians of :func:`sparsity_summary` (AiT Figure 7)."""
    return [f"{name.upper()} layer {k + 1} median patches for {s['mass']:g} of attention (of {s['tokens']}): "
            + " ".join(f"{m:.3g}" for m in sorted(med)) for k, med in enumerate(s["median_per_head"])]
