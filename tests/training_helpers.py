"""Helpers shared by the training and robustness tests."""
import os
import signal


def signal_after_step(monkeypatch, step: int, signum: int = signal.SIGINT) -> None:
    """Deliver ``signum`` to this process right after optimizer step ``step`` (a real signal,
    handled by the trainer like one from a user or a cluster scheduler)."""
    from modwire.training import supervised as trainer

    real = trainer.optimizer_step

    def step_then_signal(run, state, *rest):
        real(run, state, *rest)
        if state.step == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(trainer, "optimizer_step", step_then_signal)


def train_toy_run(out, *extra: str):
    """A finished ``nac_micro`` run on ``toy_sets`` (batch 16, no progress bar) in ``out``; ``extra``:
    more ``key=value`` overrides. Returns ``out``. (Register ``toy_sets`` by importing ``toy_task``.)"""
    from modwire.training import load_config, train

    train(load_config(None, [f"out_dir={out}", "model.name=nac_micro", "data.task=toy_sets", "data.batch_size=16",
                             "progress=false", *extra]))
    return out
