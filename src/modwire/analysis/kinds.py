"""``modwire analyze`` for a run whose model does not describe its modules (no
:class:`~modwire.models.capabilities.ModuleSurgery`): what applies to it, by its declared
capabilities (:data:`modwire.analysis.catalog.ANALYSES`).

* **Every model trained on a task**: the metrics of the run's checkpoint on the split, as
  ``modwire eval`` computes and prints them (same checkpoint, samples, batches and device).
* **An AiT with global-workspace layers** (:class:`~modwire.models.capabilities.HasWorkspace`):
  slot maps (AiT Fig. 2), attention sparsity (Fig. 7), patch diversity over the run's
  checkpoints (Fig. 10), Hopfield energies (Fig. 11), slot similarity
  (:func:`~modwire.analysis.workspace_report.workspace_summary`, in batches of the run's batch size).
* **A model running blocks in NFM** (:class:`~modwire.models.capabilities.HasNFM`): the read map
  of NFM Fig. 1 (:func:`~modwire.analysis.nfm.read_map`; for a GAN generator over sampled latents,
  :func:`~modwire.analysis.nfm.generator_read_map`, and no task metrics).

Outputs (``OUT``, default ``RUN_DIR/analysis``): ``metrics.json``; ``workspace.json`` with
``slot_maps.png``, ``diversity.png``, ``energy.png``, ``ait_sparsity.png``; ``nfm_read_map.json``
with ``nfm_read_map.png``; ``summary.json`` (all of it, what ran, what exists for other kinds of
model, the files). ``--no-plots``: no PNGs.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..files import atomic_write_text
from ..training.checkpoint import checkpoint_step, choose_checkpoint, resolve_checkpoint
from ..training.ema import checkpoint_model, weight_files, weights_note
from ..training.kinds import kind_of_run
from .catalog import Analysis, applicable, describe, not_applicable
from .runs import load_run, other_analyses, output_dir

__all__ = ["analyze_model", "run_root"]

LATENT_SAMPLES = 256   # latents of a generator's read map unless --max-samples


def run_root(path: str | os.PathLike) -> Path:
    """The run directory of ``path`` (a run directory, or one of its checkpoint directories)."""
    p = Path(path)
    return p if (p / "checkpoints").is_dir() else resolve_checkpoint(p).parent.parent


def analyze_model(run_dir: str | os.PathLike, *, out_dir: str | os.PathLike | None = None, split: str | None = None,
                  max_samples: int | None = None, overrides: Sequence[str] = (), plots: bool = True,
                  refuse: Sequence[str] = (), log: Callable[[str], None] | None = print,
                  weights: str | None = None) -> dict[str, Any]:
    """Run what applies to the run's model (module docstring) and write its files to ``out_dir``
    (default ``run_dir/analysis``); returns the summary (also ``summary.json``). ``refuse``:
    module-surgery flags the user gave (``--drop``, ...): a UserError naming what applies."""
    say = log or (lambda s: None)
    if max_samples is not None and max_samples < 1:
        raise UserError(f"--max-samples: expected >= 1, got {max_samples}")
    if plots:
        from .plots import require_plotting

        require_plotting(graphs=False)
    kind = kind_of_run(run_dir)              # the run-kind table (training/kinds.py)
    if not kind.task_outputs:                # no task: a GAN's generator, over sampled latents
        return _analyze_generator(run_dir, kind, out_dir, split, max_samples, overrides, plots, refuse, say, weights)
    extra = [f"data.max_samples={max_samples}"] if max_samples is not None else []
    cfg, model, info, dataset = load_run(run_dir, [*overrides, *extra], split=split, weights=weights)  # as eval
    _refuse(run_dir, model, refuse)
    split = split or cfg.data.val_split
    if len(dataset) == 0:
        raise UserError(f"{run_dir}: the {split} split is empty")
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    model.to(device)
    out = output_dir(out_dir if out_dir is not None else Path(run_dir) / "analysis")
    summary = _header(run_dir, cfg.model.name, model, task=cfg.data.task, split=split, num_samples=len(dataset))
    say(f"analyzing {summary['model']} ({summary['model_type']}): task {cfg.data.task!r}, split {split!r}, "
        f"{len(dataset)} samples, device {device.type}; weights: {weights_note(resolve_checkpoint(run_dir), weights)}")
    from ..training import evaluate, make_loader

    loader = make_loader(dataset, cfg.data.batch_size, None, info, cfg.data.num_workers, drop_last=False)
    summary["metrics"] = _metrics(run_dir, weights, cfg.data.task, split, len(dataset),
                                  evaluate(model, loader, info, device, cfg.precision))
    files = [_write_json(out / "metrics.json", summary["metrics"])]
    say("metrics: " + ", ".join(f"{k} {v:.4g}" for k, v in summary["metrics"].items()
                                if isinstance(v, float)))
    for a in applicable(model):   # on the same batches as the metrics (an AiT's pool competes within one)
        files += _RUNNERS[a.name](model, loader, out, summary, run_dir=run_dir, plots=plots, say=say)
    return _finish(out, summary, model, files, say)


def _refuse(run_dir, model: torch.nn.Module, refuse: Sequence[str]) -> None:
    if refuse:
        raise UserError(f"{run_dir}: {', '.join(refuse)} {'is' if len(refuse) == 1 else 'are'} for dropping modules "
                        f"and eliminating edges (NAC App. F), which needs a model that describes its modules (NAC, "
                        f"Perceiver IO, Neural Interpreter); this run's {model.config.model_type!r} model does not. "
                        f"What applies to it: {other_analyses(model)}")


def _header(run_dir, name: str, model: torch.nn.Module, **fields: Any) -> dict[str, Any]:
    return {"run": str(run_dir), "model": name, "model_type": model.config.model_type, **fields,
            "analyses": [a.name for a in applicable(model)]}


def _metrics(run_dir, weights: str | None, task: str, split: str, samples: int,
             metrics: dict[str, float]) -> dict[str, Any]:
    """``modwire eval``'s record: the checkpoint, its tag and step, weights, task, split, samples, metrics."""
    ckpt, _ = choose_checkpoint(run_dir)
    return {"checkpoint": str(ckpt), "tag": ckpt.name.split("-", 1)[0], "step": checkpoint_step(ckpt),
            "weights": weights or weight_files(ckpt)[1], "task": task, "split": split, "samples": samples, **metrics}


def _write_json(path: Path, data: Any) -> Path:
    from .workspace_report import finite

    atomic_write_text(path, json.dumps(finite(data), indent=1) + "\n")
    return path


def _finish(out: Path, summary: dict[str, Any], model: torch.nn.Module, files: list[Path], say) -> dict[str, Any]:
    """Say what else exists (for other kinds of model), write ``summary.json``, return the summary."""
    others: list[Analysis] = not_applicable(model)
    summary["other_analyses"] = {a.name: {"models": a.models, "shows": a.shows} for a in others}
    if not summary["analyses"]:
        say(f"no model-specific analysis applies to this {summary['model_type']!r} model: the metrics are what "
            f"modwire analyze shows for it. Model-specific analyses: {describe()}")
    else:
        say(f"ran: {', '.join(summary['analyses'])}. For other kinds of model: {describe(others, shows=False)}")
    files.append(out / "summary.json")
    summary["files"] = [str(p) for p in files]
    _write_json(out / "summary.json", summary)
    say("wrote:\n" + "\n".join(f"  {p}" for p in summary["files"]))
    return summary


def _workspace(model, batches, out: Path, summary: dict, *, run_dir, plots: bool, say) -> list[Path]:
    """AiT Figures 2, 7, 10, 11 (:func:`~modwire.analysis.workspace_report.workspace_summary`)."""
    from .workspace_report import sparsity_lines, workspace_lines, workspace_summary

    ws = workspace_summary(model, batches, out, run=run_root(run_dir), plots=plots)
    summary["workspace"] = ws
    say("\n".join(workspace_lines(ws) + (sparsity_lines("ait", ws["sparsity"]) if "sparsity" in ws else [])))
    pngs = [out / f for f in ("slot_maps.png", "diversity.png", "energy.png", "ait_sparsity.png")]
    return [_write_json(out / "workspace.json", ws), *(p for p in pngs if plots and p.is_file())]


def _nfm(model, batches, out: Path, summary: dict, *, run_dir=None, plots: bool, say) -> list[Path]:
    """NFM Fig. 1: which layers and passes each NFM module reads (:func:`~modwire.analysis.nfm.read_map`)."""
    from .nfm import generator_read_map, plot_read_map, read_map

    rm = read_map(model, batches) if batches is not None else generator_read_map(model, samples=summary["num_samples"])
    summary["nfm_read_map"] = rm.to_dict()
    s = rm.summary()
    say(f"NFM reads ({len(rm.readers)} readers, {rm.samples} samples): top-down share {s['top_down_share']:.3f}, "
        f"null mass {s['null_mass']:.3f}")
    files = [_write_json(out / "nfm_read_map.json", summary["nfm_read_map"])]
    if plots:
        files.append(plot_read_map(rm, out / "nfm_read_map.png"))
    return files


def _none(*args, **kwargs) -> list[Path]:
    return []


# what runs for each analysis of the table that applies here (module_dropping and circuits have
# their own commands' paths: modwire.analysis.report, modwire.analysis.circuits)
_RUNNERS = {"workspace": _workspace, "nfm_read_map": _nfm, "module_dropping": _none, "circuits": _none}


def _analyze_generator(run_dir, kind, out_dir, split, max_samples, overrides, plots: bool, refuse, say,
                       weights: str | None = None) -> dict[str, Any]:
    """A run of a kind without task outputs (a GAN, NFM §4.1): no task and no split; its generator's
    read map over sampled latents when the generator runs in NFM. Its scores: ``modwire eval RUN``."""
    model = checkpoint_model(resolve_checkpoint(run_dir), weights)[0].eval()
    _refuse(run_dir, model, refuse)
    given = [flag for flag, v in (("--split", split), ("--set", list(overrides))) if v]
    if given:
        raise UserError(f"{run_dir} is a {kind.noun} run: its read map is over sampled latents (--max-samples of them), "
                        f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to it")
    out = output_dir(out_dir if out_dir is not None else Path(run_dir) / "analysis")
    summary = _header(run_dir, model.config.model_type, model, num_samples=max_samples or LATENT_SAMPLES,
                      metrics=None, note=f"a {kind.noun} has no task metrics: modwire eval {run_dir} scores "
                                         f"{kind.scores}")
    say(f"analyzing a {kind.noun} run: {summary['note']}")
    files: list[Path] = []
    for a in applicable(model):
        files += _RUNNERS[a.name](model, None, out, summary, plots=plots, say=say)
    return _finish(out, summary, model, files, say)
