"""GAN training (NFM §4.1, Table 4): the trainer's adversarial :class:`~modwire.training.run.Program`.

``modwire train CONFIG`` with a GAN preset (``model.name: gan_*`` / ``nfm_gan_*``, a model with the
:class:`~modwire.models.capabilities.Adversarial` capability) runs this program inside the one
trainer (:mod:`modwire.training.trainer`): same run directory, lock, ``config.yaml`` record,
resume (``modwire train --resume RUN_DIR``), signals, checkpoints, ``metrics.jsonl``, header and
progress as any run. What is a GAN's own is here.

One step is one generator step, as in Mimicry (Lee & Town 2020), whose InfoMax-GAN settings NFM
keeps: ``gan.n_dis`` discriminator steps, each on the next real batch and fresh latents, then one
generator step on fresh latents; ``optim.schedule: linear`` decays both learning rates to
``min_lr`` (0) at ``max_steps``. Losses: :mod:`modwire.nn.gan_losses` (hinge; InfoMax-GAN's
``α·L_NCE(real)`` for D, ``β·L_NCE(G(z))`` for G, the latter reported by the model as
``auxiliary_losses()["infomax"]``). The evaluation is the scores (classifier-FID, and Inception
FID / IS with ``gan.eval.inception_weights``) at step 0 and every ``gan.eval.every`` steps and at
the end; ``best`` is the lowest classifier-FID. The run directory also holds
``samples/step-<n>.png`` (grids from fixed latents, once per data epoch or every
``gan.sample_every`` steps, and at the end) and ``fid_classifier/``
(:mod:`modwire.training.gan_metrics`).

Exact resume: real batches follow a permutation of the split drawn from ``(seed, epoch)``
(``state.micro`` counts the real batches of the current epoch) and every latent batch is drawn
from ``(seed, purpose, step, i)`` (:mod:`modwire.seeding`), so a run stopped after any checkpoint
and resumed ends with the same weights as one never interrupted (tested).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from ..errors import UserError
from ..models import create_model, get_config
from ..models.capabilities import Adversarial
from ..models.gan import GAN
from ..models.inputs import named_inputs
from ..nn.gan_losses import discriminator_loss, generator_loss, infonce_loss
from ..seeding import torch_generator
from ..tasks import build_dataset, describe_task
from . import distributed
from .config import TrainConfig
from .gan_config import GAN_HARMLESS_KEYS, GAN_READS, check_gan_settings
from .kinds import RunKind, register_kind
from .optim import build_optimizer, build_scheduler
from .run import TrainingRun
from .signals import StopSignals
from .state import TrainState, load_optimizer

# Purposes of the seeded streams (the second part of every derived seed).
D_LATENTS, G_LATENTS, GRID_LATENTS, EVAL_LATENTS, REAL_ORDER, DATA_ORDER = 1, 2, 3, 4, 5, 6


def gan_model_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The user's ``model.overrides``, validated against the preset's config, and the task's images
    checked against the images the generator makes: before the run directory is touched."""
    overrides = dict(cfg.model.overrides)
    c = get_config(cfg.model.name, **overrides)
    spec = named_inputs(describe_task(cfg.data.task, cfg.data.params).inputs).get("x")
    made = [c.image_channels, c.image_size, c.image_size]
    if spec is None or spec.kind != "image" or [spec.channels, spec.height, spec.width] != made:
        got = [spec.channels, spec.height, spec.width] if spec is not None and spec.kind == "image" else \
            f"not images ({spec.kind if spec else 'no input x'})"
        raise UserError(f"data: the task's images are {got}, but the model makes {made} (set "
                        f"model.overrides.image_channels / image_size, or the task's params)")
    return overrides


# ----------------------------------------------------------------------------- state and data

@dataclass
class GANState(TrainState):
    """:class:`TrainState` with the discriminator's optimizer and schedule (``optimizer`` and
    ``scheduler`` are the generator's; ``micro`` counts the real batches of the current epoch)."""

    optimizer_d: torch.optim.Optimizer | None = None
    scheduler_d: Any = None

    def extra_state(self) -> dict[str, Any]:
        return {"optimizer_d": self.optimizer_d.state_dict(), "scheduler_d": self.scheduler_d.state_dict()}

    def load_extra_state(self, full: dict[str, Any], ckpt: Path) -> None:
        load_optimizer(self.optimizer_d, full["optimizer_d"], ckpt, "discriminator's optimizer")
        self.scheduler_d.load_state_dict(full["scheduler_d"])


class RealImages:
    """The training images, batch after batch in a permutation drawn from ``(seed, epoch)``; items
    ``(image [C, S, S] in [0, 1], label)`` are mapped to [-1, 1] (the generator's tanh range)."""

    def __init__(self, dataset, batch: int, seed: int, shape: tuple[int, int, int]) -> None:
        if len(dataset) < batch:
            raise UserError(f"data: the split holds {len(dataset)} images, fewer than data.batch_size={batch}")
        got = tuple(torch.as_tensor(dataset[0][0]).shape)
        if got != shape:
            raise UserError(f"data: the task's images are {list(got)}, but the model makes {list(shape)} "
                            f"(set model.overrides.image_channels / image_size, or the task's params)")
        self.dataset, self.batch, self.seed, self.shape = dataset, batch, seed, shape
        self.per_epoch = len(dataset) // batch                   # the last partial batch is dropped
        self._order: tuple[int, Tensor | None] = (-1, None)

    def images(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        items = [self.dataset[int(i)] for i in indices]
        x = torch.stack([torch.as_tensor(item[0], dtype=torch.float32) for item in items])
        return x * 2 - 1, torch.as_tensor([int(item[1]) for item in items])

    def next(self, state: GANState) -> tuple[Tensor, bool]:
        """The next batch ``[B, C, S, S]`` and whether it ended an epoch (advances ``state``)."""
        if self._order[0] != state.epoch:                       # one permutation per epoch, drawn once
            self._order = (state.epoch, torch.randperm(len(self.dataset),
                                                       generator=torch_generator(self.seed, DATA_ORDER, state.epoch)))
        x, _ = self.images(self._order[1][state.micro * self.batch:(state.micro + 1) * self.batch])
        state.micro += 1
        ended = state.micro == self.per_epoch
        if ended:
            state.epoch, state.micro = state.epoch + 1, 0
        return x, ended

    def epoch_batches(self, epoch: int, limit: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        order = torch.randperm(len(self.dataset), generator=torch_generator(self.seed, REAL_ORDER, epoch))
        order = order[:limit] if limit else order
        for i in range(0, len(order), self.batch):
            yield self.images(order[i:i + self.batch])



def latents(model: GAN, n: int, *parts: int) -> Tensor:
    return model.sample_latents(n, generator=torch_generator(*parts))


# ----------------------------------------------------------------------------- one iteration

def _clip(params, cfg: TrainConfig) -> None:
    if cfg.optim.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(list(params), cfg.optim.grad_clip)


def discriminator_step(state: GANState, real: Tensor, z: Tensor, cfg: TrainConfig) -> dict[str, Tensor]:
    """One D update: ``L_D = hinge(D(x), D(G(z))) + α·L_NCE(x)`` (one D forward on ``[x; G(z)]``).
    Returns detached scalars (read on the host only when logged: no device sync per step)."""
    g, d, loss_cfg = state.model.generator, state.model.discriminator, cfg.gan.loss
    with torch.no_grad():
        fake = g(z)
    logits, local, pooled = d.features(torch.cat([real, fake]))
    b = len(real)
    loss = discriminator_loss(loss_cfg.kind, logits[:b], logits[b:])
    out = {"loss_d": loss.detach(), "d_real": logits[:b].detach().mean(), "d_fake": logits[b:].detach().mean()}
    if d.infomax is not None and loss_cfg.infomax_d > 0:
        nce = infonce_loss(*d.infomax(local[:b], pooled[:b]))
        loss = loss + loss_cfg.infomax_d * nce
        out["infomax_d"] = nce.detach()
    state.optimizer_d.zero_grad(set_to_none=True)
    loss.backward()
    _clip(d.parameters(), cfg)
    state.optimizer_d.step()
    return out


def generator_step(state: GANState, z: Tensor, cfg: TrainConfig) -> dict[str, Tensor]:
    """One G update: ``L_G = hinge_G(D(G(z))) + β·L_NCE(G(z))`` (the model's forward and auxiliary loss).
    D's weights are frozen meanwhile: the gradient flows through D to G, D's own is not computed."""
    d, loss_cfg = state.model.discriminator, cfg.gan.loss
    d.requires_grad_(False)
    try:
        logits = state.model(z)
        loss = generator_loss(loss_cfg.kind, logits)
        out = {"loss_g": loss.detach()}
        aux = state.model.auxiliary_losses()
        if "infomax" in aux and loss_cfg.infomax_g > 0:
            loss = loss + loss_cfg.infomax_g * aux["infomax"]
            out["infomax_g"] = aux["infomax"].detach()
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
    finally:
        d.requires_grad_(True)
    _clip(state.model.generator.parameters(), cfg)
    state.optimizer.step()
    return out


def iteration(state: GANState, real: "RealImages", cfg: TrainConfig) -> tuple[dict[str, Tensor], bool]:
    """``n_dis`` D steps then one G step; the schedules step once. Returns metrics and whether a data
    epoch ended."""
    model, b, ended = state.model, cfg.data.batch_size, False
    device = next(model.parameters()).device
    for i in range(cfg.gan.n_dis):
        x, end = real.next(state)
        ended |= end
        metrics = discriminator_step(state, x.to(device), latents(model, b, cfg.seed, D_LATENTS, state.step, i), cfg)
    metrics.update(generator_step(state, latents(model, b, cfg.seed, G_LATENTS, state.step), cfg))
    state.scheduler.step()
    state.scheduler_d.step()
    state.step += 1
    return metrics, ended


# ----------------------------------------------------------------------------- the program

@dataclass
class GANProgram:
    """The adversarial :class:`~modwire.training.run.Program`: :func:`iteration` per step, sample
    grids, scores as the evaluation (``best``: the lowest classifier-FID)."""

    real: "RealImages"
    best_metric: tuple[str | None, bool] = ("classifier_fid", True)

    def step(self, run: TrainingRun, state: GANState) -> dict[str, Tensor]:
        cfg, g = run.cfg, run.cfg.gan
        metrics, epoch_ended = iteration(state, self.real, cfg)
        run.seen += g.n_dis * cfg.data.batch_size
        step = state.step
        if (g.sample_every and step % g.sample_every == 0) or (not g.sample_every and epoch_ended) \
                or step == run.total:
            save_grid(state.model, cfg, run.dir, step)
        state.val_pending = bool(g.eval.every and step % g.eval.every == 0) or step >= run.total
        return metrics

    def evaluate(self, run: TrainingRun, state: GANState, stop: StopSignals) -> dict[str, float]:
        return score(state.model, run.cfg, self.real, run.dir, run.device)

    def log_fields(self) -> dict[str, Any]:
        return {}

    def summary(self, run: TrainingRun, state: GANState) -> dict[str, str]:
        cfg = run.cfg
        return {"data": f"{len(self.real.dataset)} {cfg.data.train_split} images ({self.real.per_epoch} batches "
                        f"of {cfg.data.batch_size} per epoch)",
                "steps": f"{run.total} generator steps, {cfg.gan.n_dis} discriminator steps each "
                         f"(batch {cfg.data.batch_size})"}


def real_images(cfg: TrainConfig, model: GAN) -> "RealImages":
    c = model.config
    dataset = build_dataset(cfg.data.task, cfg.data.train_split, max_samples=cfg.data.max_samples, **cfg.data.params)
    return RealImages(dataset, cfg.data.batch_size, cfg.seed, (c.image_channels, c.image_size, c.image_size))


def build_gan_run(cfg: TrainConfig, dist_info: distributed.DistInfo, run_dir: Path,
                  overrides: dict[str, Any] | None = None) -> tuple[TrainingRun, GANState]:
    """The preset with the user's overrides, its real images, an optimizer and schedule for each
    network (``optim``; the discriminator's learning rate ``gan.lr_d``, default ``optim.lr``)."""
    if dist_info.world > 1:
        raise UserError(f"GAN training runs in one process; this one was launched with {dist_info.world} "
                        f"(torchrun): start it with `modwire train` alone")
    torch.manual_seed(cfg.seed)
    model = create_model(cfg.model.name, **(overrides if overrides is not None else gan_model_overrides(cfg)))
    model.to(dist_info.device).train()
    real = real_images(cfg, model)
    optim_d = dataclasses.replace(cfg.optim, lr=cfg.gan.lr_d or cfg.optim.lr,
                                  min_lr=cfg.optim.min_lr * (cfg.gan.lr_d or cfg.optim.lr) / cfg.optim.lr)
    opt_g, opt_d = build_optimizer(model.generator, cfg.optim), build_optimizer(model.discriminator, optim_d)
    total = cfg.max_steps
    state = GANState(model, opt_g, build_scheduler(opt_g, total, cfg.optim),
                     torch.amp.GradScaler(dist_info.device.type, enabled=False), None,
                     optimizer_d=opt_d, scheduler_d=build_scheduler(opt_d, total, optim_d))
    state.val_pending = cfg.gan.eval.every > 0            # the untrained generator: where the curve starts
    return TrainingRun(cfg, dist_info, run_dir, GANProgram(real), total), state


# ----------------------------------------------------------------------------- samples and scores

@torch.no_grad()
def generate(model: GAN, n: int, batch: int, *parts: int) -> Iterator[Tensor]:
    """``n`` images in batches, the generator in eval mode, latents from ``(*parts, k)`` for batch ``k``."""
    was = model.generator.training
    model.generator.eval()
    try:
        for k, start in enumerate(range(0, n, batch)):
            yield model.generator(latents(model, min(batch, n - start), *parts, k)).float().cpu()
    finally:
        model.generator.train(was)


def image_grid(images: Tensor, rows: int) -> Tensor:
    """``[N, C, S, S]`` in [-1, 1] → a uint8 grid ``[rows·(S+2)+2, cols·(S+2)+2, C]`` (2-pixel borders)."""
    n, c, s, _ = images.shape
    cols = math.ceil(n / rows)
    grid = torch.zeros(rows * (s + 2) + 2, cols * (s + 2) + 2, c, dtype=torch.uint8)
    pixels = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)   # [N, S, S, C]
    for i in range(n):                                            # a loop over tiles (≤ a few hundred)
        r, q = divmod(i, cols)
        grid[2 + r * (s + 2): 2 + r * (s + 2) + s, 2 + q * (s + 2): 2 + q * (s + 2) + s] = pixels[i]
    return grid


def save_grid(model: GAN, cfg: TrainConfig, run: Path, step: int) -> Path:
    """``samples/step-<step>.png`` from the run's fixed grid latents (Pillow, extra ``images``)."""
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError(f"sample grids are written with Pillow (pip install 'modwire[images]'): {e}") from None
    n = cfg.gan.grid_size ** 2
    images = torch.cat(list(generate(model, n, n, cfg.seed, GRID_LATENTS)))
    grid = image_grid(images, cfg.gan.grid_size).numpy()
    path = run / "samples" / f"step-{step:08d}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(path)
    return path


def classifier_fid(cfg: TrainConfig, real: RealImages, run: Path, device: torch.device):
    """The run's :class:`~modwire.training.gan_metrics.ClassifierFID`: loaded from ``fid_classifier/``,
    or trained (``gan.eval.classifier_epochs`` on the training split) with real statistics of
    ``gan.eval.real_samples`` training images, then saved. Returns ``(scorer, accuracy on
    data.val_split or None)``."""
    from .gan_metrics import CLASSIFIER_DIR, ClassifierFID, classifier_accuracy, feature_stats, features_of, \
        train_feature_classifier

    ev = cfg.gan.eval
    info = describe_task(cfg.data.task, cfg.data.params)
    channels, classes, where = real.shape[0], info.num_classes, run / CLASSIFIER_DIR
    if (where / "model.safetensors").is_file():
        return ClassifierFID.load(where, channels, classes, device), None
    net = train_feature_classifier(real.epoch_batches, channels, classes, epochs=ev.classifier_epochs,
                                   device=device, seed=cfg.seed)
    reals = (x for x, _ in real.epoch_batches(-1, ev.real_samples))
    scorer = ClassifierFID(net, *feature_stats(features_of(net, reals, device)), device)
    scorer.save(where)
    accuracy = None
    if ev.classifier_accuracy:
        held = build_dataset(cfg.data.task, cfg.data.val_split, **cfg.data.params)
        accuracy = classifier_accuracy(net, RealImages(held, ev.batch_size, cfg.seed, real.shape).epoch_batches(0),
                                       device)
    return scorer, accuracy


def score(model: GAN, cfg: TrainConfig, real: RealImages, run: Path, device: torch.device) -> dict[str, float]:
    """classifier-FID (and Inception FID / IS with ``gan.eval.inception_weights``) of
    ``gan.eval.num_samples`` generated images (the same latents at every evaluation)."""
    ev, out = cfg.gan.eval, {}
    model.set_eval_options(random_attention=ev.random_attention)   # generation runs in eval mode
    fakes = lambda: generate(model, ev.num_samples, ev.batch_size, cfg.seed, EVAL_LATENTS)  # noqa: E731
    if ev.classifier_fid:
        scorer, accuracy = classifier_fid(cfg, real, run, device)
        out["classifier_fid"] = scorer.score(fakes())
        if accuracy is not None:
            out["fid_classifier_accuracy"] = accuracy
    if ev.inception_weights:
        from .gan_metrics import inception_metrics

        reals = (x for x, _ in real.epoch_batches(-1, ev.real_samples))
        out.update(inception_metrics(ev.inception_weights, reals, fakes(), device))
    model.set_eval_options(random_attention=False)
    return out


# ----------------------------------------------------------------------------- a trained run

def score_run(run_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Score a GAN run's ``checkpoints/last`` again (``modwire eval RUN_DIR``), with the run's own
    config and ``gan.eval.*`` / ``device`` overrides only, e.g. ``gan.eval.random_attention=true``
    (NFM §4.4) or more samples. Nothing in the run directory changes, except ``fid_classifier/`` if
    it was missing."""
    from .checkpoint import load_state, load_weights
    from .resume import run_config

    run = Path(run_dir)
    last = run / "checkpoints" / "last"
    if not (run / "config.yaml").is_file() or not last.exists():
        raise FileNotFoundError(f"{run}: expected a GAN run directory with config.yaml and checkpoints/last")
    bad = [o for o in overrides if not o.split("=", 1)[0].removesuffix(":").strip().startswith(("gan.eval.", "device"))]
    if bad:
        raise UserError(f"only gan.eval.* and device overrides apply to a trained GAN run, got {bad[0]!r}")
    cfg = run_config(run, overrides)
    device = distributed.setup(cfg.device).device
    model = create_model(cfg.model.name, **gan_model_overrides(cfg)).to(device)
    load_weights(model, last / "model.safetensors")
    step = load_state(last)["step"]                            # verifies the checksums
    model.eval()
    return {"run": str(run), "step": step, "random_attention": cfg.gan.eval.random_attention,
            **score(model, cfg, real_images(cfg, model), run, device)}


# ----------------------------------------------------------------------------- its row of the run-kind table

ADVERSARIAL = register_kind(RunKind(
    "adversarial", Adversarial, label="GAN",
    model_overrides=gan_model_overrides, build_run=build_gan_run,
    reads=GAN_READS, reads_note="a GAN's length is max_steps generator steps; its losses are weighted by gan.loss.*",
    section="gan", check=check_gan_settings, harmless_keys=GAN_HARMLESS_KEYS,
    score=score_run, scores="its samples (classifier-FID; --set gan.eval.* for more samples or NFM §4.4's random "
                            "attention)",
    task_outputs=False,
    instead="What applies to a GAN run: modwire eval RUN (its scores: classifier-FID; --set gan.eval.* for more "
            "samples or NFM §4.4's random attention), modwire train --resume RUN (more steps, with --set "
            "max_steps=N --allow-change max_steps), modwire analyze RUN (an NFM generator's read map over "
            "sampled latents)."))
