"""What ``modwire analyze`` can show, for which models: one table (:data:`ANALYSES`), each entry
naming the declared capability (:data:`modwire.models.capabilities.CAPABILITIES`) it needs.

* ``module_dropping`` (NAC App. F, Fig. 5, 8, 10, 15): models that describe their modules
  (:class:`~modwire.models.capabilities.ModuleSurgery`: NAC, Perceiver IO, Neural Interpreter).
* ``circuits`` (NAC §4.4, Fig. 6): a NAC with a conditional circuit generator.
* ``workspace`` (AiT Fig. 2, 7, 10, 11): models with global-workspace layers
  (:class:`~modwire.models.capabilities.HasWorkspace`, an AiT with at least one).
* ``nfm_read_map`` (NFM Fig. 1): models running blocks in NFM
  (:class:`~modwire.models.capabilities.HasNFM`).

Every model trained on a task also gets its metrics on the split (as ``modwire eval``).
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError

from ..models.capabilities import HasNFM, HasWorkspace, ModuleSurgery

__all__ = ["ANALYSES", "Analysis", "applicable", "describe", "is_conditional", "is_conditional_run", "not_applicable"]


def is_conditional(model: torch.nn.Module) -> bool:
    """A NAC whose circuit design depends on a conditioning input (NAC §4.4, App. G)."""
    from ..models.nac import NAC

    return isinstance(model, NAC) and model.config.generator.kind == "conditional"


def is_conditional_run(path: str | os.PathLike) -> bool:
    """Does the run's (best, else last) checkpoint hold a conditional NAC? (its ``config.json`` only)"""
    from ..training.checkpoint import resolve_checkpoint

    try:
        data = json.loads((resolve_checkpoint(Path(path)) / "config.json").read_text())
    except (OSError, ValueError, UserError):
        return False  # the analysis that loads it reports what is wrong with the directory
    return isinstance(data, dict) and data.get("model_type") == "nac" and \
        (data.get("generator") or {}).get("kind") == "conditional"


def _has_workspace(model: torch.nn.Module) -> bool:
    return isinstance(model, HasWorkspace) and len(model.workspaces) > 0


@dataclass(frozen=True)
class Analysis:
    """One analysis: ``name`` (its key in ``summary.json``), the ``capability`` it needs (a
    :data:`~modwire.models.capabilities.CAPABILITIES` name), the ``models`` that have it, what it
    ``shows``, and ``applies(model)``."""

    name: str
    capability: str
    models: str
    shows: str
    applies: Callable[[torch.nn.Module], bool]

    def line(self) -> str:
        return f"{self.name} ({self.models}): {self.shows}"


ANALYSES: tuple[Analysis, ...] = (
    Analysis("module_dropping", "module_dropping", "NAC, Perceiver IO, Neural Interpreter",
             "accuracy, throughput and GFLOPs as modules / latents are dropped, accuracy as edges are "
             "eliminated, the learned graph (NAC Fig. 5, 8, 10, 15; App. F)",
             lambda m: isinstance(m, ModuleSurgery) and not is_conditional(m)),
    Analysis("circuits", "module_dropping", "NAC with a conditional circuit generator",
             "t-SNE of the per-sample link probabilities, sample graphs, category separation (NAC Fig. 6)",
             is_conditional),
    Analysis("workspace", "workspace", "AiT with global-workspace layers",
             "slot attention maps (AiT Fig. 2), attention sparsity (Fig. 7), patch diversity over the run's "
             "checkpoints (Fig. 10), Hopfield energy before / after retrieval (Fig. 11), slot cosine similarity",
             _has_workspace),
    Analysis("nfm_read_map", "nfm", "models with NFM enabled: NFM-ResNet, NFM transformer LM, NFM CNN_MLP, "
             "NFM GAN generator", "which layers and passes each NFM module reads, top-down vs bottom-up "
             "(NFM Fig. 1)", lambda m: isinstance(m, HasNFM)),
)


def applicable(model: torch.nn.Module) -> list[Analysis]:
    """The analyses of :data:`ANALYSES` that apply to ``model``."""
    return [a for a in ANALYSES if a.applies(model)]


def not_applicable(model: torch.nn.Module) -> list[Analysis]:
    """The analyses of :data:`ANALYSES` that do not apply to ``model``."""
    return [a for a in ANALYSES if not a.applies(model)]


def describe(analyses: list[Analysis] | tuple[Analysis, ...] = ANALYSES, *, shows: bool = True) -> str:
    """One line: each analysis, the models that have it and (``shows``) what it shows."""
    return "; ".join(a.line() if shows else f"{a.name} ({a.models})" for a in analyses)
