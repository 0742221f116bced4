"""The GAN settings of a training config: ``TrainConfig.gan`` (:mod:`modwire.training.gan`).

A GAN run is an ordinary run of ``modwire train`` whose model is a GAN preset (``gan_*``,
``nfm_gan_*``); everything else (data, optimiser, schedule, steps, checkpoints, logging,
resume) is the common :class:`~modwire.training.config.TrainConfig`. What only a GAN has lives
here. The defaults are InfoMax-GAN's CIFAR-10 settings as run by Mimicry (Lee & Town 2020),
which NFM §4.1 keeps: 5 discriminator steps per generator step, hinge loss, InfoMax weights
α = β = 0.2 (Adam lr 2e-4, β = (0, 0.9) and the linear decay to 0 are ``optim.*`` in
``configs/gan/``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from ..errors import UserError
from ..fields import COUNT, NON_NEGATIVE, POSITIVE, Bounds
from ..nn.gan_losses import GAN_LOSSES



@dataclass
class GANLossSection:
    kind: str = "hinge"                           # hinge (SNGAN, InfoMax-GAN) | ns (non-saturating)
    infomax_d: float = 0.2                        # α: weight of L_NCE(real) in D's loss (needs the InfoMax heads)
    infomax_g: float = 0.2                        # β: weight of L_NCE(G(z)) in G's loss

    bounds: ClassVar[dict[str, Bounds]] = {"infomax_d": NON_NEGATIVE, "infomax_g": NON_NEGATIVE}
    choices: ClassVar[dict[str, tuple]] = {"kind": GAN_LOSSES}


@dataclass
class GANEvalSection:
    every: int = 0                                # generator steps between scores (and at step 0); 0 = at the end only
    num_samples: int = 10000                      # generated images per score
    real_samples: int = 10000                     # real images for the reference statistics
    batch_size: int = 250
    classifier_fid: bool = True                   # the offline "classifier-FID" (training.gan_metrics)
    classifier_epochs: int = 2
    classifier_accuracy: bool = True              # measure the FID classifier's accuracy on data.val_split
    inception_weights: Optional[str] = None       # a local FID Inception weights file: Inception FID + IS
    random_attention: bool = False                # score with NFM §4.4's random attention (NFM generators)

    bounds: ClassVar[dict[str, Bounds]] = {
        "every": NON_NEGATIVE, "batch_size": COUNT, "classifier_epochs": COUNT,
        "num_samples": Bounds(lo=2, note="a covariance needs two images"),
        "real_samples": Bounds(lo=2, note="a covariance needs two images")}


@dataclass
class GANSection:
    n_dis: int = 5                                # discriminator steps per generator step
    lr_d: Optional[float] = None                  # the discriminator's learning rate; null = optim.lr (the generator's)
    loss: GANLossSection = field(default_factory=GANLossSection)
    eval: GANEvalSection = field(default_factory=GANEvalSection)
    sample_every: int = 0                         # generator steps between sample grids; 0 = once per data epoch
    grid_size: int = 8                            # grids of grid_size² images from fixed latents

    bounds: ClassVar[dict[str, Bounds]] = {"n_dis": COUNT, "lr_d": POSITIVE, "sample_every": NON_NEGATIVE,
                                           "grid_size": COUNT}


#: GAN keys a resumed run may change (with ``--allow-change``): they change neither the model, the
#: data nor the optimisation.
GAN_HARMLESS_KEYS = ("gan.sample_every", "gan.eval.every", "gan.eval.num_samples", "gan.eval.batch_size",
                     "gan.eval.inception_weights", "gan.eval.random_attention")


#: The training keys a GAN run reads (dotted prefixes); any other set away from its default is refused
#: by name (:func:`modwire.training.kinds.check_kind_settings`): an option added to the trainer later is
#: refused for a GAN until its program reads it. Not read: ``epochs`` and ``grad_accum`` (a GAN's length is
#: ``max_steps`` generator steps), ``ema_decay``, ``precision``, ``compile``, ``nonfinite``, ``aux_loss_weights``
#: (its losses are weighted by ``gan.loss.*``), augmentation, mixup, few-shot, fine-tuning,
#: ``optim.label_smoothing``, ``data.num_workers`` and ``data.bad_samples`` (no loader).
GAN_READS = ("model", "gan", "seed", "out_dir", "device", "max_steps", "log_every", "loggers", "progress",
             "checkpoint_every",
             "keep_weights_every", "data.task", "data.params", "data.train_split", "data.val_split",
             "data.batch_size", "data.max_samples", "optim.name", "optim.lr", "optim.weight_decay", "optim.betas",
             "optim.warmup_steps", "optim.warmup_lr", "optim.min_lr", "optim.decay_steps", "optim.schedule",
             "optim.milestones", "optim.gamma", "optim.grad_clip", "optim.filter_bias_and_norm")


def check_gan_settings(c: Any) -> None:
    """The relations among a GAN run's settings. ``c``: a :class:`~modwire.training.config.TrainConfig`."""
    if c.max_steps <= 0:
        raise UserError(f"config key 'max_steps': got {c.max_steps}, expected the GAN's length in generator steps "
                        f"(an integer >= 1)")
    if (c.gan.loss.infomax_d > 0 or c.gan.loss.infomax_g > 0) and c.data.batch_size < 2:
        raise UserError(f"config key 'data.batch_size': got {c.data.batch_size}, expected at least 2 with "
                        f"InfoMax-GAN's InfoNCE on (gan.loss.infomax_d / gan.loss.infomax_g > 0: the other images "
                        f"are its negatives)")
