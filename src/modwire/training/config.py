"""The training run's typed config. YAML files are mapped onto these dataclasses by
OmegaConf (structured configs): unknown keys and wrongly typed values are rejected
with the key's full path; ``--set a.b=value`` overrides use the same machinery."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ModelSection:
    name: str = "nac_small"                       # a preset from modwire.list_models()
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataSection:
    task: str = "triangle"                        # a task from modwire.tasks.list_tasks()
    params: dict[str, Any] = field(default_factory=dict)  # task build() parameters
    train_split: str = "train"
    val_split: str = "val"
    batch_size: int = 64                          # global batch (split across processes)
    num_workers: int = 0
    augment: bool = False                         # NAC App. C regimen, image tasks only
    mixup: bool = False                           # mixup/cutmix with label smoothing


@dataclass
class OptimSection:
    name: str = "adamw"                           # adamw | radam | sgd (momentum = betas[0])
    lr: float = 3e-4
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    grad_clip: float = 1.0                        # max global grad norm; 0 = off
    label_smoothing: float = 0.0


@dataclass
class GraphPriorSection:
    """Legacy form of NAC's graph prior (NAC §2.2, App. A Eq. 6-9): ``loss += weight · L_graph(P, P0)``.
    Mapped when a run starts (``modwire.training.legacy``) onto the current form, the NAC's
    ``model.overrides.graph_prior`` sub-config plus ``aux_loss_weights.graph = weight``.
    ``name: null`` switches it off."""
    name: Optional[str] = None                    # erdos_renyi | scale_free | planted_partition | ring_of_cliques
    weight: float = 1e-4                          # the paper does not state it; see configs/table1/
    params: dict[str, Any] = field(default_factory=dict)  # graphon parameters, e.g. {beta: 0.5}
    loss: str = "mse"                             # mse (Eq. 6) | kl
    reduction: str = "sum"                        # sum over i≠j (Eq. 6) | mean
    align: str = "none"                           # none (the paper's Eq. 6, 9) | degree (relabelling-invariant)


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    graph_prior: GraphPriorSection = field(default_factory=GraphPriorSection)  # legacy; see above
    # Weight of each auxiliary loss a model reports (``model.auxiliary_losses()``, e.g. NAC's
    # "graph"): the objective is task loss + Σ weight·loss. Every reported loss needs one.
    aux_loss_weights: dict[str, float] = field(default_factory=dict)
    epochs: int = 1
    max_steps: int = 0                            # > 0 stops early (optimizer steps)
    grad_accum: int = 1
    precision: str = "fp32"                       # fp32 | bf16 | fp16
    compile: bool = False
    ema_decay: float = 0.0                        # > 0 keeps an EMA of the weights
    seed: int = 0
    out_dir: str = "runs/default"
    checkpoint_every: int = 0                     # optimizer steps; 0 = at epoch ends only
    log_every: int = 10
    progress: bool = True
    device: str = "auto"                          # auto | cpu | cuda


PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "radam", "sgd")


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """YAML file (optional) + ``key=value`` overrides → a validated :class:`TrainConfig`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.structured(TrainConfig)
        if path is not None:
            cfg = OmegaConf.merge(cfg, OmegaConf.load(path))
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ValueError(f"overrides must look like key=value, got {bad}")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ValueError(f"invalid training config{f' {path}' if path else ''}: {e}") from None
    validate(config)
    return config


def validate(c: TrainConfig) -> None:
    checks = [("precision", c.precision, PRECISIONS), ("optim.name", c.optim.name, OPTIMIZERS),
              ("device", c.device, ("auto", "cpu", "cuda"))]
    for key, value, allowed in checks:
        if value not in allowed:
            raise ValueError(f"config key {key!r}: got {value!r}, expected one of {list(allowed)}")
    checks = [("graph_prior.loss", c.graph_prior.loss, ("mse", "kl")),
              ("graph_prior.reduction", c.graph_prior.reduction, ("sum", "mean")),
              ("graph_prior.align", c.graph_prior.align, ("degree", "none"))]
    for key, value, allowed in checks:
        if value not in allowed:
            raise ValueError(f"config key {key!r}: got {value!r}, expected one of {list(allowed)}")
    if c.graph_prior.weight < 0:
        raise ValueError(f"config key 'graph_prior.weight': got {c.graph_prior.weight}, expected >= 0")
    if c.optim.lr <= 0:
        raise ValueError(f"config key 'optim.lr': got {c.optim.lr}, expected > 0")
    for key in ("epochs", "grad_accum", "data.batch_size", "log_every"):
        value = c
        for part in key.split("."):
            value = getattr(value, part)
        if value < 1:
            raise ValueError(f"config key {key!r}: got {value}, expected >= 1")


def to_yaml(c: TrainConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(c))
