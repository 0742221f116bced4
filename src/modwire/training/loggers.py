"""Where a run's records go: ``metrics.jsonl`` always, and the loggers the config's ``loggers`` names.

A record is what the trainer logs every ``log_every`` steps, after each validation and on a
divergence, for every kind of run (supervised, GAN): a flat dict ``{"step": int, "epoch": int,
"loss": float, ..., "val_top1": float, ...}``. A logger is anything with the two methods of
:class:`Logger`; it is made once per run, on the main process only, by a factory called as
``factory(run_dir=Path, config=TrainConfig, resume_step=int | None)`` (``resume_step``: the step a
resume continues from; None for a new run). ``loggers`` takes the names of :data:`LOGGERS` and
import paths ``"package.module:attribute"`` of your own factories (a class taking those keywords):

==============  ==========================================================================================
``jsonl``       ``metrics.jsonl`` (:class:`~modwire.training.feedback.MetricsLog`): always written, not
                named in ``loggers``; what ``modwire eval``, the analyses and a resume read
``csv``         ``metrics.csv``: one row per record, a column per key (new keys widen the file)
``tensorboard`` ``tensorboard/`` event files (``pip install 'modwire[tensorboard]'``)
``mlflow``      an MLflow run in ``$MLFLOW_TRACKING_URI``, else in ``mlflow.db`` (SQLite) in the run directory
                (``pip install 'modwire[mlflow]'``)
``wandb``       a W&B run in offline mode under ``wandb/`` (``pip install 'modwire[wandb]'``; ``wandb sync``
                uploads it later)
==============  ==========================================================================================

On resume, records after the resumed step are dropped where the format allows (``metrics.jsonl``,
``metrics.csv``; TensorBoard purges them), so the log matches an uninterrupted run; MLflow and W&B
continue the same run (its id is kept in the run directory) and keep what they were sent. The
packages are imported when a run opens its loggers, never at import time; one that is named but
not installed is refused before the run starts, naming the extra to install.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from ..errors import UserError
from ..fields import ChoicesOrImport, flatten, import_object
from ..files import append_line, atomic_write_text, read_lines
from .feedback import MetricsLog

__all__ = ["LOGGERS", "LOGGER_CHOICES", "CsvLogger", "Logger", "MlflowLogger", "RunLoggers", "TensorBoardLogger",
           "WandbLogger", "check_logger_names", "check_loggers", "open_loggers"]


@runtime_checkable
class Logger(Protocol):
    """What a run logs to: ``log(record)`` with each record (a flat dict with ``step`` and
    ``epoch``), ``close()`` once when the run ends (finished, interrupted or failed)."""

    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers to plot against its ``step``: every int or float field but ``step`` and
    ``epoch`` (a bool, a string such as ``event``, a None are left out)."""
    return {k: float(v) for k, v in record.items()
            if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def config_items(config: Any) -> dict[str, Any]:
    """A run's config (a :class:`~modwire.training.config.TrainConfig`) as ``{"optim.lr": 3e-4, ...}``:
    every leaf by its dotted key (:func:`modwire.fields.flatten`), as a tracker's parameters."""
    return flatten(config)


class CsvLogger:
    """``RUN/metrics.csv``: a header row of the keys in the order first seen (``step``, ``epoch``
    first), one row per record, an empty cell where a record lacks a key (a validation record has
    no ``loss``). A record with a new key rewrites the file atomically with the wider header (a few
    times per run); otherwise a row is appended. On resume, rows after the resumed step are dropped."""

    def __init__(self, run_dir: Path, config: Any, resume_step: int | None) -> None:
        self.path = Path(run_dir) / "metrics.csv"
        self.columns: list[str] = ["step", "epoch"]
        rows: list[dict[str, str]] = []
        if resume_step is not None and self.path.exists():
            reader = csv.DictReader(io.StringIO("\n".join(read_lines(self.path))))
            self.columns = list(reader.fieldnames or self.columns)
            rows = [r for r in reader if r.get("step") and int(r["step"]) <= resume_step]
        self._rewrite(rows)

    def log(self, record: dict[str, Any]) -> None:
        new = [k for k in record if k not in self.columns]
        if new:
            reader = csv.DictReader(io.StringIO("\n".join(read_lines(self.path))))
            rows = list(reader)
            self.columns += new
            self._rewrite(rows + [record])
        else:
            append_line(self.path, self._line(record))

    def _line(self, record: dict[str, Any]) -> str:
        out = io.StringIO()
        csv.DictWriter(out, self.columns, lineterminator="").writerow(
            {k: "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v for k, v in record.items()})
        return out.getvalue()

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        header = io.StringIO()
        csv.writer(header, lineterminator="").writerow(self.columns)
        atomic_write_text(self.path, "".join(line + "\n" for line in [header.getvalue(), *map(self._line, rows)]))

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """``RUN/tensorboard/``: each number of a record (:func:`scalars`) as a scalar at its ``step``.
    On resume, events after the resumed step are purged (``SummaryWriter(purge_step=...)``)."""

    def __init__(self, run_dir: Path, config: Any, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)

    def log(self, record: dict[str, Any]) -> None:
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self.writer.close()


def _kept_id(path: Path, resume_step: int | None) -> str | None:
    """The tracker's run id a resume continues (kept in ``path``), None for a new run."""
    if resume_step is None or not path.is_file():
        return None
    return path.read_text().strip() or None


class MlflowLogger:
    """An MLflow run (experiment ``modwire``, named after the run directory) in the tracking store
    ``$MLFLOW_TRACKING_URI`` when it is set, else a local one in the run directory, ``RUN/mlflow.db``
    (SQLite, MLflow's local store since the ``./mlruns`` file store went into maintenance;
    ``mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db`` shows it): the config as the run's
    parameters (dotted keys), each number of a record as a metric at its ``step``. Its id is kept in
    ``RUN/mlflow_run_id``; a resume continues that run (metrics it was sent after the resumed step
    stay in its history: MLflow deletes none)."""

    def __init__(self, run_dir: Path, config: Any, resume_step: int | None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir).absolute()
        self.client = MlflowClient(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI")
                                   or f"sqlite:///{run_dir / 'mlflow.db'}")
        experiment = self.client.get_experiment_by_name("modwire")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("modwire")
        id_file = run_dir / "mlflow_run_id"
        self.run_id = _kept_id(id_file, resume_step)
        if self.run_id is None:
            self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            atomic_write_text(id_file, self.run_id + "\n")
            params = [Param(k, str(v)[:6000]) for k, v in config_items(config).items()]
            for i in range(0, len(params), 100):                  # MLflow takes at most 100 per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(record["step"])) for k, v in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbLogger:
    """A W&B run in offline mode under ``RUN/wandb/`` (project ``modwire``, named after the run
    directory; ``wandb sync RUN/wandb/offline-run-*`` uploads it): the config as the run's config
    (dotted keys), each number of a record at its ``step``. Its id is kept in ``RUN/wandb_run_id``; a
    resume continues that run (W&B ignores records at steps it already has)."""

    def __init__(self, run_dir: Path, config: Any, resume_step: int | None) -> None:
        import wandb

        run_dir = Path(run_dir).absolute()
        id_file = run_dir / "wandb_run_id"
        run_id = _kept_id(id_file, resume_step) or secrets.token_hex(4)   # W&B's form: 8 of [a-z0-9]
        atomic_write_text(id_file, run_id + "\n")
        self.run = wandb.init(mode="offline", dir=str(run_dir), project="modwire", name=run_dir.name, id=run_id,
                              resume="allow", config=config_items(config), reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


#: ``loggers`` names → (factory, the module it needs, the extra that installs it)
LOGGERS: dict[str, tuple[Callable[..., Logger], str | None, str | None]] = {
    "csv": (CsvLogger, None, None),
    "tensorboard": (TensorBoardLogger, "tensorboard", "tensorboard"),
    "mlflow": (MlflowLogger, "mlflow", "mlflow"),
    "wandb": (WandbLogger, "wandb", "wandb"),
}
LOGGER_CHOICES = ChoicesOrImport(tuple(LOGGERS), note="metrics.jsonl is always written: leave jsonl out; an import path names your logger's "
                                                      "factory f(run_dir=, config=, resume_step=)")


def check_logger_names(names: list[str]) -> None:
    """Refuse a logger named twice (when the config is read; the ``choices`` table checks each name)."""
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise UserError(f"config key 'loggers': {twice} named more than once; give each logger once")


def check_loggers(names: list[str]) -> None:
    """Refuse a named logger whose package is not installed: before the run starts (not when the config
    is read, so a run's config still loads, e.g. for ``modwire eval``, where the package is missing)."""
    for name in names:
        module, extra = LOGGERS[name][1:] if name in LOGGERS else (None, None)
        if module is not None and importlib.util.find_spec(module) is None:
            raise UserError(f"config key 'loggers': {name!r} needs the {module} package, which is not installed: "
                            f"pip install 'modwire[{extra}]'")


class RunLoggers:
    """The run's loggers as one: ``metrics.jsonl`` first, then those of ``loggers`` in order. On
    processes other than the main one nothing is written."""

    def __init__(self, jsonl: MetricsLog, others: list[Logger]) -> None:
        self.jsonl, self.others = jsonl, others

    def log(self, record: dict[str, Any]) -> None:
        self.jsonl.log(record)
        for logger in self.others:
            logger.log(record)

    def close(self) -> None:
        for logger in [self.jsonl, *self.others]:
            logger.close()


def open_loggers(run_dir: Path, config: Any, main: bool, resume_step: int | None) -> RunLoggers:
    """``metrics.jsonl`` and the loggers ``config.loggers`` names (main process only)."""
    jsonl, others = MetricsLog(Path(run_dir), main, resume_step), []
    for name in (config.loggers if main else []):
        factory = LOGGERS[name][0] if name in LOGGERS else import_object(name, f"config key 'loggers': {name!r}")
        logger = factory(run_dir=Path(run_dir), config=config, resume_step=resume_step)
        if not (callable(getattr(logger, "log", None)) and callable(getattr(logger, "close", None))):
            raise UserError(f"config key 'loggers': {name!r} made a {type(logger).__name__}, expected a logger with "
                            f"methods log(record) and close() (modwire.training.loggers.Logger)")
        others.append(logger)
    return RunLoggers(jsonl, others)
