"""The per-module axis: how a model tells ``modwire.analysis`` which of its tensors are
indexed by modules, so that inference-time surgery (dropping modules, NAC §3 "Effect of
Dropping Modules" and Fig. 5; eliminating edges, App. F) needs no knowledge of the
model's class.

A model implements ``module_axis() -> ModuleAxis`` (NAC: its processor modules;
Perceiver IO: its latents). Dropping module ``i`` means index-selecting row ``i`` out of
every tensor in ``tensors`` (dim 0) and setting ``config.<config_field>`` to the new
count; every other weight is shared by all modules.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModuleAxis"]


@dataclass(frozen=True)
class ModuleAxis:
    """Description of a model's per-module axis.

    Attributes:
        noun: what one index is, for messages and plots (``"modules"``, ``"latents"``).
        size: ``U``, the number of modules.
        config_field: the config field that holds ``U`` (``"num_processor_modules"``).
        tensors: parameter names of the per-module tensors, modules along dim 0
            (e.g. ``generator.processors.codes [U, d_code]``).
        link_probs: True if ``model.link_probs()`` gives ``P`` ``[U, U]`` over this axis,
            shared by every sample (NAC Eq. 2): the importance ``q_i`` (App. F Eq. 10) and
            edge elimination apply.
        fixed: None if modules can be removed after training, else why not (e.g. a
            conditional NAC designs its modules per sample).
    """

    noun: str
    size: int
    config_field: str
    tensors: tuple[str, ...]
    link_probs: bool = False
    fixed: str | None = None
