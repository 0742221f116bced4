"""NAC Fig. 4 at CPU scale: few-shot adaptation of a pre-trained NAC vs a Perceiver IO (8-way, 1-16 shots).

The paper (NAC §4.1 "Few-Shot Adaptation", Fig. 4; App. E, Fig. 9) fine-tunes an ImageNet
pre-trained NAC (8 layers, scale-free prior graph, 1024 modules, 77 % validation top-1) and the
official ImageNet Perceiver IO (48 layers, 82.1 %) to classify images of CUB-2011 and CIFAR into
8 classes, with 1 to 16 examples ("shots") per class, "between 8 and 128 in total". Fig. 4: in the
low-shot regime (1-4 shots) NAC compares favourably with the baseline (the abstract: "by about 10
percent"). The paper gives neither the fine-tuning optimizer, its length, nor the number of seeds.

This runs the same protocol on what the machine has, sized for a CPU:

* pre-training of the CPU configs on Fashion-MNIST (Debian's ``dataset-fashion-mnist``, or
  ``--data-root DIR`` holding the four idx files): ``configs/cpu/nac_fashion_mnist.yaml`` with the
  scale-free prior of NAC Table 1's row (β = 0.5, graph weight 5e-3; Fig. 4's NAC has a scale-free
  prior) and ``configs/cpu/perceiver_io_fashion_mnist.yaml``, the same budget for both:
  :data:`PRETRAIN_STEPS` steps of 128, AdamW at 1e-3 with 100 warm-up steps
  (``modwire.experiments.table1_ladder``'s Fashion-MNIST setting, longer);
* few-shot fine-tuning of every parameter (``--train all``) with a new 8-way head on scikit-learn's
  digits (``digits``: 1×32×32, the input shape of the pre-training; a task the models never saw),
  8 classes and ``k`` images of each drawn by the seed, for ``k`` in :data:`SHOTS`, 3 seeds, through
  :func:`modwire.training.finetune.finetune_overrides` / ``finetune_seeds`` (``modwire finetune``'s
  machinery: each seed a checkpointed, resumable run). The draw depends on the seed alone, so both
  models fine-tune on the same subsets (each record holds each seed's classes and a digest of its
  images). Scored on digits' test images of the same 8 classes (about 290 of its 360). Where the
  paper is silent, ``modwire finetune``'s defaults (NI App. C.2.2) apply: RAdam at a constant lr,
  10 epochs, no weight decay, batch 128, which is the whole k-shot set (8-128 images): 10
  full-batch steps for every k, so one lr serves every k; the graph regularizer stays at its
  pre-training weight. Each model fine-tunes at its best lr of ``--lr-check`` (:data:`MODELS`:
  NAC 0.03, Perceiver IO 0.03 since issue 35's models, 0.01 before; ``modwire finetune``'s default 0.05
  is NI's): seed :data:`CHECK_SEED`
  (a subset none of the curve's seeds draws) at :data:`LR_CHECK_SHOTS` shots, at each of
  :data:`LR_CHECK`.

Each pre-training and each (model, k) fine-tuning (all its seeds) is one job in a pool of
single-threaded worker processes (pre-training first, both models in parallel); finished jobs are
appended to ``OUT/results.jsonl`` and skipped by a rerun, and an interrupted fine-tuning resumes seed
by seed. The table (mean ± std over seeds per k, next to the paper's claim) is printed and written to
``OUT/table.md``, the plot to ``OUT/fewshot.png``, the study run's record to ``OUT/study.json``
(:mod:`modwire.experiments.common`).

Run: ``python -m modwire.experiments.nac_fewshot --lr-check`` (the committed run: 584 s on 2 cores with light
other load, its study.json; several times that beside busy jobs); ``--lr-check`` fine-tunes the check
seed at each lr of :data:`LR_CHECK`; ``--quick`` is a smoke test; ``--report`` reprints the table and
rebuilds ``OUT/study.json`` from ``OUT/results.jsonl`` (no training). ``experiments/results/nac_fewshot/``
holds the run reported in docs/nac.md (its study.json and plot are committed, the logs are not).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modwire.experiments import common
from modwire.experiments import fewshot as shared
from modwire.files import atomic_write_text

# ----------------------------------------------------------------------------- the models

CONFIGS = common.CONFIGS / "cpu"
PRETRAIN_STEPS = 400               # batch 128: 51,200 images, most of one Fashion-MNIST epoch
GRAPH_WEIGHT = 5e-3                # NAC Table 1's row (modwire.experiments.table1_ladder)


@dataclass(frozen=True)
class Model:
    """A CPU config pre-trained on Fashion-MNIST: its file, its config values (``load_config(values=...)``),
    its constant fine-tuning lr (RAdam; its best of ``--lr-check``: the paper gives none) and the values
    its fine-tuning needs besides ``modwire finetune``'s (the auxiliary loss weight it reports)."""

    key: str
    label: str
    config: str
    finetune_lr: float
    sets: Mapping[str, Any] = field(default_factory=dict)
    finetune_sets: Mapping[str, Any] = field(default_factory=dict)


MODELS = {
    "nac": Model("nac", "NAC (scale-free prior)", "nac_fashion_mnist.yaml", 3e-2,
                 {"model.overrides.graph_prior": {"name": "scale_free", "params": {"beta": 0.5}},
                  "aux_loss_weights.graph": GRAPH_WEIGHT}, {"aux_loss_weights.graph": GRAPH_WEIGHT}),
    "pio": Model("pio", "Perceiver IO", "perceiver_io_fashion_mnist.yaml", 3e-2),
}
PRETRAIN_TASK = "fashion_mnist"
TARGET = "digits"                  # scikit-learn's 8×8 digits, upsampled to 1×32×32 (the task's default size)
WAYS = 8                           # NAC Fig. 4
SHOTS = (1, 2, 4, 8, 16)           # NAC Fig. 4: 1 to 16 per class, 8 to 128 images in total
EPOCHS = 10                        # modwire finetune's default (NI App. C.2.2); NAC gives none
FINETUNE_BATCH = 128               # NI App. C.2.2 (modwire finetune): the whole k-shot set, 10 steps for every k
LR_CHECK = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
LR_CHECK_SHOTS = (4,)
CHECK_SEED = 100                   # the lr check's subset: one no seed of the curve draws
PAPER = ("NAC Fig. 4 (CUB-2011 and CIFAR, 8-way, ImageNet pre-training; no numbers in the text, the abstract "
         "says about 10 %): NAC ahead of Perceiver IO in the low-shot regime (1-4 shots)")


# ----------------------------------------------------------------------------- the jobs

@dataclass(frozen=True)
class Job:
    """Pre-training of a model (``shots == -1``) or its fine-tuning with ``shots`` per class over
    ``seeds`` seeds at ``lr`` (the lr check: seed :data:`CHECK_SEED` alone)."""

    model: str
    shots: int = -1
    seeds: int = 0
    lr: float = 0.0
    quick: bool = False
    check: bool = False            # a run of the lr check, kept apart from the curve
    data_root: str | None = None   # Fashion-MNIST's directory (None: the loader's default, Debian's path)

    @property
    def pretrain(self) -> bool:
        return self.shots < 0

    @property
    def key(self) -> str:
        if self.pretrain:
            return f"pretrain/{self.model}"
        return f"{'lrcheck' if self.check else 'finetune'}/{self.model}_lr{self.lr:g}/{self.shots}shot"

    @property
    def seed_list(self) -> list[int]:
        return [CHECK_SEED] if self.check else list(range(self.seeds))

    def pretrain_config(self, out: Path):
        from modwire.training import load_config

        m = MODELS[self.model]
        sets = {**m.sets, "max_steps": PRETRAIN_STEPS, "epochs": 1000, "progress": False, "log_every": 50, "seed": 0,
                "out_dir": out / self.key}
        if self.data_root:
            sets["data.params.root"] = self.data_root
        if self.quick:
            sets.update({"max_steps": 3, "data.batch_size": 16, "data.max_samples": 160, "optim.warmup_steps": 1})
        return load_config(CONFIGS / m.config, values=sets)

    def finetune_config_for(self, out: Path) -> tuple[Callable, Path]:
        """``(config_for(seed, run_dir), OUT of finetune_seeds)`` as ``modwire finetune`` builds them: its
        ``--set`` overrides (:func:`~modwire.training.finetune.finetune_overrides`) with the study's values
        (keys those overrides do not set)."""
        from modwire.training import load_config
        from modwire.training.finetune import finetune_overrides

        base, _ = finetune_overrides(out / Job(self.model).key, TARGET, train=["all"], shots=self.shots, ways=WAYS,
                                     epochs=1 if self.quick else EPOCHS, lr=self.lr,
                                     batch_size=min(FINETUNE_BATCH, self.shots * WAYS))
        extra = {**MODELS[self.model].finetune_sets, "data.val_split": "test", "progress": False, "log_every": 1000}
        if self.quick:                   # twice the shots of each of 10 classes; fewer test images
            extra["data.max_samples"] = max(100, 20 * self.shots)

        def config_for(seed: int, run_dir: Path):
            return load_config(None, base, values={**extra, "seed": seed, "out_dir": run_dir})
        return config_for, out / self.key


@common.worker(lambda job_and_out: job_and_out[0].key)
def run_job(job_and_out: tuple[Job, str]) -> dict:
    """Run one job in this (worker) process; its record, or ``{"key", "error"}``."""
    job, out = job_and_out
    record = _pretrain(job, Path(out)) if job.pretrain else _finetune(job, Path(out))
    return {**asdict(job), "key": job.key, **record}


def _pretrain(job: Job, out: Path) -> dict:
    result = common.train_or_resume(job.pretrain_config(out))
    params = sum(p.numel() for p in result["model"].parameters())
    return {"val": result["val"], "steps_done": result["step"], "parameters": params}


def _finetune(job: Job, out: Path) -> dict:
    config_for, ft_out = job.finetune_config_for(out)
    return {**shared.finetune(config_for, job.seed_list, ft_out), "subsets": drawn_subsets(config_for, job.seed_list)}


def drawn_subsets(config_for: Callable, seeds: Iterable[int]) -> dict[str, dict]:
    """Each seed's k-shot draw as its run made it (``build_datasets``, then ``draw_few_shot``): the
    classes and a digest of the training images' indices (equal digests: the same images)."""
    from modwire.tasks import build_dataset, describe_task
    from modwire.training.finetune_setup import draw_few_shot

    out = {}
    for seed in seeds:
        cfg = config_for(seed, Path("unused"))
        d = cfg.data
        train_set = build_dataset(d.task, d.train_split, max_samples=d.max_samples, sample_seed=cfg.seed, **d.params)
        indices, classes = draw_few_shot(cfg, describe_task(d.task, d.params), train_set)
        out[str(seed)] = {"classes": classes, "images": len(indices), "digest": subset_digest(indices)}
    return out


def subset_digest(indices: Iterable[int]) -> str:
    """A short digest of a subset's (sorted) training indices."""
    return hashlib.sha256(json.dumps(sorted(int(i) for i in indices)).encode()).hexdigest()[:16]


load_results = shared.load_results


def _done(job: Job, done: dict[str, dict]) -> bool:
    return shared.finished(done.get(job.key), pretrain=job.pretrain, seeds=len(job.seed_list), quick=job.quick)


def run_jobs(jobs: list[Job], out: Path, workers: int, log: Callable[[str], None] = print) -> list[str]:
    """Run the jobs not yet in ``out/results.jsonl`` on ``workers`` processes (0: in this one),
    appending each record as it finishes. Returns the failures."""
    return common.run_grid(run_job, [(j, str(out)) for j in jobs], out / "results.jsonl", key=lambda a: a[0].key,
                           finished=lambda a, done: _done(a[0], done), workers=workers, describe=shared.brief,
                           noun="jobs", verb="run", log=log)


# ----------------------------------------------------------------------------- the plan

def plan(args: argparse.Namespace) -> tuple[list[Job], list[Job]]:
    """``(pre-training jobs, fine-tuning jobs)``: the most shots first, so the pool ends together."""
    models, shots = shared.parse_plan(args, MODELS, "nac_fewshot.py")
    pre = [Job(m, quick=args.quick, data_root=args.data_root) for m in models]
    ft: list[Job] = []
    if args.lr_check:
        check_shots = shots[:1] if args.quick else LR_CHECK_SHOTS
        ft += [Job(m, k, 1, lr, args.quick, check=True) for m in models for k in check_shots for lr in LR_CHECK]
    if not args.lr_check_only:
        ft += [Job(m, k, args.seeds, lr_of(m, args), args.quick) for k in shots for m in models]
    unique = {j.key: j for j in ft}
    return pre, sorted(unique.values(), key=lambda j: (j.check, -j.shots))


def lr_of(model: str, args: argparse.Namespace) -> float:
    return shared.lr_of(model, args, lambda m: MODELS[m].finetune_lr)


# ----------------------------------------------------------------------------- the report

def _pretrain_table(results: dict[str, dict], models: list[str]) -> list[str]:
    rows = [[MODELS[m].label, f"{r['parameters']:,}", r["steps_done"], f"{100 * r['val']['top1']:.1f}",
             f"{r['seconds'] / 60:.1f}"] for m in models if (r := results.get(Job(m).key))]
    return [f"\n### Pre-training on {PRETRAIN_TASK} (test top-1 %)\n",
            common.markdown_table(["model", "parameters", "steps", "top-1", "minutes"], rows)]


def format_table(results: dict[str, dict], models: list[str], lrs: dict[str, float]) -> str:
    """Markdown: the pre-trained models, then top-1 per k for NAC and Perceiver IO side by side
    (NAC Fig. 4), then the lr check."""
    lines = _pretrain_table(results, models)
    rows = shared.shot_rows(results, models, lrs)
    if rows:
        main = shared.curves(results.values())
        gap_label = " − ".join(MODELS[m].label.split(" (")[0] for m in models) if len(models) == 2 else "gap"
        epochs = "/".join(str(e) for e in sorted({r["epochs"] for m in models
                                                   for r in main.get((m, lrs[m]), {}).values()}))
        lines += [f"\n### Few-shot fine-tuning on {TARGET} (1×32×32), {WAYS} ways, all parameters, {epochs} epochs, "
                  f"batch ≤ {FINETUNE_BATCH}, RAdam at a constant lr "
                  f"({', '.join(f'{MODELS[m].label} {lrs[m]:g}' for m in models)}); top-1 % on the test images of "
                  f"the drawn classes, mean ± std over seeds (chance {100 / WAYS:.1f})\n",
                  common.markdown_table(["samples per class", *(MODELS[m].label for m in models), gap_label, "seeds"],
                                        rows), f"\npaper: {PAPER}."]
    checks = shared.check_rows(results, {m: MODELS[m].label for m in MODELS})
    if checks:
        lines += [f"\n### Learning-rate check (seed {CHECK_SEED}, a subset none of the curve's seeds draws; top-1 %)\n",
                  common.markdown_table(["model", "samples per class", "lr", "top-1"], checks)]
    return "\n".join(lines)


def plot(results: dict[str, dict], models: list[str], lrs: dict[str, float], path: Path) -> Path | None:
    """Top-1 vs samples per class (log x), both models, error bars = std over seeds (NAC Fig. 4)."""
    return shared.plot(results, models, {m: MODELS[m].label for m in MODELS}, lrs, path,
                       xlabel=f"training samples per class ({WAYS} classes)", ylabel=f"{TARGET} test top-1 (%)",
                       title="Few-shot adaptation after Fashion-MNIST pre-training (NAC Fig. 4, CPU)",
                       chance=100 / WAYS)


def report(out: Path, models: list[str], lrs: dict[str, float]) -> str:
    results = load_results(out / "results.jsonl")
    table = format_table(results, models, lrs)
    atomic_write_text(out / "table.md", "# NAC Fig. 4 at CPU scale (modwire.experiments.nac_fewshot)\n" + table + "\n")
    figure = plot(results, models, lrs, out / "fewshot.png")
    return table + f"\n\ntable: {out / 'table.md'}" + (f", plot: {figure}" if figure else
                                                         " (no plot: no curve yet, or no matplotlib)")


# ----------------------------------------------------------------------------- the command

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, "runs/experiments/nac_fewshot", "3 pre-training steps, 1 fine-tuning epoch",
                       workers=max(1, min(2, os.cpu_count() or 1)),
                       report="print the table of what OUT/results.jsonl holds and rebuild OUT/study.json")
    shared.add_arguments(ap, {m: MODELS[m].finetune_lr for m in MODELS}, {m: MODELS[m].label for m in MODELS},
                         SHOTS, check_help=f"also fine-tune seed {CHECK_SEED} at lrs {LR_CHECK}, k = {LR_CHECK_SHOTS}")
    return shared.parse_arguments(ap, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    params = {"root": args.data_root} if args.data_root else {}

    def check_data() -> None:
        shared.require_readable("nac_fewshot.py", "the pre-training set", PRETRAIN_TASK, params)
    return shared.run_study(args, "nac_fewshot", check_data=check_data, plan=plan, run_jobs=run_jobs, report=report,
                            lrs={m: lr_of(m, args) for m in MODELS}, script=__file__, argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
