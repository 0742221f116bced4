"""The optional capabilities of a model, declared in one place.

Every model is a :class:`~modwire.models.base.PretrainedModel` (save / load, auxiliary losses,
``no_weight_decay``, ``eval_options``). What only some models can do is a
:class:`typing.Protocol` here; the trainer, ``modwire finetune``, ``modwire analyze`` and
``modwire list models`` ask ``isinstance(model, Protocol)`` (or :func:`capabilities` for a
class), never ``hasattr``. A model gains a capability by defining the protocol's methods.

==================== ======================================== ===================================
protocol             methods                                  used by
==================== ======================================== ===================================
:class:`FineTunable`  ``parameter_sets()``, ``new_task(n, heads)`` ``modwire finetune`` (NI Table 1,
                                                               Fig. 5; NAC Fig. 4)
:class:`GrowsFunctions` ``add_functions(n)``                   ``finetune.add_functions`` (NI Fig. 5b)
:class:`EvalOptions`  ``set_eval_options(**options)``          ``modwire eval / analyze --set
                                                               model.overrides.<option>=…``
:class:`EpochAware`   ``start_epoch(epoch, generator)``        the trainer (AiT "Reset memory")
:class:`Intermediating` ``forward_intermediates(x, ...)``      analyses of attention and records
:class:`ModuleSurgery` ``module_axis()``                       module dropping (NAC App. F)
==================== ======================================== ===================================
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from .axis import ModuleAxis
from .base import Intermediates


@runtime_checkable
class FineTunable(Protocol):
    """Named parameter subsets (prefixes; always ``"all"``) and fresh task outputs."""

    def parameter_sets(self) -> dict[str, tuple[str, ...]]: ...

    def new_task(self, num_classes: int, heads: int = 1) -> None: ...


@runtime_checkable
class GrowsFunctions(Protocol):
    """New functions appended to a trained Neural Interpreter (NI §4.2, Fig. 5b)."""

    def add_functions(self, n: int) -> None: ...


@runtime_checkable
class EvalOptions(Protocol):
    """Options of evaluation that a trained model takes (names in ``eval_options``)."""

    def set_eval_options(self, **options: Any) -> None: ...


@runtime_checkable
class EpochAware(Protocol):
    """Told by the trainer when a training epoch starts (not on a mid-epoch resume)."""

    def start_epoch(self, epoch: int, generator: torch.Generator) -> None: ...


@runtime_checkable
class Intermediating(Protocol):
    """Logits plus what the forward recorded (attention weights, workspace records, ...)."""

    def forward_intermediates(self, x: Any, *args: Any, **kwargs: Any) -> Intermediates: ...


@runtime_checkable
class ModuleSurgery(Protocol):
    """Describes its per-module axis, so analyses can drop modules (NAC App. F)."""

    def module_axis(self) -> ModuleAxis: ...


CAPABILITIES: dict[str, type] = {"finetune": FineTunable, "add_functions": GrowsFunctions,
                                 "eval_options": EvalOptions, "epoch_hook": EpochAware,
                                 "intermediates": Intermediating, "module_dropping": ModuleSurgery}


def capabilities(model: Any) -> list[str]:
    """Names of the :data:`CAPABILITIES` a model (an instance or a class) has."""
    cls = model if isinstance(model, type) else type(model)
    return [name for name, proto in CAPABILITIES.items() if issubclass(cls, proto)]
