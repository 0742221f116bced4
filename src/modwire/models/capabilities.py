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
:class:`Records`      ``forward_record(x, **inputs)``          analyses of attention and records
:class:`ModuleSurgery` ``module_axis()``                       module dropping (NAC App. F)
:class:`Adversarial`  ``sample_latents(n)``, ``generate(z)``   the run-kind table, eval's FID
:class:`HasWorkspace` ``workspaces`` (a property)              ``modwire analyze`` (AiT Fig. 2, 7, 10, 11)
:class:`HasNFM`       config option ``nfm``, :func:`nfm_modules` ``modwire analyze`` (NFM read map, Fig. 1)
==================== ======================================== ===================================

``isinstance(model, HasNFM)``: the model runs blocks in NFM now (``nfm.enabled``);
``issubclass(cls, HasNFM)``: its config has the ``nfm`` option (what ``modwire list models`` shows).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from ..nn.nfm import NFM
from .axis import ModuleAxis
from .base import Record
from .nfm import NFMConfig


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
class Records(Protocol):
    """Logits plus what the forward recorded (attention weights, workspace records, ...): the model's
    ``record_type``, a :class:`~modwire.models.base.Record` of its family. ``inputs`` are the model's
    other declared inputs (its config's ``input_names()`` after ``x``) and nothing else."""

    def forward_record(self, x: torch.Tensor, **inputs: torch.Tensor) -> Record: ...


@runtime_checkable
class ModuleSurgery(Protocol):
    """Describes its per-module axis, so analyses can drop modules (NAC App. F)."""

    def module_axis(self) -> ModuleAxis: ...


@runtime_checkable
class Adversarial(Protocol):
    """A generator and a discriminator trained against each other (NFM §4.1, Table 4): ``modwire train``
    runs its GAN program (``modwire.training.gan``), ``modwire eval`` scores its samples (FID)."""

    def sample_latents(self, n: int, *, generator: torch.Generator | None = None) -> torch.Tensor: ...

    def generate(self, z: torch.Tensor, *, record: bool = False) -> torch.Tensor: ...


@runtime_checkable
class HasWorkspace(Protocol):
    """Global-workspace layers (AiT §4: memory slots written through a bottleneck, read back by
    Hopfield retrieval), one per layer that has one in ``workspaces`` (none in the "without
    memory" ablation); the workspace analyses of ``modwire analyze`` (AiT Figures 2, 7, 10, 11)."""

    @property
    def workspaces(self) -> Sequence[torch.nn.Module]: ...

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        # issubclass() refuses a protocol with a property: a class declares it by defining one
        return any(isinstance(vars(k).get("workspaces"), property) for k in other.__mro__) or NotImplemented


def nfm_modules(model: torch.nn.Module) -> list[NFM]:
    """The :class:`~modwire.nn.nfm.NFM` bodies (NFM Algorithm 1) a model runs its blocks in: empty
    for a model without NFM (no ``nfm`` option, or ``nfm.enabled`` false)."""
    return [m for m in model.modules() if isinstance(m, NFM)]


def _has_nfm_option(cls: type) -> bool:
    """Does the model class's config have the shared ``nfm`` sub-config (:mod:`modwire.models.nfm`)?"""
    config = next((vars(k)["config_class"] for k in cls.__mro__ if "config_class" in vars(k)), None)
    return dataclasses.is_dataclass(config) and any(
        f.name == "nfm" and f.default_factory is NFMConfig for f in dataclasses.fields(config))


class _NFMCheck(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module) and bool(nfm_modules(obj))

    def __subclasscheck__(cls, other: type) -> bool:
        return isinstance(other, type) and _has_nfm_option(other)


class HasNFM(metaclass=_NFMCheck):
    """Neural Function Modules over the model's blocks (NFM §3, Algorithm 1). An instance runs its
    blocks in NFM now (:func:`nfm_modules` non-empty: the read map of NFM Fig. 1 applies); a
    subclass is a model class whose config has the ``nfm`` option (``nfm.enabled``: NFM-ResNet,
    the transformer LM, CNN_MLP, the GAN generator)."""


CAPABILITIES: dict[str, type] = {"adversarial": Adversarial, "finetune": FineTunable, "add_functions": GrowsFunctions,
                                 "eval_options": EvalOptions, "epoch_hook": EpochAware,
                                 "records": Records, "module_dropping": ModuleSurgery,
                                 "workspace": HasWorkspace, "nfm": HasNFM}


def capabilities(model: Any) -> list[str]:
    """Names of the :data:`CAPABILITIES` a model (an instance or a class) has."""
    cls = model if isinstance(model, type) else type(model)
    return [name for name, proto in CAPABILITIES.items() if issubclass(cls, proto)]
