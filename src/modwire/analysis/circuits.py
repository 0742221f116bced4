"""``modwire analyze`` for conditional NACs (NAC §4.4, Fig. 6): the circuit designs the
generator produces for different inputs.

For the first ``max_samples`` samples of a split, the per-sample link probabilities ``P(X)``
(NAC Eq. 2 on the generated signatures, ``[S, U, U]``) are collected with each sample's
category (the task's ``categories``, e.g. Sort-of-CLEVR's question type; else its target
class), then handed to :func:`modwire.analysis.conditional.conditional_report`: lower
triangle → PCA (64) → t-SNE (2-D) plot coloured by category, learned graphs of selected
samples (edges where ``P > 0.5``), and a separation score (does ``P`` predict the category?)
against chance.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..errors import UserError
from .catalog import is_conditional

__all__ = ["analyze_circuits", "collect_link_probs", "is_conditional"]


@torch.no_grad()
def collect_link_probs(model, dataset, info, *, max_samples: int = 1000, batch: int = 64):
    """``(P [S, U, U], labels [S], names)`` over the first ``max_samples`` samples of ``dataset``."""
    from ..training import make_loader

    n = min(max_samples, len(dataset))
    loader = make_loader(torch.utils.data.Subset(dataset, range(n)), batch, None, info, 0, drop_last=False)
    label_of, names = _categories(info)
    probs, labels = [], []
    for x, y in loader:
        if not isinstance(x, dict) or "condition" not in x:
            raise UserError(f"task {info.name!r} gives no 'condition' input: a conditional NAC needs "
                            f"{{'x': ..., 'condition': ...}} items")
        probs.append(model.link_probs(x["condition"]).float())
        labels.append(label_of(x, y))
    return torch.cat(probs), torch.cat(labels), names


def _categories(info) -> tuple[Callable, Sequence[str]]:
    if info.categories is not None:
        fn, names = info.categories
        return (lambda x, y: fn(x).long()), list(names)
    return (lambda x, y: y.long()), [f"class {i}" for i in range(info.num_classes)]


def analyze_circuits(run_dir: str | os.PathLike, *, out: str | os.PathLike | None = None,
                     overrides: Sequence[str] = (), split: str | None = None, max_samples: int = 1000,
                     seed: int = 0, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """NAC Fig. 6 for a trained conditional NAC run; writes into ``out`` (default
    ``RUN_DIR/analysis``) and returns the report (see ``conditional_report``)."""
    from .conditional import conditional_report
    from .runs import load_run, output_dir

    cfg, model, info, dataset = load_run(run_dir, overrides, split=split)
    if not is_conditional(model) or model.kernel is None:
        raise UserError(f"{run_dir}: the circuit analysis (NAC Fig. 6) needs a conditional NAC with a kernel, "
                        f"got model {cfg.model.name!r}")
    out_dir = output_dir(out if out else Path(run_dir) / "analysis")
    p, labels, names = collect_link_probs(model, dataset, info, max_samples=max_samples)
    log(f"link probabilities of {len(p)} samples ({p.shape[-1]} modules), {len(names)} categories")
    report = conditional_report(p, labels, names, out_dir, seed=seed)
    sep = report["separation"]
    log(f"held-out nearest-centroid accuracy of the category from PCA-{sep['embedding_dim']} of P: "
        f"{sep['accuracy']:.3f} (chance {sep['chance']:.3f}, shuffled labels {sep['permutation']['mean']:.3f} "
        f"± {sep['permutation']['std']:.3f}, p = {sep['permutation']['p_value']:.3f}); plots in {out_dir}")
    return report
