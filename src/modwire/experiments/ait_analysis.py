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

The AiT's analyses are :func:`modwire.analysis.workspace_report.workspace_summary`, which
``modwire analyze AIT_RUN`` runs too (into ``AIT_RUN/analysis``, on the whole split unless
``--max-samples``); this script adds the ViT's violins and its own options, output folder and
report. Everything runs on the first ``--samples`` samples of the run's validation split, in batches of
the run's batch size (the squashed pool competes within a batch; ``--batch-size`` to change it),
on the CPU, in eval mode. Seconds for the micro / CPU configs. Usage::

    python -m modwire.experiments.ait_analysis RUNS/ait_run --vit RUNS/vit_run [--samples 256] [--head 0]
    python -m modwire.experiments.ait_analysis --report --out experiments/results/ait_analysis

``--report`` loads no model: it rebuilds ``OUT/study.json`` from the ``summary.json`` of each analysed
run under ``OUT`` (``OUT/<name>/summary.json``, as ``experiments/results/ait_analysis/paper/``) and, where
the run's own logs were kept beside it (``OUT/<name>/run/metrics.jsonl``), its last validation metrics.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

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


def sparsity(model: torch.nn.Module, batches: list, out: Path, name: str, mass: float, plots: bool) -> dict:
    """Figure 7 for one model: per layer, each head's median Eq. 9 score (heads in order)."""
    from modwire.analysis.workspace_report import sparsity_summary

    return sparsity_summary(model, batches, out, name, mass, plots)


def analyse_ait(args: argparse.Namespace, out: Path) -> dict:
    """Slot maps, diversity over checkpoints, energies and self-attention sparsity of the AiT run
    (``modwire.analysis.workspace_report.workspace_summary``, as ``modwire analyze`` runs it). A
    part the model cannot give is reported as skipped, with the reason."""
    from modwire.analysis.workspace_report import workspace_summary
    from modwire.errors import UserTypeError

    _, model, batches = load(args.ait, args.samples, args.batch_size)
    try:
        return workspace_summary(model, batches, out, run=args.ait, checkpoints=args.checkpoints, layer=args.layer,
                                 head=args.head, images=args.images, mass=args.mass,
                                 self_sparsity=args.ait_sparsity, plots=args.plots)
    except UserTypeError as e:                     # a ViT, or the "without memory" ablation
        raise SystemExit(f"{args.ait}: {e}") from None


def parse(argv: list[str] | None) -> argparse.Namespace:
    from modwire.experiments.common import StudyParser, prog

    ap = StudyParser(prog=prog(), description=__doc__.split("\n\n")[0])
    ap.results = "ait_analysis"
    ap.add_argument("ait", nargs="?", help="an AiT run directory (config.yaml, checkpoints/)")
    ap.add_argument("--vit", help="a ViT run directory: its attention-sparsity violins (Figure 7)")
    ap.add_argument("--out", type=Path, help="output folder (default experiments/results/ait_analysis of the clone)")
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
    ap.add_argument("--report", action="store_true",
                    help="rebuild OUT/study.json from the summary.json files under OUT (no model is loaded)")
    args = ap.parse_args(argv)
    if args.ait is None and args.vit is None and not args.report:
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
    if args.report:
        return report_study(out, args, argv)
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
    from modwire.analysis.workspace_report import finite

    (out / "summary.json").write_text(json.dumps(finite(summary), indent=1) + "\n")
    print(report(summary))
    return 0


def report_study(out: Path, args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--report``: one record per analysed run under ``out`` into ``out/study.json``."""
    from modwire.experiments import common

    summaries = sorted(out.glob("*/summary.json"))
    if not summaries:
        raise SystemExit(f"ait_analysis.py --report: no <name>/summary.json under {out}; analyse a run first")
    results = [analysis_record(path) for path in summaries]
    for r in results:
        print(f"{r['name']}: slot cosine {r.get('slot_cosine')}, final validation {r.get('final_val')}")
    logs = [*summaries, *(p.parent / "run" / "metrics.jsonl" for p in summaries)]
    common.finish_study(out, "ait_analysis", results, args=args, started=time.perf_counter(), seeds=[0],
                        logs=[p for p in logs if p.is_file()], script=__file__, argv=argv)
    return 0


def analysis_record(path: Path) -> dict:
    """The numbers of one run's analysis (``summary.json``) that the README states: mean slot cosine
    per layer, patch diversity per checkpoint, Hopfield energy before / after retrieval, the heads'
    median sparsity; and the run's last validation metrics where its ``run/metrics.jsonl`` is kept."""
    summary = json.loads(path.read_text())
    ait, vit = summary.get("ait") or {}, summary.get("vit") or {}
    record: dict[str, Any] = {"name": path.parent.name, "run": ait.get("run") or vit.get("run")}
    if ait:
        record.update(slot_cosine=ait.get("slot_cosine"), memory_unchanged=ait.get("memory_unchanged"),
                      diversity=[{"step": d["step"], "mean": d["mean"]} for d in ait.get("diversity", [])],
                      energy=[{k: e[k] for k in ("mean_before", "mean_after", "fraction_decreased")}
                              for e in ait.get("energy", [])],
                      ait_sparsity_median_per_head=(ait.get("sparsity") or {}).get("median_per_head"))
    if vit:
        record["vit_sparsity_median_per_head"] = vit.get("median_per_head")
    metrics = path.parent / "run" / "metrics.jsonl"
    if metrics.is_file():
        from modwire.files import read_lines

        vals = [r for r in map(json.loads, read_lines(metrics)) if "val_loss" in r]
        if vals:
            record["final_val"] = {k.removeprefix("val_"): v for k, v in vals[-1].items() if k != "epoch"}
            record["val_split"] = _val_split(path.parent / "run" / "config.yaml")
    return record


def _val_split(config: Path) -> str | None:
    """The validation split of a run's ``config.yaml`` (``data.val_split``), ``None`` without one."""
    if not config.is_file():
        return None
    import yaml

    return ((yaml.safe_load(config.read_text()) or {}).get("data") or {}).get("val_split")


def report(summary: dict) -> str:
    """A few lines a person reads: diversity per checkpoint, energy change, head medians."""
    from modwire.analysis.workspace_report import sparsity_lines, workspace_lines

    lines = []
    ait = summary.get("ait")
    if ait:
        lines += workspace_lines(ait)
    for name in ("ait", "vit"):
        s = (summary.get(name) or {}).get("sparsity") if name == "ait" else summary.get(name)
        if s:
            lines += sparsity_lines(name, s)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
