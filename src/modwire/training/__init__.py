"""Training: typed config, optimizer and schedule, a TrainState with atomic, checksummed
checkpoints, the loop, resume rules, run locks, signals, torchrun support; and the public
runtime helpers (``autocast``, ``make_loader``, ``evaluate``, ``to_device``, ``call_model``)
that evaluation and ``modwire.analysis`` share with the trainer; the training objective
(``Objective``: the loss, epoch hook and parameter groups ``modwire train`` uses) for other loops."""
from .config import TrainConfig, load_config
from .objective import Loss, Objective
from .precision import autocast
from .runtime import call_model, evaluate, make_loader, to_device
from .state import TrainState
from . import gan, supervised  # noqa: F401  (register their rows of the run-kind table, training/kinds.py)
from .supervised import apply_augmentation, build_datasets, build_model_for_task
from .trainer import train

__all__ = ["Loss", "Objective", "TrainConfig", "TrainState", "apply_augmentation", "autocast", "build_datasets",
           "build_model_for_task", "call_model", "evaluate", "load_config", "make_loader", "to_device", "train"]
