"""Older config forms, mapped onto the current ones when a run starts.

The top-level ``graph_prior:`` section (``configs/table1/*``, ``configs/cpu/*_prior.yaml``)
predates auxiliary losses. It now means: the NAC's ``graph_prior`` sub-config
(``model.overrides.graph_prior``: name, params, loss, reduction, align; the model reports
``L_graph`` as its auxiliary loss ``"graph"``, NAC App. A Eq. 6-9) and
``aux_loss_weights.graph = graph_prior.weight``. Both forms train identically (tested).
"""
from __future__ import annotations

import copy
import dataclasses

from .config import GraphPriorSection, TrainConfig

PRIOR_FIELDS = ("name", "params", "loss", "reduction", "align")


def map_legacy_graph_prior(cfg: TrainConfig) -> TrainConfig:
    """A copy of ``cfg`` in the current form (``cfg`` itself when there is nothing to map)."""
    gp = cfg.graph_prior
    if gp.name is None:
        return cfg
    from ..models import get_config

    if "graph_prior" not in get_config(cfg.model.name).field_names():
        raise ValueError(f"config key 'graph_prior.name': {gp.name!r} needs a model with link probabilities "
                         f"(a NAC with kernel.enabled=True); model {cfg.model.name!r} has none")
    overrides = dict(copy.deepcopy(_plain(cfg.model.overrides)))
    if "graph_prior" in overrides or "graph" in cfg.aux_loss_weights:
        raise ValueError("config key 'graph_prior': set the graph prior either in the legacy top-level "
                         "'graph_prior' section or as model.overrides.graph_prior with aux_loss_weights.graph, "
                         "not both")
    if gp.weight != 0:  # weight 0 meant "off" in the legacy form
        overrides["graph_prior"] = {k: copy.deepcopy(_plain(getattr(gp, k))) for k in PRIOR_FIELDS}
    weights = {**cfg.aux_loss_weights, **({"graph": float(gp.weight)} if gp.weight != 0 else {})}
    model = dataclasses.replace(cfg.model, overrides=overrides)
    return dataclasses.replace(cfg, model=model, aux_loss_weights=weights, graph_prior=GraphPriorSection())


def _plain(value):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
