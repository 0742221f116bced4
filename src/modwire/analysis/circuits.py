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

__all__ = ["ReplacedInput", "analyze_circuits", "collect_link_probs", "executor_stages", "is_conditional", "predict"]


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


@torch.no_grad()
def predict(model, dataset, info, *, batch: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(predicted class [S], target [S])`` of ``model`` (in eval mode) over all of ``dataset``."""
    from ..training import call_model, make_loader

    loader = make_loader(dataset, batch, None, info, 0, drop_last=False)
    preds, targets = [], []
    for x, y in loader:
        preds.append(call_model(model.eval(), x).argmax(-1))
        targets.append(y)
    return torch.cat(preds), torch.cat(targets)


class ReplacedInput(torch.utils.data.Dataset):
    """``dataset`` with one named input of each item replaced, the rest (the other inputs, the
    target) kept: an ablation of that input. ``source`` ``[S]``: item ``i`` takes input ``name``
    of item ``source[i]`` (e.g. another sample's image); ``value``: every item takes it (e.g. a
    blank image). Exactly one of the two."""

    def __init__(self, dataset, name: str, *, source: Sequence[int] | None = None,
                 value: torch.Tensor | None = None) -> None:
        if (source is None) == (value is None):
            raise UserError("ReplacedInput takes exactly one of source= (an index per item) and value=")
        if source is not None and len(source) != len(dataset):
            raise UserError(f"source must give one index per item: {len(dataset)} items, got {len(source)}")
        self.dataset, self.name, self.value = dataset, name, value
        self.source = None if source is None else [int(i) for i in source]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        x, y = self.dataset[i]
        if not isinstance(x, dict) or self.name not in x:
            raise UserError(f"items must be dicts with an input {self.name!r}, got "
                            f"{sorted(x) if isinstance(x, dict) else type(x).__name__}")
        new = self.value if self.source is None else self.dataset[self.source[i]][0][self.name]
        if new.shape != x[self.name].shape:
            raise UserError(f"the replacement of {self.name!r} must have its shape {tuple(x[self.name].shape)}, "
                            f"got {tuple(new.shape)}")
        return {**x, self.name: new}, y


@torch.no_grad()
def executor_stages(model, x: torch.Tensor, condition: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each stage of a conditional NAC's executor computes for inputs ``x`` ``[B, N, d]``
    and ``condition`` (NAC §2.1-2.2), each flattened to ``[B, F]``: ``initial_states`` θ⁰ (from
    the generated codes), ``read_in_message`` (the read-in attention's output, the only path
    by which ``x`` enters: Eq. 4's ``Attn(LN(θ⁰), LN(X))``), ``read_in`` (θ¹, Eq. 4-5),
    ``layer_k`` (θ after propagator ``k``), ``read_out_message`` (the output modules'
    attention over the final states) and ``logits``. Recorded by forward hooks, removed after."""
    model.eval()
    rec: dict[str, torch.Tensor] = {}

    def keep(name: str):
        return lambda mod, args, out: rec.__setitem__(name, out[0] if isinstance(out, tuple) else out)
    hooks = [model.read_in.attn.fn.register_forward_hook(keep("read_in_message")),
             model.read_in.register_forward_hook(keep("read_in")),
             *(layer.register_forward_hook(keep(f"layer_{k}")) for k, layer in enumerate(model.propagators)),
             model.read_out.attn.fn.register_forward_hook(keep("read_out_message"))]
    try:
        circuit = model.generator(condition, batch_size=len(x))
        rec["logits"] = model(x, condition=condition)
    finally:
        for h in hooks:
            h.remove()
    out = {"initial_states": circuit.processors.states, **rec}
    return {k: v.reshape(len(x), -1).float() for k, v in out.items()}


def _categories(info) -> tuple[Callable, Sequence[str]]:
    if info.categories is not None:
        fn, names = info.categories
        return (lambda x, y: fn(x).long()), list(names)
    return (lambda x, y: y.long()), [f"class {i}" for i in range(info.num_classes)]


def analyze_circuits(run_dir: str | os.PathLike, *, out: str | os.PathLike | None = None,
                     overrides: Sequence[str] = (), split: str | None = None, max_samples: int = 1000,
                     seed: int = 0, log: Callable[[str], Any] = print, weights: str | None = None) -> dict[str, Any]:
    """NAC Fig. 6 for a trained conditional NAC run; writes into ``out`` (default
    ``RUN_DIR/analysis``) and returns the report (see ``conditional_report``)."""
    from .conditional import conditional_report
    from .runs import load_run, output_dir

    cfg, model, info, dataset = load_run(run_dir, overrides, split=split, weights=weights)
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
