"""The Associative Transformer's analyses on trained runs (AiT Figures 2, 7, 10, 11).

Given an AiT run directory (``modwire train`` of an ``ait_*`` config) and / or a ViT run, this
writes into ``--out`` (default ``experiments/results/ait_analysis``):

* ``slot_maps.png``: every memory slot's bottleneck attention over the patches of the first
  ``--images`` validation images (AiT Figure 2b; layer ``--layer``, mean over bottleneck heads
  unless ``--head``);
* ``diversity.png``: the patch diversity, distinct / selected patches of the bottleneck (§5.6,
  Figure 10), of every checkpoint of the run (the trainer keeps ``best`` and ``last``; more with
  ``--checkpoints``), per layer, against the training step;
* ``energy.png``: the Hopfield energy (Eq. 7) of the tokens before and after retrieval (Figure 11a);
* ``ait_sparsity.png`` / ``vit_sparsity.png``: the attention sparsity (App. A.4, Eq. 9: patches
  needed for 90% of a row's attention, averaged over samples) of each self-attention head as
  violins, heads sorted by median (Figure 7);
* ``summary.json``: the numbers behind the figures (per-head diversity and medians, energy means
  and the fraction of tokens whose energy decreased) and whether evaluation left the memory as it
  was (AiT §4.2: it must).

Everything runs on the first ``--samples`` samples of the run's validation split, in batches of
the run's batch size (the squashed pool competes within a batch; ``--batch-size`` to change it),
on the CPU, in eval mode. Seconds for the micro / CPU configs. Usage::

    python experiments/ait_analysis.py RUNS/ait_run --vit RUNS/vit_run [--samples 256] [--head 0]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def load(path: str, samples: int, batch_size: int | None) -> tuple[Any, torch.nn.Module, list]:
    """A run's ``(cfg, model, batches)``: its model (eval mode, CPU) and the first ``samples``
    samples of its validation split as a list of loader batches ``(x, y)``."""
    from modwire.analysis.runs import load_run
    from modwire.tasks.base import FirstN
    from modwire.training import make_loader

    cfg, model, info, dataset = load_run(path)
    dataset = FirstN(dataset, min(samples, len(dataset)))
    if len(dataset) == 0:
        raise ValueError(f"{path}: the validation split is empty")
    loader = make_loader(dataset, batch_size or cfg.data.batch_size, None, info, 0, drop_last=False)
    return cfg, model, list(loader)


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def _finite(x: Any) -> Any:
    """Lists / floats with NaN and infinities as None (JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return x


def sparsity(model: torch.nn.Module, batches: list, out: Path, name: str, mass: float, plots: bool) -> dict:
    """Figure 7 for one model: per layer, each head's median Eq. 9 score (heads in order)."""
    from modwire.analysis.workspace import head_medians, sparsity_scores

    scores = sparsity_scores(model, batches, mass=mass)
    if plots:
        from modwire.analysis.plots import plot_attention_sparsity

        plot_attention_sparsity(scores, out / f"{name}_sparsity.png",
                                title=f"{name.upper()}: patches for {mass:g} of each row's attention (Eq. 9)")
    return {"tokens": scores[0].shape[-1], "mass": mass,
            "median_per_head": [head_medians(s).tolist() for s in scores]}


def analyse_ait(args: argparse.Namespace, out: Path) -> dict:
    """Slot maps, diversity over checkpoints, energies and self-attention sparsity of the AiT run.
    A part the model cannot give (no bottleneck weights with the memory forward off, no energies
    without Hopfield retrieval, no self-attention) is reported as skipped, with the reason."""
    from modwire.analysis.workspace import (checkpoint_dirs, collect_energies, diversity_over_training, energy_summary,
                                            slot_similarity)

    _, model, batches = load(args.ait, args.samples, args.batch_size)
    before = _buffers(model)
    with torch.no_grad():
        records = [r for r in getattr(model.forward_intermediates(batches[0][0]), "workspace", None) or []
                   if r is not None]
    if not records:
        raise SystemExit(f"{args.ait}: the model records no global workspace (not an AiT with workspace layers)")
    result: dict[str, Any] = {"run": str(args.ait), "samples": sum(len(b[0]) for b in batches),
                              "layers": len(records), "skipped": {}}
    plots = _plots(args) if args.plots else None

    def attempt(name: str, fn):
        try:
            result[name] = fn()
        except (ValueError, TypeError) as e:          # what this model does not record
            result["skipped"][name] = str(e)

    attempt("slot_maps", lambda: slot_maps(args, model, records, batches[0][0], out, plots))
    history = []
    attempt("diversity", lambda: _diversity(history, checkpoint_dirs(args.ait) + [Path(c) for c in args.checkpoints],
                                            batches, diversity_over_training))
    if history and plots:
        plots.plot_patch_diversity(history, out / "diversity.png")
    energies = []
    attempt("energy", lambda: _energy(energies, collect_energies(model, batches), energy_summary))
    if energies and plots:
        plots.plot_energy(energies, out / "energy.png")
    if args.ait_sparsity:
        attempt("sparsity", lambda: sparsity(model, batches, out, "ait", args.mass, args.plots))
    result["slot_cosine"] = [slot_similarity(w.memory) for w in model.workspaces]   # 1: collapsed
    result["memory_unchanged"] = all(torch.equal(v, _buffers(model)[k]) for k, v in before.items())
    return result


def _plots(args: argparse.Namespace):
    from modwire.analysis import plots

    return plots


def _diversity(history: list, checkpoints: list[Path], batches: list, over_training) -> list[dict]:
    history.extend(over_training(checkpoints, batches))
    return [{"step": step, "per_head": d.tolist(), "mean": d.nanmean(dim=-1).tolist()} for step, d in history]


def _energy(energies: list, collected: list, summary) -> list[dict]:
    energies.extend(collected)
    return summary(energies)


def slot_maps(args: argparse.Namespace, model, records: list, x: torch.Tensor, out: Path, plots) -> dict:
    """Figure 2b for the first ``--images`` samples of the first batch; the maps' totals per slot."""
    from modwire.analysis.workspace import slot_attention_maps

    grid = model.embed.grid
    if grid is None:
        raise ValueError("slot maps need a model reading image patches")
    if not -len(records) <= args.layer < len(records):
        raise ValueError(f"--layer {args.layer} out of range: the model has {len(records)} workspace layers")
    shown = list(range(min(args.images, len(x))))
    maps = slot_attention_maps(records[args.layer], grid, head=args.head, samples=shown)
    if plots:
        which = "mean over heads" if args.head is None else f"head {args.head}"
        plots.plot_slot_maps(maps, out / "slot_maps.png", images=x[shown] if x.dim() == 4 else None,
                             title=f"bottleneck attention per memory slot, layer {args.layer % len(records) + 1} "
                                   f"({which})")
    return {"layer": args.layer % len(records), "head": args.head, "grid": list(grid),
            "selected_per_slot": (maps > 0).sum(dim=(-1, -2)).tolist()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ait", nargs="?", help="an AiT run directory (config.yaml, checkpoints/)")
    ap.add_argument("--vit", help="a ViT run directory: its attention-sparsity violins (Figure 7)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "ait_analysis"))
    ap.add_argument("--samples", type=int, default=256, help="validation samples analysed")
    ap.add_argument("--batch-size", type=int, help="samples per forward (default: the run's batch size)")
    ap.add_argument("--images", type=int, default=4, help="images in the slot maps (Figure 2b: 4)")
    ap.add_argument("--layer", type=int, default=0, help="workspace layer of the slot maps (0-based; -1 = last)")
    ap.add_argument("--head", type=int, help="one bottleneck head for the slot maps (default: their mean)")
    ap.add_argument("--mass", type=float, default=0.9, help="attention mass of Eq. 9 (AiT: 0.9)")
    ap.add_argument("--checkpoints", nargs="*", default=[], help="more checkpoint directories for the diversity")
    ap.add_argument("--no-ait-sparsity", dest="ait_sparsity", action="store_false",
                    help="skip the AiT's own self-attention sparsity")
    ap.add_argument("--no-plots", dest="plots", action="store_false", help="numbers only (no matplotlib)")
    args = ap.parse_args(argv)
    if args.ait is None and args.vit is None:
        ap.error("give an AiT run directory, a --vit run directory, or both")
    for name in ("samples", "batch_size", "images"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < args.mass <= 1:
        ap.error(f"--mass must be in (0, 1], got {args.mass}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plots:
        from modwire.analysis.plots import require_plotting

        require_plotting(graphs=False)
    summary: dict[str, Any] = {}
    if args.ait:
        summary["ait"] = analyse_ait(args, out)
    if args.vit:
        _, vit, batches = load(args.vit, args.samples, args.batch_size)
        summary["vit"] = {"run": str(args.vit), **sparsity(vit, batches, out, "vit", args.mass, args.plots)}
    (out / "summary.json").write_text(json.dumps(_finite(summary), indent=1) + "\n")
    print(report(summary))
    return 0


def report(summary: dict) -> str:
    """A few lines a person reads: diversity per checkpoint, energy change, head medians."""
    lines = []
    ait = summary.get("ait")
    if ait:
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
    for name in ("ait", "vit"):
        s = (summary.get(name) or {}).get("sparsity") if name == "ait" else summary.get(name)
        if s:
            for k, med in enumerate(s["median_per_head"]):
                lines.append(f"{name.upper()} layer {k + 1} median patches for {s['mass']:g} of attention "
                             f"(of {s['tokens']}): " + " ".join(f"{m:.3g}" for m in sorted(med)))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
