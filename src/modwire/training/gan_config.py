"""The GAN training run's typed config (``modwire gan CONFIG``; :mod:`modwire.training.gan`).

Read like :func:`modwire.training.config.load_config`: YAML files (with ``base:``) onto these
dataclasses through OmegaConf, then ``--set`` overrides; every numeric and choice field is
checked, errors name the key. Defaults are InfoMax-GAN's CIFAR-10 settings as run by Mimicry
(Lee & Town 2020), which NFM §4.1 keeps unchanged: hinge loss, Adam (lr 2e-4, β = (0, 0.9)), 5
discriminator steps per generator step, batch 64, 100k generator steps, learning rates decayed
linearly to 0, InfoMax weights α = β = 0.2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..nn.gan_losses import GAN_LOSSES
from .config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, ConfigError, ModelSection, apply_override, \
    check_rules, config_layers
from ..errors import UserError

DECAYS = ("linear", "none")


@dataclass
class GANDataSection:
    task: str = "cifar10"                         # an image task (items: image [C, S, S] in [0, 1], label)
    params: dict[str, Any] = field(default_factory=dict)
    split: str = "train"
    batch_size: int = 64
    max_samples: int = 0                          # > 0: the first N images only


@dataclass
class GANOptimSection:
    lr_g: float = 2e-4
    lr_d: float = 2e-4
    betas: list[float] = field(default_factory=lambda: [0.0, 0.9])
    decay: str = "linear"                         # linear: both rates fall linearly to 0 at `steps` | none


@dataclass
class GANLossSection:
    kind: str = "hinge"                           # hinge (SNGAN, InfoMax-GAN) | ns (non-saturating)
    infomax_d: float = 0.2                        # α: weight of L_NCE(real) in D's loss (needs the InfoMax heads)
    infomax_g: float = 0.2                        # β: weight of L_NCE(G(z)) in G's loss


@dataclass
class GANEvalSection:
    every: int = 0                                # generator steps between scores (and at step 0); 0 = at the end only
    num_samples: int = 10000                      # generated images per score
    real_samples: int = 10000                     # real images for the reference statistics
    batch_size: int = 250
    classifier_fid: bool = True                   # the offline "classifier-FID" (training.gan_metrics)
    classifier_epochs: int = 2
    classifier_split: str = "test"                # its held-out accuracy is measured here ("" = skip)
    inception_weights: Optional[str] = None       # a local FID Inception weights file: Inception FID + IS
    random_attention: bool = False                # score with NFM §4.4's random attention (NFM generators)


@dataclass
class GANTrainConfig:
    model: ModelSection = field(default_factory=lambda: ModelSection(name="gan_resnet_cifar10"))
    data: GANDataSection = field(default_factory=GANDataSection)
    optim: GANOptimSection = field(default_factory=GANOptimSection)
    loss: GANLossSection = field(default_factory=GANLossSection)
    eval: GANEvalSection = field(default_factory=GANEvalSection)
    steps: int = 100000                           # generator steps
    n_dis: int = 5                                # discriminator steps per generator step
    seed: int = 0
    out_dir: str = "runs/gan"
    checkpoint_every: int = 1000                  # generator steps; 0 = at the end only
    sample_every: int = 0                         # generator steps between sample grids; 0 = once per data epoch
    grid_size: int = 8                            # grids of grid_size² images from fixed latents
    log_every: int = 50
    device: str = "auto"                          # auto | cpu | cuda


NUMERIC: dict[str, Any] = {
    "data.batch_size": AT_LEAST_ONE, "data.max_samples": NON_NEGATIVE, "optim.lr_g": POSITIVE,
    "optim.lr_d": POSITIVE, "optim.betas.*": UNIT, "loss.infomax_d": NON_NEGATIVE, "loss.infomax_g": NON_NEGATIVE,
    "eval.every": NON_NEGATIVE, "eval.num_samples": AT_LEAST_ONE, "eval.real_samples": AT_LEAST_ONE,
    "eval.batch_size": AT_LEAST_ONE, "eval.classifier_epochs": AT_LEAST_ONE, "steps": AT_LEAST_ONE,
    "n_dis": AT_LEAST_ONE, "seed": NON_NEGATIVE, "checkpoint_every": NON_NEGATIVE, "sample_every": NON_NEGATIVE,
    "grid_size": AT_LEAST_ONE, "log_every": AT_LEAST_ONE,
}
CHOICES = {"optim.decay": DECAYS, "loss.kind": GAN_LOSSES, "device": ("auto", "cpu", "cuda")}
#: Keys a resumed run may change (they change neither the model, the data nor the optimisation).
GAN_HARMLESS_KEYS = ("log_every", "checkpoint_every", "sample_every", "device", "eval.every", "eval.num_samples",
            "eval.batch_size", "eval.inception_weights", "eval.random_attention")


def validate(c: GANTrainConfig) -> None:
    check_rules(c, CHOICES, NUMERIC)
    if len(c.optim.betas) != 2:
        raise UserError(f"config key 'optim.betas': got {list(c.optim.betas)}, expected two numbers [beta1, beta2]")
    if (c.loss.infomax_d > 0 or c.loss.infomax_g > 0) and c.data.batch_size < 2:
        raise UserError(f"config key 'data.batch_size': got {c.data.batch_size}, expected at least 2 with InfoMax-GAN's "
                        f"InfoNCE on (loss.infomax_d / loss.infomax_g > 0: the other images are its negatives)")
    if c.eval.num_samples < 2 or c.eval.real_samples < 2:
        raise UserError("config keys 'eval.num_samples' / 'eval.real_samples': expected at least 2 images each "
                        "(a covariance needs two)")


def load_gan_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> GANTrainConfig:
    """A validated :class:`GANTrainConfig` from a YAML file (optional, ``base:`` allowed) and
    ``key=value`` / ``key:=value`` overrides (as :func:`modwire.training.config.load_config`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.structured(GANTrainConfig)
    for file, layer in (config_layers(path) if path is not None else []):
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"config file {file}: {exc}".splitlines()[0]) from None
    for item in overrides:
        try:
            cfg = apply_override(cfg, item, schema=GANTrainConfig)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"override {item!r}: {exc}".splitlines()[0]) from None
    try:
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid GAN training config: {exc}".splitlines()[0]) from None
    validate(config)
    return config


def to_yaml(c: GANTrainConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(c))
