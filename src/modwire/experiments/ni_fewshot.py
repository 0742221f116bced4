"""NI Fig. 5a at CPU scale: few-shot adaptation of a pretrained Neural Interpreter vs a ViT.

The paper (NI §4.2, App. C.2) pre-trains a Neural Interpreter (Table 4) and a ViT (Table 5) of
almost equal validation accuracy on the digits multi-task data (SVHN, MNIST-M, MNIST; one CLS
token and head per dataset), then fine-tunes both on K-MNIST with varying numbers of samples:
10 epochs, batch 128, RAdam at a constant lr (0.05 NI, 0.03 ViT, found by grid search), 6 seeds,
"where the random seed also determines the subset" (App. C.2.2). Fig. 5a: NI adapts faster in
the low-data regime, and the gap closes gradually as more data becomes available.

This runs the same protocol on what the machine has, sized for a CPU:

* pre-training on ``digits_multitask_offline`` (three look-alike datasets made from
  scikit-learn's 8×8 digits, ``{x, task}`` input, one CLS token and head per dataset) with
  CPU-sized ``ni_digits`` / ``vit_digits`` (model overrides: 8×8 patches of the 32×32 image, i.e.
  16 patch tokens instead of 64, 64-d instead of 192-d, fewer iterations / layers; see
  :data:`MODELS`); no RandAugment (the generator already varies every item);
* few-shot fine-tuning of every parameter on Fashion-MNIST at 32×32 RGB (``fashion_mnist`` with
  ``upsample_to=32, channels=3``; Debian's ``dataset-fashion-mnist``, or ``--data-root DIR`` holding
  the four idx files), standing in for K-MNIST,
  with ``k`` samples per class (10 ways) for ``k`` in :data:`SHOTS`, 3 seeds, through
  :func:`modwire.training.finetune.finetune_overrides` / ``finetune_seeds`` (``modwire finetune``'s
  machinery: each seed a checkpointed, resumable run; the seed draws the subset). The k-shot
  subsets are drawn from the first :data:`POOL` training images and scored on the first
  :data:`POOL` test images (``data.max_samples``), which keeps the per-epoch validation cheap.

Each pre-training and each (model, k) fine-tuning (all its seeds) is one job in a pool of
single-threaded worker processes (pre-training first, both models in parallel); finished jobs are
appended to ``OUT/results.jsonl`` and skipped by a rerun, and an interrupted fine-tuning resumes
seed by seed. ``--lr-check`` fine-tunes one seed at a few learning rates (the paper's included),
to see whether App. C.2.2's constant rates still work at this scale. The table (mean ± std over
seeds per k, next to the paper's claim) is printed and written to ``OUT/table.md``, the plot to
``OUT/fewshot.png``, the study run's record to ``OUT/study.json`` (:mod:`modwire.experiments.common`).

Run: ``python -m modwire.experiments.ni_fewshot``; ``--lr-check`` fine-tunes seed 0 at a few learning
rates; ``--quick`` is a smoke test; ``--report`` reprints the table and rebuilds ``OUT/study.json`` from
``OUT/results.jsonl`` (no training). ``experiments/results/ni_fewshot/study.json`` is the run
reported in the README (its run logs are not committed; its table recorded the minutes each part
took); what it found is stated in docs/ni.md.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modwire.experiments import common
from modwire.experiments import fewshot as shared
from modwire.files import atomic_write_text

# ----------------------------------------------------------------------------- the models

PATCHES_8 = {"kind": "patches", "image_size": 32, "in_channels": 3, "patch_size": 8, "positions": "relative"}


@dataclass(frozen=True)
class Model:
    """A CPU-sized NI Table 4 / Table 5 model: preset, its ``model.overrides``, pre-training budget, and
    the constant fine-tuning lr (NI App. C.2.2 unless the lr check says otherwise)."""

    key: str
    label: str
    preset: str
    overrides: Mapping[str, Any]
    steps: int                     # pre-training steps at batch 128
    lr: float                      # pre-training peak lr (cosine to 1e-6, no warm-up, as Tables 4-5)
    finetune_lr: float


# NI Table 4 keeps its structure (1 script, 5 functions, 1 LOC, frozen signatures, τ = 1.4,
# d_type = 24, 4 heads, relative positions); widths 192 → 64, 8 → 2 function iterations.
NI_SETS = {"tokenizer": PATCHES_8, "d_model": 64, "d_code": 64, "num_iterations": 2, "num_heads": 4, "qk_head_dim": 16,
           "ffn_hidden": 128, "type_hidden": 64, "pos_dim": 16}
# NI Table 5 (8 layers of 192-d, 3 heads × 64, MLP 192) → 4 layers of 64-d, 2 heads × 32, MLP 128.
VIT_SETS = {"tokenizer": PATCHES_8, "d_model": 64, "num_layers": 4, "num_heads": 2, "ffn_hidden": 128, "pos_dim": 16}
MODELS = {
    "ni": Model("ni", "Neural Interpreter", "ni_digits", NI_SETS, steps=1500, lr=2e-3, finetune_lr=0.05),
    "vit": Model("vit", "ViT", "vit_digits", VIT_SETS, steps=1500, lr=2e-3, finetune_lr=0.03),
}
# --quick: micro models, a few steps
QUICK_SETS = {"tokenizer": {**PATCHES_8, "patch_size": 16}, "d_model": 16, "num_heads": 2, "ffn_hidden": 16, "pos_dim": 4}
QUICK_EXTRA = {"ni": {"d_code": 16, "num_iterations": 1, "qk_head_dim": 4, "type_hidden": 16, "num_functions": 2,
                      "d_type": 4},
               "vit": {"num_layers": 1}}

PRETRAIN_TASK = "digits_multitask_offline"
PRETRAIN_SIZE = {"train": 12000, "val": 1500, "test": 10}
TARGET, TARGET_PARAMS = "fashion_mnist", {"upsample_to": 32, "channels": 3}
SHOTS = (1, 2, 5, 10, 20)
POOL = 2000                        # data.max_samples of the fine-tuning runs
EPOCHS = 10                        # NI App. C.2.2
# NI App. C.2.2 fine-tunes at batch 128; a k-shot 10-way set of k ≤ 20 holds at most 200 samples,
# which at 128 (ragged tail skipped) is one optimizer step per epoch. 16 gives 1-12 steps per epoch.
FINETUNE_BATCH = 16
LR_CHECK = {"ni": (0.05, 3e-3, 1e-3), "vit": (0.03, 3e-3, 1e-3)}
LR_CHECK_SHOTS = (5,)
PAPER = ("NI Fig. 5a (K-MNIST, 6 seeds; no numbers in the text): NI ahead of an equally accurate ViT in the "
         "low-data regime, the gap closing gradually as more data becomes available")


# ----------------------------------------------------------------------------- the jobs

@dataclass(frozen=True)
class Job:
    """Pre-training of a model (``shots == -1``) or its fine-tuning with ``shots`` per class over
    ``seeds`` seeds at ``lr``."""

    model: str
    shots: int = -1
    seeds: int = 0
    lr: float = 0.0
    quick: bool = False
    check: bool = False            # a run of the lr check (seed 0), kept apart from the curve
    data_root: str | None = None   # Fashion-MNIST's directory (None: the loader's default, Debian's path)

    @property
    def pretrain(self) -> bool:
        return self.shots < 0

    @property
    def key(self) -> str:
        if self.pretrain:
            return f"pretrain/{self.model}"
        return f"{'lrcheck' if self.check else 'finetune'}/{self.model}_lr{self.lr:g}/{self.shots}shot"

    def pretrain_config(self, out: Path):
        from modwire.training import load_config

        m = MODELS[self.model]
        overrides = {**m.overrides, **QUICK_SETS, **QUICK_EXTRA[self.model]} if self.quick else m.overrides
        sets = {"model.name": m.preset, "model.overrides": overrides, "data.task": PRETRAIN_TASK,
                "data.batch_size": 16 if self.quick else 128,
                "data.params.size": {"train": 48, "val": 30, "test": 3} if self.quick else PRETRAIN_SIZE,
                "optim.name": "radam", "optim.lr": m.lr, "optim.min_lr": 1e-6, "optim.warmup_steps": 0,
                "optim.weight_decay": 0, "max_steps": 3 if self.quick else m.steps, "epochs": 1000,
                "progress": False, "log_every": 25, "seed": 0, "out_dir": out / self.key}
        return load_config(values=sets)

    def finetune_config_for(self, out: Path) -> tuple[Callable, Path]:
        """``(config_for(seed, run_dir), OUT of finetune_seeds)`` as ``modwire finetune`` builds them: its
        ``--set`` overrides (:func:`~modwire.training.finetune.finetune_overrides`) with the study's values
        (keys those overrides do not set)."""
        from modwire.training import load_config
        from modwire.training.finetune import finetune_overrides

        base, _ = finetune_overrides(out / Job(self.model).key, TARGET, train=["all"], shots=self.shots, ways=10,
                                     epochs=1 if self.quick else EPOCHS, lr=self.lr,
                                     batch_size=min(FINETUNE_BATCH, self.shots * 10))
        pool = max(100, 20 * self.shots) if self.quick else POOL   # quick: twice the shots of each of 10 classes
        extra = {"data.params": target_params(self.data_root), "data.val_split": "test", "data.max_samples": pool,
                 "progress": False, "log_every": 1000}

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
    from modwire.training import train

    cfg = job.pretrain_config(out)
    result = train(cfg, overwrite=True)
    if result["status"] != "finished":    # stopped by a signal: not a result (a rerun trains it again)
        raise RuntimeError(f"interrupted at step {result['step']} of {cfg.max_steps}")
    params = sum(p.numel() for p in result["model"].parameters())
    return {"val": result["val"], "steps_done": result["step"], "parameters": params}


def _finetune(job: Job, out: Path) -> dict:
    config_for, ft_out = job.finetune_config_for(out)
    record = shared.finetune(config_for, list(range(job.seeds)), ft_out)
    return {k: v for k, v in record.items() if k != "ways"}     # NI Fig. 5a: always 10


load_results = shared.load_results


def _done(job: Job, done: dict[str, dict]) -> bool:
    return shared.finished(done.get(job.key), pretrain=job.pretrain, seeds=job.seeds, quick=job.quick)


def run_jobs(jobs: list[Job], out: Path, workers: int, log: Callable[[str], None] = print) -> list[str]:
    """Run the jobs not yet in ``out/results.jsonl`` on ``workers`` processes (0: in this one),
    appending each record as it finishes. Returns the failures."""
    return common.run_grid(run_job, [(j, str(out)) for j in jobs], out / "results.jsonl", key=lambda a: a[0].key,
                           finished=lambda a, done: _done(a[0], done), workers=workers, describe=shared.brief,
                           noun="jobs", verb="run", log=log)


# ----------------------------------------------------------------------------- the plan

def plan(args: argparse.Namespace) -> tuple[list[Job], list[Job]]:
    """``(pre-training jobs, fine-tuning jobs)``: NI's longest first, so the pool ends together."""
    models, shots = shared.parse_plan(args, MODELS, "ni_fewshot.py")
    pre = [Job(m, quick=args.quick) for m in models]
    ft: list[Job] = []
    root = args.data_root
    if args.lr_check:
        check_shots = shots[:1] if args.quick else LR_CHECK_SHOTS
        ft += [Job(m, k, 1, lr, args.quick, check=True, data_root=root)
               for m in models for k in check_shots for lr in LR_CHECK[m]]
    if not args.lr_check_only:
        ft += [Job(m, k, args.seeds, lr_of(m, args), args.quick, data_root=root) for m in models for k in shots]
    unique = {j.key: j for j in ft}
    return pre, sorted(unique.values(), key=lambda j: (j.model != "ni", -j.shots))


def lr_of(model: str, args: argparse.Namespace) -> float:
    return shared.lr_of(model, args, lambda m: MODELS[m].finetune_lr)


# ----------------------------------------------------------------------------- the report

def format_table(results: dict[str, dict], models: list[str], lrs: dict[str, float]) -> str:
    """Markdown: the pre-trained models, then top-1 per k for NI and ViT side by side (NI Fig. 5a),
    then the lr check."""
    pre = [[MODELS[m].label, f"{r['parameters']:,}", r["steps_done"], f"{100 * r['val']['top1']:.1f}",
            *(f"{100 * r['val'].get(f'top1_{s}', float('nan')):.1f}" for s in ("svhn_like", "mnist_m_like", "mnist_like")),
            f"{r['seconds'] / 60:.1f}"] for m in models if (r := results.get(Job(m).key))]
    lines = ["\n### Pre-training on digits_multitask_offline (validation top-1 %)\n", common.markdown_table(
        ["model", "parameters", "steps", "top-1", "SVHN-like", "MNIST-M-like", "MNIST-like", "minutes"], pre)]
    rows = shared.shot_rows(results, models, lrs)
    if rows:
        lines += [f"\n### Few-shot fine-tuning on {TARGET} 32×32 RGB, 10 ways, all parameters, {EPOCHS} epochs, "
                  f"RAdam at a constant lr ({', '.join(f'{MODELS[m].label} {lrs[m]:g}' for m in models)}); "
                  f"top-1 % on the first {POOL} test images, mean ± std over seeds\n",
                  common.markdown_table(["samples per class", *(MODELS[m].label for m in models), "NI − ViT", "seeds"],
                                        rows), f"\npaper: {PAPER}."]
    checks = shared.check_rows(results, {m: MODELS[m].label for m in MODELS}, lr_descending=True)
    if checks:
        lines += ["\n### Learning-rate check (seed 0; top-1 %)\n",
                  common.markdown_table(["model", "samples per class", "lr", "top-1"], checks)]
    return "\n".join(lines)


def plot(results: dict[str, dict], models: list[str], lrs: dict[str, float], path: Path) -> Path | None:
    """Top-1 vs samples per class (log x), both models, error bars = std over seeds (NI Fig. 5a)."""
    return shared.plot(results, models, {m: MODELS[m].label for m in MODELS}, lrs, path,
                       xlabel="training samples per class (10 classes)", ylabel=f"{TARGET} test top-1 (%)",
                       title="Few-shot adaptation after digits pre-training (NI Fig. 5a, CPU)")


def report(out: Path, models: list[str], lrs: dict[str, float]) -> str:
    results = load_results(out / "results.jsonl")
    table = format_table(results, models, lrs)
    atomic_write_text(out / "table.md", "# NI Fig. 5a at CPU scale (modwire.experiments.ni_fewshot)\n" + table + "\n")
    figure = plot(results, models, lrs, out / "fewshot.png")
    return table + f"\n\ntable: {out / 'table.md'}" + (f", plot: {figure}" if figure else
                                                         " (no plot: no curve yet, or no matplotlib)")


# ----------------------------------------------------------------------------- the command

def target_params(data_root: str | None) -> dict:
    """The fine-tuning set's ``data.params``: :data:`TARGET_PARAMS`, and ``root`` when one is given."""
    return {**TARGET_PARAMS, **({"root": data_root} if data_root else {})}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = common.parser(__doc__, "runs/experiments/ni_fewshot", "micro models, 3 pre-training steps",
                       workers=max(1, min(2, os.cpu_count() or 1)),
                       report="print the table of what OUT/results.jsonl holds")
    shared.add_arguments(ap, {m: MODELS[m].finetune_lr for m in MODELS}, {m: MODELS[m].label for m in MODELS},
                         SHOTS, check_help=f"also fine-tune seed 0 at lrs {LR_CHECK}, k = {LR_CHECK_SHOTS}")
    return shared.parse_arguments(ap, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    params = target_params(args.data_root)

    def check_data() -> None:
        shared.require_readable("ni_fewshot.py", "the few-shot target", TARGET, params)
    return shared.run_study(args, "ni_fewshot", check_data=check_data, plan=plan, run_jobs=run_jobs, report=report,
                            lrs={m: lr_of(m, args) for m in MODELS}, script=__file__, argv=argv)


if __name__ == "__main__":
    raise SystemExit(main())
