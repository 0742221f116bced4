"""``modwire analyze``: inference-time sparsification of trained runs (NAC §3 "Effect of
Dropping Modules", Fig. 5, App. F Fig. 10 and 15) and pictures of the learned graph
(NAC App. A.2, Fig. 8).

For a trained run (and optional baseline runs, e.g. the Perceiver IO of Fig. 5/15):

* **Dropping modules** (Fig. 5a/b, 15): for each fraction ``f`` the run's model loses
  ``round(f·U)`` processor modules — for a NAC those with the smallest importance
  ``q_i = Σ_j P_ij`` (App. F Eq. 10), for a Perceiver IO latents
  (:func:`~modwire.analysis.sparsify.drop_modules`) — and the copy is evaluated on the
  validation split (every metric of the task), timed (samples/s, eval mode,
  ``torch.inference_mode``, median of a few batches, all models interleaved) and its
  FLOPs counted (:func:`~modwire.analysis.flops.count_flops` on one batch / batch size).
* **Eliminating edges** (Fig. 10, NAC runs): for each fraction the smallest off-diagonal
  ``P_ij`` are set to 0 (:func:`~modwire.analysis.sparsify.eliminate_edges`) and the copy
  is evaluated; its propagators are timed dense-masked and block-sparse
  (:func:`~modwire.analysis.sparsify.block_sparse`, modules ordered by the matched blocks
  of a planted-partition / ring-of-cliques prior, else by reverse Cuthill-McKee), and the
  two outputs compared.
* **Graph pictures** (Fig. 8): the graph of ``P_ij > 0.5`` drawn force-directed, and a
  heatmap of ``P`` — in the frame of the run's graph prior (modules ordered by the
  matching to ``P0``) next to ``P0``, or, without a prior, by descending ``q_i``.

Outputs (``OUT``, default ``RUN_DIR/analysis``): ``modules_dropped.csv``,
``edges_removed.csv``, ``summary.json`` and PNGs (:mod:`modwire.analysis.plots`).
"""
from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["DEFAULT_DROP_FRACTIONS", "DEFAULT_EDGE_FRACTIONS", "analyze", "check_fractions", "load_run",
           "parse_fractions"]

DEFAULT_DROP_FRACTIONS = (0.0, 0.25, 0.5, 0.625, 0.75, 0.8125, 0.875, 0.9375)
DEFAULT_EDGE_FRACTIONS = (0.0, 0.5, 0.8, 0.9, 0.92, 0.94, 0.96, 0.98, 1.0)
GRAPH_THRESHOLD = 0.5  # NAC Fig. 8


# ----------------------------------------------------------------------------- loading a run

def load_run(path: str | os.PathLike, overrides: Sequence[str] = (), task: str | None = None,
             split: str | None = None):
    """A trained run as ``modwire eval`` sees it: ``(cfg, model, info, dataset)``.

    ``path``: a run directory (its ``checkpoints/best``, else ``checkpoints/last``) or a
    checkpoint directory; the run's ``config.yaml`` (next to ``checkpoints/``) gives the
    task, its parameters and the eval transform, with ``overrides`` (``key=value``)
    applied. ``task`` / ``split`` default to the run's task and validation split (another
    task is built with its default parameters). The model is on the CPU, in eval mode;
    the dataset has the run's eval transform applied."""
    from ..models import from_pretrained
    from ..tasks import build_dataset, get_task
    from ..training import load_config
    from ..training.checkpoint import resolve_checkpoint
    from ..training import apply_augmentation

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run directory or checkpoint at {p}: expected a run directory (with "
                                f"config.yaml and checkpoints/best/ or checkpoints/last/) or a checkpoint directory")
    ckpt = resolve_checkpoint(p)
    run_cfg = next((q / "config.yaml" for q in (p, ckpt.parent.parent) if (q / "config.yaml").is_file()), None)
    cfg = load_config(str(run_cfg) if run_cfg else None, list(overrides))
    task = task or cfg.data.task
    info = get_task(task)
    params = cfg.data.params if task == cfg.data.task else {}
    dataset = build_dataset(task, split or cfg.data.val_split, **params)
    model = from_pretrained(ckpt)
    _, dataset, _ = apply_augmentation(cfg, model, info, dataset, dataset)  # the run's eval transform, if any
    return cfg, model.eval(), info, dataset


# ----------------------------------------------------------------------------- fractions

def check_fractions(values: Sequence[float], what: str, closed: bool) -> list[float]:
    """Each value a finite number in ``[0, 1)`` (``closed=False``) or ``[0, 1]``."""
    values = list(values)
    if not values:
        raise ValueError(f"{what}: expected at least one fraction")
    interval = "[0, 1]" if closed else "[0, 1)"
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                not (0 <= v <= 1 if closed else 0 <= v < 1):
            raise ValueError(f"{what}: every fraction must be a number in {interval}, got {v!r}")
    return [float(v) for v in values]


def parse_fractions(text: str, what: str, closed: bool) -> list[float]:
    """``"0,0.5,.9"`` (commas and/or spaces) → checked floats (see :func:`check_fractions`)."""
    parts = [t for t in str(text).replace(",", " ").split() if t]
    values = []
    for t in parts:
        try:
            values.append(float(t))
        except ValueError:
            raise ValueError(f"{what}: expected comma-separated fractions in "
                             f"{'[0, 1]' if closed else '[0, 1)'}, got {t!r}") from None
    return check_fractions(values, what, closed)


# ----------------------------------------------------------------------------- runs

@dataclass
class _Run:
    path: Path
    name: str
    cfg: Any
    model: torch.nn.Module
    info: Any
    dataset: Any
    kind: str                     # "nac" | "perceiver_io"
    num_modules: int
    has_graph: bool               # a NAC with a kernel: link probabilities P exist
    drops: list = field(default_factory=list)   # [(fraction, kept, model)]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.cfg.model.name})"


def _open_run(path, overrides, split, max_samples, names: set[str]) -> _Run:
    from ..models.nac import NAC
    from ..models.perceiver_io import PerceiverIO

    cfg, model, info, dataset = load_run(path, overrides, split=split)
    if isinstance(model, NAC):
        kind, u, graph = "nac", model.config.num_processor_modules, model.kernel is not None
    elif isinstance(model, PerceiverIO):
        kind, u, graph = "perceiver_io", model.config.num_latents, False
    else:
        raise TypeError(f"{path}: modwire analyze needs a NAC or a PerceiverIO run, got {type(model).__name__}")
    if max_samples is not None and max_samples < len(dataset):
        dataset = torch.utils.data.Subset(dataset, range(max_samples))
    if len(dataset) == 0:
        raise ValueError(f"{path}: the {split or cfg.data.val_split} split is empty")
    name = Path(path).resolve().name
    base, i = name, 2
    while name in names:
        name, i = f"{base}_{i}", i + 1
    names.add(name)
    return _Run(Path(path), name, cfg, model, info, dataset, kind, u, graph)


def _metric_keys(metrics: dict[str, float], info) -> list[str]:
    first = [k for k in info.metrics if k in metrics]
    rest = [k for k in metrics if k not in first and k != "loss"]
    return first + rest + (["loss"] if "loss" in metrics else [])


def _evaluate(run: _Run, model, batch_size: int | None = None) -> dict[str, float]:
    from ..training import evaluate, make_loader

    cfg = run.cfg
    loader = make_loader(run.dataset, batch_size or cfg.data.batch_size, None, run.info, cfg.data.num_workers,
                         drop_last=False)
    device = next(model.parameters()).device
    return evaluate(model, loader, run.info, device, cfg.precision)


def _timing_batch(run: _Run, batch: int, device) -> torch.Tensor:
    """The first ``batch`` samples of the split (cycled if it is smaller), collated like the loader."""
    from ..training import make_loader

    idx = [i % len(run.dataset) for i in range(batch)]
    loader = make_loader(torch.utils.data.Subset(run.dataset, idx), batch, None, run.info, 0, drop_last=False)
    from ..training import to_device

    x = next(iter(loader))[0]
    return to_device(x, device)


def _autocast(device, precision: str):
    from ..training import autocast

    return autocast(device, precision)


# ----------------------------------------------------------------------------- the analysis

def analyze(run_dir: str | os.PathLike, baselines: Sequence[str | os.PathLike] = (),
            out_dir: str | os.PathLike | None = None, drop: Sequence[float] = DEFAULT_DROP_FRACTIONS,
            edges: Sequence[float] | None = None, split: str | None = None, batch: int = 64,
            max_samples: int | None = None, overrides: Sequence[str] = (), plots: bool = True,
            iters: int = 3, block_size: int | None = None,
            log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run the analysis (see the module docstring) and write its files to ``out_dir``
    (default ``run_dir/analysis``). ``edges=None``: the default fractions for a NAC run,
    none for a Perceiver IO; explicit fractions need a NAC with link probabilities.
    Returns the summary (also written to ``summary.json``)."""
    from .flops import count_flops, time_interleaved
    from .sparsify import block_sparse, drop_modules, eliminate_edges

    drop = list(dict.fromkeys(check_fractions(drop, "--drop (fractions of modules to drop)", closed=False)))
    explicit_edges = edges is not None
    if explicit_edges:
        edges = list(dict.fromkeys(check_fractions(edges, "--edges (fractions of edges to remove)", closed=True)))
    if batch < 1:
        raise ValueError(f"--batch: expected >= 1, got {batch}")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"--max-samples: expected >= 1, got {max_samples}")
    if iters < 1:
        raise ValueError(f"--iters: expected >= 1, got {iters}")
    if block_size is not None and block_size < 1:
        raise ValueError(f"--block-size: expected >= 1, got {block_size}")
    if plots:
        from .plots import require_plotting

        require_plotting()
    say = log or (lambda s: None)

    # -- load every run first: bad paths and kinds fail before any long computation
    names: set[str] = set()
    main = _open_run(run_dir, overrides, split, max_samples, names)
    others = [_open_run(b, overrides, split, max_samples, names) for b in baselines]
    runs = [main, *others]
    device = torch.device("cuda" if torch.cuda.is_available() and main.cfg.device != "cpu" else "cpu")
    for r in runs:
        r.model.to(device)
    if explicit_edges and not main.has_graph:
        what = "a NAC without a kernel (kernel.enabled=False)" if main.kind == "nac" else f"a {main.kind} model"
        raise ValueError(f"--edges needs a NAC run with link probabilities P (NAC with kernel.enabled=True); "
                         f"{run_dir} is {what} ({main.cfg.model.name}): leave --edges out for it")
    if edges is None:
        edges = list(DEFAULT_EDGE_FRACTIONS)
    edge_runs = [r for r in runs if r.has_graph]
    split_name = split or main.cfg.data.val_split
    for r in runs:
        for f in drop:
            k = round(f * r.num_modules)
            if k >= r.num_modules:
                raise ValueError(f"--drop {f:g}: would drop all {r.num_modules} modules of {r.path} "
                                 f"(round({f:g}·{r.num_modules}) = {k}); at least one must stay")

    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    what = "modules" if main.kind == "nac" else "latents"
    say(f"analyzing {main.label}: {main.num_modules} {what}, task {main.cfg.data.task!r}, split {split_name!r}, "
        f"{len(main.dataset)} samples, device {device.type}"
        + (f"; baselines: {', '.join(r.label for r in others)}" if others else ""))

    # -- dropped copies, evaluated
    drop_rows: list[dict[str, Any]] = []
    for r in runs:
        for f in drop:
            k = round(f * r.num_modules)
            m = r.model if k == 0 else drop_modules(r.model, f).eval()
            r.drops.append((f, r.num_modules - k, m))
            drop_rows.append({"run": r.name, "model": r.cfg.model.name, "fraction_dropped": f,
                              "modules_kept": r.num_modules - k, **_evaluate(r, m)})
    # -- throughput, interleaved over every (run, fraction), and FLOPs per sample
    fns, flops = {}, {}
    for r in runs:
        x = _timing_batch(r, batch, device)
        for f, _, m in r.drops:
            fns[(r.name, f)] = (lambda m=m, x=x, r=r: _forward(m, x, device, r.cfg.precision))
            flops[(r.name, f)] = count_flops(lambda m=m, x=x: m(x))
    with torch.inference_mode():
        seconds = time_interleaved(fns, iters=iters, warmup=1)
    for row in drop_rows:
        key = (row["run"], row["fraction_dropped"])
        row["samples_per_s"] = batch / seconds[key]
        row["gflops_per_sample"] = flops[key] / batch / 1e9
    for r in runs:
        r.drops = [(f, kept, None) for f, kept, _ in r.drops]   # free the copies

    # -- eliminated edges (NAC runs with link probabilities)
    # and their propagators run dense-masked vs block-sparse (the modules reordered so
    # that kept edges form blocks), timed interleaved on the same batch
    edge_rows: list[dict[str, Any]] = []
    for r in edge_runs:
        x = _timing_batch(r, batch, device)
        groups, size = _block_plan(r, block_size)
        fns = {}
        for f in edges:
            m, mask = eliminate_edges(r.model, f)
            m.eval()
            kept = int((mask.sum().item() - mask.diagonal().sum().item()) // 2)
            row = {"run": r.name, "fraction_removed": f, "edges_kept": kept, **_evaluate(r, m)}
            fast = block_sparse(m, size, groups)
            with torch.inference_mode():
                row["block_sparse_max_abs_diff"] = (fast(x) - m(x)).abs().max().item()
            row["block_size"] = size
            row["block_density"] = fast.propagator_kernel.pattern.layout.density
            fns[(f, "dense")] = (lambda m=m: _forward(m, x, device, r.cfg.precision))
            fns[(f, "block")] = (lambda m=fast: _forward(m, x, device, r.cfg.precision))
            edge_rows.append(row)
        with torch.inference_mode():
            seconds = time_interleaved(fns, iters=iters, warmup=1)
        for row in edge_rows[-len(edges):]:
            f = row["fraction_removed"]
            row["samples_per_s_dense_masked"] = batch / seconds[(f, "dense")]
            row["samples_per_s_block_sparse"] = batch / seconds[(f, "block")]
        del fns

    # -- files
    files: list[Path] = []
    keys: list[str] = []
    for row in drop_rows + edge_rows:
        metrics = {k: v for k, v in row.items() if k not in _NON_METRIC}
        keys += [k for k in _metric_keys(metrics, main.info) if k not in keys]
    files.append(_write_csv(out / "modules_dropped.csv", drop_rows,
                            ["run", "model", "fraction_dropped", "modules_kept", *keys, "samples_per_s",
                             "gflops_per_sample"]))
    if edge_rows:
        files.append(_write_csv(out / "edges_removed.csv", edge_rows,
                                ["run", "fraction_removed", "edges_kept", *keys, "samples_per_s_dense_masked",
                                 "samples_per_s_block_sparse", "block_size", "block_density",
                                 "block_sparse_max_abs_diff"]))
    graphs: dict[str, Any] = {}
    for r in edge_runs:
        graphs[r.name] = _graph_summary(r)
    metric = main.info.metrics[0]
    if plots:
        files += _plots(out, runs, drop_rows, edge_rows, metric, split_name, main)
    summary = {
        "run": str(main.path), "model": main.cfg.model.name, "model_type": main.kind, "task": main.cfg.data.task,
        "split": split_name, "num_samples": len(main.dataset), "metric": metric, "num_modules": main.num_modules,
        "batch": batch, "timing_iters": iters, "device": device.type, "torch_threads": torch.get_num_threads(),
        "baselines": [{"run": str(r.path), "name": r.name, "model": r.cfg.model.name, "model_type": r.kind,
                       "num_modules": r.num_modules} for r in others],
        "modules_dropped": drop_rows, "edges_removed": edge_rows, "graphs": graphs,
    }
    summary_path = out / "summary.json"
    files.append(summary_path)
    summary["files"] = [str(p) for p in files]
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")

    say(_table(drop_rows, edge_rows, metric))
    say("wrote:\n" + "\n".join(f"  {p}" for p in files))
    return summary


_NON_METRIC = {"run", "model", "fraction_dropped", "modules_kept", "samples_per_s", "gflops_per_sample",
               "fraction_removed", "edges_kept", "samples_per_s_dense_masked", "samples_per_s_block_sparse",
               "block_size", "block_density", "block_sparse_max_abs_diff"}


def _block_plan(run: _Run, block_size: int | None) -> tuple[torch.Tensor | None, int]:
    """How :func:`block_sparse` orders a run's modules: by the matched blocks of a
    planted-partition / ring-of-cliques prior (block size = U / number of blocks), else
    by reverse Cuthill-McKee (block size ``block_size`` or U / 8)."""
    from .sparsify import prior_groups

    name, params = _prior_of(run)
    u = run.num_modules
    if name in ("planted_partition", "ring_of_cliques"):
        groups = prior_groups(run.model, name, **params)
        return groups, block_size or int(torch.bincount(groups).max())
    return None, block_size or max(1, -(-u // 8))


def _forward(model, x, device, precision):
    from ..training import call_model

    with _autocast(device, precision):
        return call_model(model, x)


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    return path


def _table(drop_rows, edge_rows, metric: str) -> str:
    lines = [f"{'run':<24}{'dropped':>9}{'kept':>7}{metric:>10}{'samples/s':>12}{'GFLOPs/sample':>15}"]
    for r in drop_rows:
        lines.append(f"{r['run'][:23]:<24}{r['fraction_dropped']:>9.4g}{r['modules_kept']:>7}"
                     f"{r.get(metric, float('nan')):>10.4f}{r['samples_per_s']:>12.1f}"
                     f"{r['gflops_per_sample']:>15.4g}")
    if edge_rows:
        lines.append(f"{'run':<24}{'edges removed':>14}{'kept':>7}{metric:>10}{'dense/s':>10}{'block/s':>10}"
                     f"{'density':>9}")
        for r in edge_rows:
            lines.append(f"{r['run'][:23]:<24}{r['fraction_removed']:>14.4g}{r['edges_kept']:>7}"
                         f"{r.get(metric, float('nan')):>10.4f}{r['samples_per_s_dense_masked']:>10.1f}"
                         f"{r['samples_per_s_block_sparse']:>10.1f}{r['block_density']:>9.3f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- graph pictures

def _link_probs(run: _Run) -> torch.Tensor:
    with torch.no_grad():
        return run.model.link_probs().detach().float().cpu()


def _prior_of(run: _Run) -> tuple[str | None, dict[str, Any]]:
    """The run's graph prior: ``graph_prior`` of the training config, else the model's
    ``frozen_graph`` (NAC Table 1 "sparse graph, not learnable"); (None, {}) if none."""
    gp = getattr(run.model.config, "graph_prior", None)      # the NAC's own (current form)
    if not getattr(gp, "name", None):
        gp = getattr(run.cfg, "graph_prior", None)            # legacy top-level section
    name = getattr(gp, "name", None)
    if name:
        return name, dict(getattr(gp, "params", None) or {})
    frozen = getattr(run.model.config, "frozen_graph", None)
    if getattr(frozen, "name", None):
        return frozen.name, dict(frozen.params)
    return None, {}


def _frame(run: _Run, p: torch.Tensor):
    """``(order, prior P0 or None, prior name, note)``: modules in the prior's frame
    (``argsort(σ)``, σ from ``modwire.graphs.match``) when the run has a prior, else by
    descending ``q_i``."""
    name, params = _prior_of(run)
    by_q = torch.sort(p.sum(dim=1), descending=True, stable=True).indices
    if name is None:
        return by_q, None, None, "modules by descending q_i"
    from ..graphs import match, prior

    p0 = prior(name, p.shape[0], **params).float().cpu()
    gp = getattr(run.model.config, "graph_prior", None)
    if getattr(gp, "name", None) != name:
        gp = getattr(run.cfg, "graph_prior", None)
    align = getattr(gp, "align", None) if getattr(gp, "name", None) == name else None
    sigma = match(p, p0) if align is None else match(p, p0, align=align)   # as the regularizer matched
    sigma = torch.as_tensor(sigma, dtype=torch.long).cpu()
    return torch.argsort(sigma), p0, name, f"modules in the frame of prior {name!r} (matched)"


def _graph_summary(run: _Run) -> dict[str, Any]:
    p = _link_probs(run)
    u = p.shape[0]
    above = (p > GRAPH_THRESHOLD) | (p.T > GRAPH_THRESHOLD)
    above.fill_diagonal_(False)
    n_edges = int(above.sum().item()) // 2
    q = p.sum(dim=1)
    return {"num_modules": u, "threshold": GRAPH_THRESHOLD, "edges_above_threshold": n_edges,
            "mean_degree": 2 * n_edges / u, "q_min": q.min().item(), "q_median": q.median().item(),
            "q_max": q.max().item(), "prior": _prior_of(run)[0]}


def _plots(out: Path, runs: list[_Run], drop_rows, edge_rows, metric: str, split: str, main: _Run) -> list[Path]:
    from .plots import plot_curves, plot_graph, plot_link_probs

    def series(rows, x, y, group=lambda r: r["run"]):
        by: dict[str, tuple[list, list]] = {}
        labels = {r.name: r.label for r in runs}
        for row in rows:
            xs, ys = by.setdefault(labels[group(row)], ([], []))
            xs.append(x(row))
            ys.append(row.get(y, float("nan")))
        return by

    u_of = {r.name: r.num_modules for r in runs}
    dropped = lambda row: u_of[row["run"]] - row["modules_kept"]  # noqa: E731
    files = [
        plot_curves(series(drop_rows, dropped, metric), out / "accuracy_vs_modules_dropped.png",
                    "modules (NAC) / latents (PIO) dropped", f"{split} {metric}",
                    "dropping modules at inference time (NAC Fig. 5a, 15)"),
        plot_curves(series(drop_rows, dropped, "samples_per_s"), out / "throughput_vs_modules_dropped.png",
                    "modules (NAC) / latents (PIO) dropped", "samples / s (inference)",
                    "inference speed as modules are dropped (NAC Fig. 5b)"),
        plot_curves(series(drop_rows, lambda row: row["gflops_per_sample"], metric), out / "accuracy_vs_gflops.png",
                    "GFLOPs / sample", f"{split} {metric}", "accuracy vs compute (NAC Fig. 15)"),
    ]
    if edge_rows:
        files.append(plot_curves(series(edge_rows, lambda row: row["fraction_removed"], metric),
                                 out / "accuracy_vs_edges_removed.png", "edges removed (%)", f"{split} {metric}",
                                 "eliminating connections between modules (NAC Fig. 10)", percent_x=True))
        speed = {}
        for kind, key in (("dense masked", "samples_per_s_dense_masked"), ("block-sparse", "samples_per_s_block_sparse")):
            for label, xy in series(edge_rows, lambda row: row["fraction_removed"], key).items():
                speed[f"{label}, {kind}"] = xy
        files.append(plot_curves(speed, out / "throughput_vs_edges_removed.png", "edges removed (%)",
                                 "samples / s (inference)", "propagators dense-masked vs block-sparse",
                                 percent_x=True))
    for r in runs:
        if not r.has_graph:
            continue
        suffix = "" if r is main else f"_{r.name}"
        p = _link_probs(r)
        order, p0, name, note = _frame(r, p)
        files.append(plot_graph(p, out / f"graph{suffix}.png", threshold=GRAPH_THRESHOLD, seed=0))
        files.append(plot_link_probs(p, out / f"link_probs{suffix}.png", prior=p0, order=order,
                                     title=f"{r.label}: {note}"))
    return files
