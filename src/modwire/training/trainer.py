"""The training loop, in plain PyTorch, in nanoGPT's shape; the same loop for every kind of run.

``train(config)`` asks the run-kind table (:mod:`modwire.training.kinds`) how the config's model
trains: its kind builds the model, data and optimizers and a :class:`~modwire.training.run.Program`
(supervised learning: :mod:`modwire.training.supervised`; a GAN's: :mod:`modwire.training.gan`). The
loop here runs one iteration per optimizer step, in commented sections: evaluate / checkpoint when an
epoch (or the run) has ended → the program's step → log. It owns what every run shares: the run
directory and its lock, the config record and resume checks, signals, the non-finite guard
(:mod:`~modwire.training.divergence`), ``torch.compile`` (:mod:`~modwire.training.precision`),
checkpoints (``last``, ``best`` by the program's metric, ``keep_weights_every``), ``metrics.jsonl``
and the config's other ``loggers`` (every ``log_every`` steps; :mod:`~modwire.training.loggers`), the
header and progress. Everything that must survive a restart lives
in a :class:`~modwire.training.state.TrainState` (model, optimizer, scheduler, scaler, EMA, counters,
RNG states), saved atomically and checksummed. No model-specific code here.

Resume and faults (see docs/training.md, "Runs you do not lose"):

- ``train(config, resume=True)`` continues exactly where the last checkpoint left off:
  data order and mixup draws are functions of ``(seed, epoch, position)``
  (``modwire.seeding``), the position inside the epoch and every RNG state are saved, so
  a run killed between checkpoints and resumed ends with the same weights as one never
  interrupted. The run's ``config.yaml`` decides; differences are refused
  (``modwire.training.resume``).
- The run directory is locked while a run writes it (``modwire.training.lock``).
- SIGINT and SIGTERM (what cluster schedulers such as Slurm send before SIGKILL) finish
  the current step or validation batch, write ``last`` and return exit code 130 / 143
  (``modwire.training.signals``).
"""
from __future__ import annotations

import contextlib
import math
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import torch
from omegaconf import OmegaConf
from torch import Tensor

from . import distributed
from .checkpoint import RUN_ID_NAME, check_checkpoint_owner, checkpoint_step, choose_checkpoint
from .ema import weights_note
from .config import TrainConfig, check_run_length
from .divergence import NonFiniteGuard, TrainingDiverged, last_saved_step
from .feedback import Feedback
from .kinds import kind_of_config
from .loggers import check_loggers, open_loggers
from .lock import RunLock
from .precision import check_compile_target, compile_mode, compile_net
from .resume import (CONFIG_NAME, RESUMES_NAME, absolute_roots, check_resume,
                     record_resume, run_id, saved_config_changes, write_config_once)
from .run import TrainingRun
from .signals import StopSignals
from .state import TrainState
from ..errors import UserError, UserTypeError

__all__ = ["train"]


# ----------------------------------------------------------------------------- the loop

def train(cfg: TrainConfig, resume: bool = False, *, allow_change: Iterable[str] = (),
          overwrite: bool = False) -> dict[str, Any]:
    """Run (or resume) training in ``cfg.out_dir``.

    ``resume``: continue from ``checkpoints/last``; ``cfg`` must equal the run's config
    except for the harmless keys named in ``allow_change`` (``modwire.training.resume``).
    ``overwrite``: discard an earlier run in ``out_dir`` (otherwise refused).
    Returns ``{"status": "finished" | "interrupted", "step", "val", "best", "model",
    "run_dir", "exit_code"}`` (exit code 0, or 130 / 143 after SIGINT / SIGTERM)."""
    if not isinstance(cfg, TrainConfig) and OmegaConf.get_type(cfg) is not TrainConfig:
        raise UserTypeError(f"train: expected a TrainConfig from modwire.training.load_config(path, overrides), "
                            f"got {type(cfg).__name__}")
    kind = kind_of_config(cfg)                 # how this model trains (kinds.py): supervised, adversarial, ...
    check_loggers(cfg.loggers)                 # a named logger whose package is missing: refused now (loggers.py)
    # a bad model or task fails here, before the run directory is touched (computed once, used by build_run)
    overrides = None if cfg.finetune.init else kind.model_overrides(cfg)
    cfg = absolute_roots(cfg)                  # recorded absolute: a resume from elsewhere reads the same data
    dist_info = distributed.setup(cfg.device)
    run_dir = Path(cfg.out_dir)
    with (RunLock(run_dir) if dist_info.main else contextlib.nullcontext()), StopSignals() as stop:
        changes = prepare_directory(cfg, run_dir, resume=resume, allow=allow_change, overwrite=overwrite) \
            if dist_info.main else {}
        run, state = kind.build_run(cfg, dist_info, run_dir, overrides)    # writes nothing; raises on bad data
        check_compile_target(cfg.compile, state.model, dist_info.device)   # precision.py
        set_grad_checkpointing(state.model, cfg.grad_checkpointing)
        check_run_length(cfg, run.total)                   # settings that count steps vs the run's length
        if overwrite and dist_info.main:
            discard_previous_run(run_dir)                  # only once the new run is known to build
        if resume:
            if dist_info.main:                      # a checkpoint of another run is refused (resume.py)
                state.run_id = check_checkpoint_owner(run_dir, run_dir / "checkpoints" / "last")
                if (run_dir / "checkpoints" / "best").is_symlink():          # kept as this run's best
                    check_checkpoint_owner(run_dir, run_dir / "checkpoints" / "best")
            state.load(run_dir / "checkpoints" / "last")
        if dist_info.main:
            write_config_once(run_dir, cfg)        # never replaced (resume.py)
            state.run_id = run_id(run_dir, state.run_id)   # created with the run; each checkpoint carries it
            if resume:
                record_resume(run_dir, state.step, changes)
                restore_best(run, state)
        start(run, state, resumed=resume)
        run.guard = NonFiniteGuard(cfg.nonfinite, run_dir)
        try:
            while not stop.requested:
                # ---- evaluate and checkpoint when an epoch (or the run) has ended
                if state.val_pending:
                    validate_and_save(run, state, stop)
                    continue
                if state.step >= run.total:
                    break
                # ---- one optimizer step (the program's: supervised, or a GAN's D and G steps)
                losses = run.program.step(run, state)
                # ---- log; checkpoint every checkpoint_every steps
                log_step(run, state, losses)
                keep_weights(run, state)
                if run.cfg.checkpoint_every and state.step % run.cfg.checkpoint_every == 0 \
                        and not (state.val_pending or stop.requested):
                    save(run, state, "last")
            if stop.requested:  # SIGINT / SIGTERM: keep everything up to the last finished step
                save(run, state, "last")
        except TrainingDiverged as e:                      # recorded; the checkpoints are the last finite ones
            if run.log is not None and dist_info.main:
                run.log.log({"step": state.step, "epoch": state.epoch, "event": "diverged",
                             "first_nonfinite_step": e.step, "kept_checkpoint_step": last_saved_step(run_dir)})
            raise
        finally:
            finish(run)
    return {"status": "interrupted" if stop.requested else "finished", "step": state.step, "val": state.val,
            "best": state.best, "model": state.model, "run_dir": str(run_dir), "exit_code": stop.exit_code}


def set_grad_checkpointing(model: torch.nn.Module, enable: bool) -> None:
    """``grad_checkpointing``: the model's own :meth:`~modwire.models.base.PretrainedModel.set_grad_checkpointing`
    (before DDP and ``torch.compile`` wrap it); a model that cannot recompute its blocks is refused, saying why."""
    try:
        model.set_grad_checkpointing(enable)
    except UserError as e:
        raise UserError(f"config key 'grad_checkpointing': {e}") from None


def discard_previous_run(run_dir: Path) -> None:
    """``--overwrite``: delete an earlier run's checkpoints, config record and metrics."""
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    for name in (CONFIG_NAME, RESUMES_NAME, RUN_ID_NAME, "metrics.jsonl"):
        (run_dir / name).unlink(missing_ok=True)


def prepare_directory(cfg: TrainConfig, run_dir: Path, *, resume: bool, allow: Iterable[str],
                      overwrite: bool) -> dict[str, tuple]:
    """Check that ``run_dir`` may be (re)used; returns the allowed config changes of a resume.
    Called with the run directory locked; changes nothing on disk (``--overwrite`` deletes the earlier
    run later, in :func:`discard_previous_run`, once the new run has been built)."""
    last = run_dir / "checkpoints" / "last"
    if resume and overwrite:  # one continues the run, the other discards it: neither may win silently
        raise UserError(f"--resume continues the run in {run_dir} and --overwrite discards it: give one of them")
    if resume:
        if not (last / "state.pt").is_file():
            found = {tag: sorted(p.name for p in last.parent.glob(f"{tag}-*") if (p / "state.pt").is_file())
                     for tag in ("last", "best")}
            newest = (found["last"] or found["best"] or [None])[-1]   # zero-padded steps sort by name
            hint = (f"; the run still holds {', '.join(found['last'] + found['best'])}: restore the link with "
                    f"`ln -sfn {newest} {last}` to resume from {newest}" if newest else "")
            raise FileNotFoundError(f"--resume: no checkpoint at {last} (expected {last}/state.pt){hint}")
        return check_resume(run_dir, cfg, allow) if (run_dir / CONFIG_NAME).is_file() else {}
    if overwrite:
        return {}
    if last.is_symlink():
        raise UserError(f"out_dir {run_dir} already holds a run (checkpoint {last.resolve().name}): continue it "
                        f"with `modwire train --resume {run_dir}`, choose another out_dir, or pass --overwrite "
                        f"to discard it")
    elif (run_dir / CONFIG_NAME).is_file():
        differ = saved_config_changes(run_dir, cfg)
        if differ:
            raise UserError(f"out_dir {run_dir} holds another run's {CONFIG_NAME} (differing keys: "
                            f"{', '.join(differ)}): choose another out_dir, or pass --overwrite to discard it")
    return {}


def start(run: TrainingRun, state: TrainState, *, resumed: bool) -> None:
    """Wrap the model (DDP, compile), open the logs and print the run's summary."""
    cfg, main = run.cfg, run.dist.main
    run.net = state.model
    if run.dist.world > 1:
        run.net = torch.nn.parallel.DistributedDataParallel(
            state.model, device_ids=[run.device.index] if run.device.type == "cuda" else None)
    run.net = compile_net(run.net, cfg.compile, state.model)   # precision.py
    mode = compile_mode(cfg.compile)
    run.log = open_loggers(run.dir, cfg, main, resume_step=state.step if resumed else None)   # loggers.py
    run.feedback = Feedback(title=f"{cfg.model.name} on {cfg.data.task}", total=run.total, start=state.step,
                            enabled=cfg.progress, main=main)
    lines = run.program.summary(run, state)
    run.feedback.summary({
        "run directory": f"{run.dir} ({f'resumed at step {state.step}' if resumed else 'new run'})",
        "data": lines["data"],
        "parameters": f"{state.model.num_parameters():,} ({state.model.num_parameters(True):,} trainable)",
        "steps": lines["steps"],
        "device": f"{run.device} × {run.dist.world}, precision {cfg.precision}"
                  f"{f', compiled ({mode})' if mode else ''}{', gradient checkpointing' if cfg.grad_checkpointing else ''}"
                  f"{lines.get('workers', '')}",
        **({"fine-tuning": f"from {cfg.finetune.init} (weights: "
                           f"{weights_note(choose_checkpoint(cfg.finetune.init)[0], cfg.finetune.weights)}); "
                           f"training {', '.join(cfg.finetune.train)}"
                           f"{'; new task outputs' if cfg.finetune.new_task else ''}"} if cfg.finetune.init else {})})
    state.model.train()
    run.tick = time.perf_counter()


def finish(run: TrainingRun) -> None:
    if run.feedback is not None:
        run.feedback.close()
    if run.log is not None:
        run.log.close()
    distributed.teardown()


def log_step(run: TrainingRun, state: TrainState, losses: dict[str, Tensor]) -> None:
    """A record every ``log_every`` steps (the global batch's losses) to ``metrics.jsonl`` and the
    config's ``loggers``; progress."""
    rate = run.samples_per_second()
    record = None
    if state.step % run.cfg.log_every == 0 or state.step == run.total:
        values = torch.stack(list(losses.values()))
        if run.dist.world > 1:  # the global batch's losses, not rank 0's share (gloo has no AVG)
            torch.distributed.all_reduce(values)
            values /= run.dist.world
        if run.guard is not None:
            run.guard.check()                              # a host sync here anyway (the record's values)
        record = {"step": state.step, "epoch": state.epoch, **dict(zip(losses, values.tolist())),
                  "lr": state.scheduler.get_last_lr()[0], "samples_per_s": rate,
                  **({"skipped_steps": run.guard.skipped} if run.guard is not None and run.guard.skipped else {}),
                  **run.program.log_fields()}
        run.log.log(record)
        run.seen, run.tick = 0, time.perf_counter()
    run.feedback.step(record, state.val)


def validate_and_save(run: TrainingRun, state: TrainState, stop: StopSignals) -> None:
    """Validate (rank 0), log, write ``last`` and, when the metric improved, ``best``. An
    interrupt between validation batches leaves the validation pending (redone on resume)."""
    metrics = run.program.evaluate(run, state, stop) if run.dist.main else {}
    if run.dist.world > 1:
        torch.distributed.barrier()
    if metrics is None:
        return
    state.val, state.val_step, state.val_pending = metrics, state.step, False
    if metrics:                                            # a GAN scored with no score switched on: nothing
        run.log.log({"step": state.step, "epoch": state.epoch, **{f"val_{k}": v for k, v in metrics.items()}})
    improved = _improves_best(state, *run.program.best_metric)
    save(run, state, "last")
    if improved:
        save(run, state, "best")


def _improves_best(state: TrainState, key: str | None, lower_is_better: bool) -> bool:
    """Whether the metric ``key`` improved (the task's first metric, higher is better but perplexity;
    a GAN's classifier-FID, lower is better)."""
    value = (state.val or {}).get(key) if key else None
    if value is None or not math.isfinite(value):
        return False
    better = (lambda a, b: a < b) if lower_is_better else (lambda a, b: a > b)
    if state.best is None or better(value, state.best[key]):
        state.best = {key: value, "step": state.step}
        return True
    return False


def restore_best(run: TrainingRun, state: TrainState) -> None:
    """On resume: a run stopped between writing ``last`` and ``best`` (a full disk, a kill) recorded its
    best at this step without the checkpoint; ``last`` holds those weights, so ``best`` is written now."""
    best = run.dir / "checkpoints" / "best"
    if state.best and state.best.get("step") == state.step and \
            not (best.is_symlink() and checkpoint_step(best.resolve()) == state.step):
        save(run, state, "best")


def keep_weights(run: TrainingRun, state: TrainState) -> None:
    """``keep_weights_every``: the model's weights and config at this step, kept in
    ``checkpoints/weights-<step>/`` (a ``from_pretrained`` directory; e.g. AiT Fig. 10's patch
    diversity over training, ``modwire.analysis.workspace.diversity_over_training``)."""
    every = run.cfg.keep_weights_every
    if every and state.step % every == 0 and run.dist.main:
        state.eval_model.save_pretrained(run.dir / "checkpoints" / f"weights-{state.step:08d}")   # what is scored


def save(run: TrainingRun, state: TrainState, tag: str) -> None:
    """Write checkpoint ``tag``, unless the run diverged (:class:`TrainingDiverged`: nothing is written,
    ``last`` and ``best`` stay the last finite checkpoints)."""
    if run.guard is not None:
        run.guard.check(state.model.parameters())
    if run.dist.main:
        state.save(run.dir, tag)
