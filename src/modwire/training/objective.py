"""The training objective of ``modwire train``, public: the loss it optimises for a model and a batch,
the hook it calls at each epoch's start and the parameter groups it gives the optimizer, so a
Lightning module, ``accelerate`` or a hand-written loop trains the same thing (docs/training.md,
"Your own training loop").

The supervised run kind (:mod:`modwire.training.supervised`) calls :class:`Objective` for every
micro-batch; there is no second copy of the objective.

* **Loss**: the task's loss (:func:`~modwire.training.runtime.compute_loss`: cross-entropy with
  ``optim.label_smoothing``, soft targets after mixup, MSE, BCE, token cross-entropy) plus
  ``Σ weight · loss`` over the auxiliary losses the model reported for that forward pass
  (``model.auxiliary_losses()``: NAC's graph regularizer, App. A, Eq. 6-9; AiT's balance loss, AiT
  Eq. 5-6), with weights from the config's ``aux_loss_weights`` over the model's paper defaults
  (``aux_loss_defaults``, e.g. AiT's σ = 1e-2). A reported loss without a weight, or a configured
  weight without a loss, is refused: none is added or dropped silently.
* **Epoch hook**: a model with the ``EpochAware`` capability is told each training epoch's start with
  a generator seeded by ``(seed, epoch)`` (AiT's "reset memory", Table 2).
* **Parameter groups**: weight decay for all trainable parameters but those the model exempts
  (:func:`modwire.training.optim.param_groups`).

Batch mixing (``data.mixup``, :mod:`modwire.training.mixup`) comes before the objective: it turns a
batch's labels into soft targets ``[B, C]``, which the task loss takes as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ..errors import UserError
from ..models.base import PretrainedModel
from ..models.capabilities import EpochAware
from ..seeding import torch_generator
from ..tasks import get_task
from .optim import param_groups
from .runtime import Batch, call_model, compute_loss

__all__ = ["Loss", "Objective"]


@dataclass(frozen=True)
class Loss:
    """One batch's objective. ``total``: what is back-propagated (the task loss plus the weighted
    auxiliary losses, scalar); ``task``: the task loss; ``aux``: each auxiliary loss, unweighted."""

    total: Tensor
    task: Tensor
    aux: dict[str, Tensor]

    def logged(self) -> dict[str, Tensor]:
        """The values ``modwire train`` logs: ``loss`` (the task's) and ``aux/<name>``, detached."""
        return {"loss": self.task.detach(), **{f"aux/{k}": v.detach() for k, v in self.aux.items()}}


@dataclass
class Objective:
    """What ``modwire train`` optimises (module docstring). :meth:`from_config` reads it from a
    training config; ``objective(model, x, y)`` is the :class:`Loss` of a batch.

    ``task``: the task's ``TaskInfo`` (its loss kind); ``aux_loss_weights``: the config's weights, over
    the model's defaults; ``seed``: the run's seed (the epoch hook's generator); ``weight_decay``,
    ``filter_bias_and_norm``: ``optim``'s, for :meth:`param_groups`; ``model_name``: for messages."""

    task: Any
    aux_loss_weights: dict[str, float] = field(default_factory=dict)
    label_smoothing: float = 0.0
    seed: int = 0
    weight_decay: float = 0.0
    filter_bias_and_norm: bool = True
    model_name: str = "the model"
    checked: bool = field(default=False, repr=False)     # the configured weights were matched to a model's losses

    @classmethod
    def from_config(cls, cfg) -> Objective:
        """The objective of a training config (``TrainConfig``, e.g. from ``load_config``)."""
        return cls(get_task(cfg.data.task), dict(cfg.aux_loss_weights), cfg.optim.label_smoothing, cfg.seed,
                   cfg.optim.weight_decay, cfg.optim.filter_bias_and_norm, cfg.model.name)

    def __call__(self, model: nn.Module, x: Batch, y: Tensor) -> Loss:
        """The objective of the batch ``(x, y)``: ``model`` (the modwire model itself, in training mode)
        is called on ``x`` and reports its auxiliary losses of that call."""
        return self.of_output(model, call_model(model, x), y)

    def of_output(self, model: nn.Module, out: Tensor, y: Tensor, micro_batches: int = 1) -> Loss:
        """The objective of outputs ``out`` that the last forward pass of ``model`` gave (e.g. through a
        compiled or DDP wrapper of it). ``micro_batches``: ``total`` is one micro-batch's share of a step
        accumulated over that many, ``task / n + Σ w·aux / n`` (``task``, ``aux`` are not divided)."""
        task = compute_loss(self.task, out, y, self.label_smoothing)
        aux = self.auxiliary_losses(model)
        total = task / micro_batches
        if aux:
            weights = self.weights(model)
            total = total + sum(weights[k] * v for k, v in aux.items()) / micro_batches
        return Loss(total, task, aux)

    def weights(self, model: nn.Module) -> dict[str, float]:
        """The weight of each auxiliary loss: ``aux_loss_weights`` over the model's paper defaults
        (``aux_loss_defaults``, e.g. AiT's σ = 1e-2 for ``balance``, AiT Eq. 6)."""
        defaults = model.aux_loss_defaults if isinstance(model, PretrainedModel) else {}
        return {**defaults, **self.aux_loss_weights}

    def auxiliary_losses(self, model: nn.Module) -> dict[str, Tensor]:
        """The auxiliary losses ``model`` reported for its last forward pass, each with a weight; the
        first call also refuses a configured weight for a loss the model does not report."""
        aux = model.auxiliary_losses() if isinstance(model, PretrainedModel) else {}
        missing = sorted(set(aux) - set(self.weights(model)))
        if missing:
            raise UserError(f"model {self.model_name!r} reports the auxiliary loss(es) {missing} but the training "
                            f"config gives no weight: set aux_loss_weights.{missing[0]} (e.g. --set "
                            f"aux_loss_weights.{missing[0]}=0.01; 0 logs it without training on it)")
        if not self.checked:
            unused = sorted(set(self.aux_loss_weights) - set(aux))
            if unused:
                raise UserError(f"config key 'aux_loss_weights.{unused[0]}': model {self.model_name!r} reports no "
                                f"auxiliary loss named {unused[0]!r} (it reports {sorted(aux) or 'none'})")
            self.checked = True
        return aux

    def start_epoch(self, model: nn.Module, epoch: int) -> None:
        """Call before training epoch ``epoch`` (from 0): an ``EpochAware`` model is told, with a
        generator seeded by ``(seed, epoch)`` (AiT's "reset memory", Table 2); others are untouched."""
        if isinstance(model, EpochAware):
            model.start_epoch(epoch, torch_generator(self.seed, epoch))

    def param_groups(self, model: nn.Module) -> list[dict]:
        """The optimizer's two parameter groups: ``weight_decay`` and none for what the model exempts
        (:func:`modwire.training.optim.param_groups`, which ``build_optimizer`` uses)."""
        return param_groups(model, self.weight_decay, filter_bias_and_norm=self.filter_bias_and_norm)
