"""GAN training (NFM §4.1, Table 4): ``modwire gan CONFIG [--set k=v ...] [--resume] [--overwrite]``.

One iteration is one generator step, as in Mimicry (Lee & Town 2020), whose InfoMax-GAN settings
NFM keeps: ``n_dis`` discriminator steps, each on the next real batch and fresh latents, then one
generator step on fresh latents; both learning rates decay linearly to 0 at ``steps``. Losses:
:mod:`modwire.nn.gan_losses` (hinge; InfoMax-GAN's ``α·L_NCE(real)`` for D, ``β·L_NCE(G(z))`` for G,
the latter reported by the model as ``auxiliary_losses()["infomax"]``).

A run directory holds ``config.yaml`` (written once; a resume must agree with it except for the
:data:`~modwire.training.gan_config.GAN_HARMLESS_KEYS` keys), ``metrics.jsonl``, ``samples/step-<n>.png``
(grids from fixed latents, the generator in eval mode: once per data epoch or every
``sample_every`` steps, and at the end), ``checkpoints/last`` (atomic and checksummed,
:mod:`modwire.training.checkpoint`: generator + discriminator as one ``model.safetensors``, both
optimisers and schedules, counters, RNG states) and ``fid_classifier/`` (classifier-FID's network
and real statistics, :mod:`modwire.training.gan_metrics`).

Exact resume: real batches follow a permutation of the split drawn from ``(seed, epoch)`` and
every latent batch is drawn from ``(seed, purpose, step, i)`` (:mod:`modwire.seeding`), so a run
stopped after any checkpoint and resumed (``--resume``) ends with the same weights as one never
interrupted (tested). The run directory is locked while a run writes it; SIGINT / SIGTERM finish
the current step, write ``last`` and exit with 130 / 143.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from ..models import create_model
from ..models.gan import GAN
from ..nn.gan_losses import discriminator_loss, generator_loss, infonce_loss
from ..seeding import torch_generator
from ..tasks import build_dataset
from .checkpoint import load_state, load_weights
from .feedback import MetricsLog
from .gan_config import GAN_HARMLESS_KEYS, GANTrainConfig, load_gan_config, to_yaml
from .lock import RunLock
from .signals import StopSignals
from .state import rng_state, set_rng_state
from ..errors import UserError

# Purposes of the seeded streams (the second part of every derived seed).
D_LATENTS, G_LATENTS, GRID_LATENTS, EVAL_LATENTS, REAL_ORDER, DATA_ORDER = 1, 2, 3, 4, 5, 6


# ----------------------------------------------------------------------------- state and data

@dataclass
class GANState:
    """What a GAN run needs to continue exactly; ``epoch`` / ``position``: where the real batches are."""

    model: GAN
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    sched_g: Any
    sched_d: Any
    step: int = 0
    epoch: int = 0
    position: int = 0
    scores: dict[str, float] = field(default_factory=dict)

    def save(self, run_dir: Path) -> Path:
        from .checkpoint import save_checkpoint

        state = {"step": self.step, "epoch": self.epoch, "position": self.position, "scores": self.scores,
                 "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict(),
                 "sched_g": self.sched_g.state_dict(), "sched_d": self.sched_d.state_dict(), "rng": rng_state()}
        summary = {"tag": "last", "step": self.step, "epoch": self.epoch, "scores": self.scores}
        return save_checkpoint(run_dir, "last", self.model, state, summary=summary)

    def load(self, ckpt: Path) -> "GANState":
        full = load_state(ckpt)                                   # verifies the checksums
        load_weights(self.model, ckpt / "model.safetensors")
        for name in ("opt_g", "opt_d", "sched_g", "sched_d"):
            getattr(self, name).load_state_dict(full[name])
        self.step, self.epoch, self.position, self.scores = full["step"], full["epoch"], full["position"], full["scores"]
        set_rng_state(full["rng"])
        return self


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
        x, _ = self.images(self._order[1][state.position * self.batch:(state.position + 1) * self.batch])
        state.position += 1
        ended = state.position == self.per_epoch
        if ended:
            state.epoch, state.position = state.epoch + 1, 0
        return x, ended

    def epoch_batches(self, epoch: int, limit: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        order = torch.randperm(len(self.dataset), generator=torch_generator(self.seed, REAL_ORDER, epoch))
        order = order[:limit] if limit else order
        for i in range(0, len(order), self.batch):
            yield self.images(order[i:i + self.batch])


def latents(model: GAN, n: int, *parts: int) -> Tensor:
    return model.sample_latents(n, generator=torch_generator(*parts))


# ----------------------------------------------------------------------------- one iteration

def discriminator_step(state: GANState, real: Tensor, z: Tensor, cfg: GANTrainConfig) -> dict[str, Tensor]:
    """One D update: ``L_D = hinge(D(x), D(G(z))) + α·L_NCE(x)`` (one D forward on ``[x; G(z)]``).
    Returns detached scalars (read on the host only when logged: no device sync per step)."""
    g, d = state.model.generator, state.model.discriminator
    with torch.no_grad():
        fake = g(z)
    logits, local, pooled = d.features(torch.cat([real, fake]))
    b = len(real)
    loss = discriminator_loss(cfg.loss.kind, logits[:b], logits[b:])
    out = {"loss_d": loss.detach(), "d_real": logits[:b].detach().mean(), "d_fake": logits[b:].detach().mean()}
    if d.infomax is not None and cfg.loss.infomax_d > 0:
        nce = infonce_loss(*d.infomax(local[:b], pooled[:b]))
        loss = loss + cfg.loss.infomax_d * nce
        out["infomax_d"] = nce.detach()
    state.opt_d.zero_grad(set_to_none=True)
    loss.backward()
    state.opt_d.step()
    return out


def generator_step(state: GANState, z: Tensor, cfg: GANTrainConfig) -> dict[str, Tensor]:
    """One G update: ``L_G = hinge_G(D(G(z))) + β·L_NCE(G(z))`` (the model's forward and auxiliary loss).
    D's weights are frozen meanwhile: the gradient flows through D to G, D's own is not computed."""
    d = state.model.discriminator
    d.requires_grad_(False)
    try:
        logits = state.model(z)
        loss = generator_loss(cfg.loss.kind, logits)
        out = {"loss_g": loss.detach()}
        aux = state.model.auxiliary_losses()
        if "infomax" in aux and cfg.loss.infomax_g > 0:
            loss = loss + cfg.loss.infomax_g * aux["infomax"]
            out["infomax_g"] = aux["infomax"].detach()
        state.opt_g.zero_grad(set_to_none=True)
        loss.backward()
    finally:
        d.requires_grad_(True)
    state.opt_g.step()
    return out


def iteration(state: GANState, real: RealImages, cfg: GANTrainConfig) -> tuple[dict[str, Tensor], bool]:
    """``n_dis`` D steps then one G step; the schedules step once. Returns metrics and whether a data
    epoch ended."""
    model, b, ended = state.model, cfg.data.batch_size, False
    for i in range(cfg.n_dis):
        x, end = real.next(state)
        ended |= end
        metrics = discriminator_step(state, x.to(_device(model)), latents(model, b, cfg.seed, D_LATENTS, state.step, i), cfg)
    metrics.update(generator_step(state, latents(model, b, cfg.seed, G_LATENTS, state.step), cfg))
    state.sched_g.step()
    state.sched_d.step()
    state.step += 1
    return metrics, ended


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


# ----------------------------------------------------------------------------- building a run

def build_state(cfg: GANTrainConfig, device: torch.device) -> GANState:
    """The preset with the user's overrides, Adam for each network (Mimicry: lr 2e-4, β = (0, 0.9)) and
    the schedules (``optim.decay``)."""
    overrides = dict(cfg.model.overrides)           # a plain dict after OmegaConf.to_object
    torch.manual_seed(cfg.seed)
    model = create_model(cfg.model.name, **overrides)
    if not isinstance(model, GAN):
        raise UserError(f"model.name: {cfg.model.name!r} is a {type(model).__name__}, expected a GAN preset "
                        f"(modwire list models: gan_*)")
    model.to(device).train()
    betas = tuple(cfg.optim.betas)
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=cfg.optim.lr_g, betas=betas)
    opt_d = torch.optim.Adam(model.discriminator.parameters(), lr=cfg.optim.lr_d, betas=betas)

    def decay(step: int) -> float:
        return max(0.0, 1.0 - step / cfg.steps) if cfg.optim.decay == "linear" else 1.0

    sched = [torch.optim.lr_scheduler.LambdaLR(o, decay) for o in (opt_g, opt_d)]
    return GANState(model, opt_g, opt_d, *sched)


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("config key 'device': got 'cuda', but no CUDA device is available")
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


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


def save_grid(model: GAN, cfg: GANTrainConfig, run: Path, step: int) -> Path:
    """``samples/step-<step>.png`` from the run's fixed grid latents (Pillow, extra ``images``)."""
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError(f"sample grids are written with Pillow (pip install 'modwire[images]'): {e}") from None
    n = cfg.grid_size ** 2
    images = torch.cat(list(generate(model, n, n, cfg.seed, GRID_LATENTS)))
    grid = image_grid(images, cfg.grid_size).numpy()
    path = run / "samples" / f"step-{step:08d}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(path)
    return path


def classifier_fid(cfg: GANTrainConfig, real: RealImages, run: Path, device: torch.device):
    """The run's :class:`~modwire.training.gan_metrics.ClassifierFID`: loaded from ``fid_classifier/``,
    or trained (``eval.classifier_epochs`` on the training split) with real statistics of
    ``eval.real_samples`` training images, then saved. Returns ``(scorer, held-out accuracy or None)``."""
    from .gan_metrics import CLASSIFIER_DIR, ClassifierFID, classifier_accuracy, feature_stats, features_of, \
        train_feature_classifier
    from ..tasks import describe_task

    info = describe_task(cfg.data.task, cfg.data.params)
    channels, classes, where = real.shape[0], info.num_classes, run / CLASSIFIER_DIR
    if (where / "model.safetensors").is_file():
        return ClassifierFID.load(where, channels, classes, device), None
    net = train_feature_classifier(real.epoch_batches, channels, classes, epochs=cfg.eval.classifier_epochs,
                                   device=device, seed=cfg.seed)
    reals = (x for x, _ in real.epoch_batches(-1, cfg.eval.real_samples))
    scorer = ClassifierFID(net, *feature_stats(features_of(net, reals, device)), device)
    scorer.save(where)
    accuracy = None
    if cfg.eval.classifier_split:
        held = build_dataset(cfg.data.task, cfg.eval.classifier_split, **cfg.data.params)
        accuracy = classifier_accuracy(net, RealImages(held, cfg.eval.batch_size, cfg.seed, real.shape).epoch_batches(0),
                                       device)
    return scorer, accuracy


def score(state: GANState, cfg: GANTrainConfig, real: RealImages, run: Path, device: torch.device) -> dict[str, float]:
    """classifier-FID (and Inception FID / IS with ``eval.inception_weights``) of ``eval.num_samples``
    generated images (the same latents at every evaluation)."""
    out: dict[str, float] = {}
    state.model.set_eval_options(random_attention=cfg.eval.random_attention)   # generation runs in eval mode
    fakes = lambda: generate(state.model, cfg.eval.num_samples, cfg.eval.batch_size, cfg.seed, EVAL_LATENTS)  # noqa: E731
    if cfg.eval.classifier_fid:
        scorer, accuracy = classifier_fid(cfg, real, run, device)
        out["classifier_fid"] = scorer.score(fakes())
        if accuracy is not None:
            out["fid_classifier_accuracy"] = accuracy
    if cfg.eval.inception_weights:
        from .gan_metrics import inception_metrics

        reals = (x for x, _ in real.epoch_batches(-1, cfg.eval.real_samples))
        out.update(inception_metrics(cfg.eval.inception_weights, reals, fakes(), device))
    state.model.set_eval_options(random_attention=False)
    return out


# ----------------------------------------------------------------------------- the run

def check_run_dir(cfg: GANTrainConfig, run: Path, *, resume: bool, overwrite: bool) -> None:
    """On resume the config must agree with the run's ``config.yaml`` (except :data:`GAN_HARMLESS_KEYS`); a fresh
    run refuses a directory that holds one unless ``overwrite``."""
    saved = run / "config.yaml"
    if resume:
        if not saved.is_file():
            raise FileNotFoundError(f"--resume: {run} holds no config.yaml (not a GAN run directory)")
        changes = _differences(load_gan_config(saved), cfg)
        refused = [f"{k}: {a!r} → {b!r}" for k, (a, b) in changes.items() if k not in GAN_HARMLESS_KEYS]
        if refused:
            raise UserError(f"--resume {run}: the config differs from the run's config.yaml: {'; '.join(refused)} "
                            f"(only {', '.join(GAN_HARMLESS_KEYS)} may change); start a new run (another out_dir) instead")
    elif ((run / "checkpoints").exists() or saved.exists()) and not overwrite:
        raise FileExistsError(f"{run} already holds a run: continue it with --resume, or start afresh with "
                              f"--overwrite (its checkpoints, samples and scores are deleted)")


def start_fresh(cfg: GANTrainConfig, run: Path) -> None:
    """Delete an earlier run's outputs (``--overwrite``) and write ``config.yaml``."""
    import shutil

    for name in ("checkpoints", "samples", "fid_classifier", "metrics.jsonl"):
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    (run / "config.yaml").write_text(to_yaml(cfg))


def _differences(old: GANTrainConfig, new: GANTrainConfig) -> dict[str, tuple[Any, Any]]:
    from omegaconf import OmegaConf

    def flat(node: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(node, dict) and node:
            return {k2: v2 for k, v in node.items() for k2, v2 in flat(v, f"{prefix}{k}.").items()}
        return {prefix[:-1]: node}

    a, b = (flat(OmegaConf.to_container(OmegaConf.structured(c))) for c in (old, new))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if k != "out_dir" and a.get(k) != b.get(k)}


def train_gan(cfg: GANTrainConfig, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train (or continue) the GAN of ``cfg``; returns ``{"step", "scores", "exit_code"}`` (exit code
    130 / 143 after SIGINT / SIGTERM, once ``last`` is written)."""
    run, device = Path(cfg.out_dir), resolve_device(cfg.device)
    with RunLock(run):
        check_run_dir(cfg, run, resume=resume, overwrite=overwrite)
        state = build_state(cfg, device)
        c = state.model.config
        dataset = build_dataset(cfg.data.task, cfg.data.split, max_samples=cfg.data.max_samples, **cfg.data.params)
        real = RealImages(dataset, cfg.data.batch_size, cfg.seed, (c.image_channels, c.image_size, c.image_size))
        if not resume:
            start_fresh(cfg, run)          # only once the model and the data are known to work
        elif (run / "checkpoints" / "last").exists():
            state.load(run / "checkpoints" / "last")
        log = MetricsLog(run, True, state.step if resume else None)
        with StopSignals() as stop:
            _loop(state, real, cfg, run, device, log, stop)
        log.close()
        return {"step": state.step, "scores": state.scores, "exit_code": stop.exit_code}


def _loop(state: GANState, real: RealImages, cfg: GANTrainConfig, run: Path, device: torch.device, log: MetricsLog,
          stop: StopSignals) -> None:
    started = time.perf_counter()
    if state.step == 0 and cfg.eval.every:                  # the untrained generator: where the curve starts
        state.scores = score(state, cfg, real, run, device)
        log.log({"step": 0, **state.scores})
        print("step 0: " + "  ".join(f"{k} {v:.4g}" for k, v in state.scores.items()), flush=True)
    while state.step < cfg.steps and not stop.requested:
        metrics, epoch_ended = iteration(state, real, cfg)
        step = state.step
        if step % cfg.log_every == 0 or step == cfg.steps:
            metrics = {k: v.item() for k, v in metrics.items()}
            log.log({"step": step, "epoch": state.epoch, "lr_g": state.sched_g.get_last_lr()[0], **metrics,
                     "seconds": round(time.perf_counter() - started, 3)})
            print(f"step {step}/{cfg.steps}  " + "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()), flush=True)
        if (cfg.sample_every and step % cfg.sample_every == 0) or (not cfg.sample_every and epoch_ended):
            save_grid(state.model, cfg, run, step)
        if (cfg.eval.every and step % cfg.eval.every == 0) or step == cfg.steps:
            state.scores = score(state, cfg, real, run, device)
            if state.scores:
                log.log({"step": step, **state.scores})
                print(f"step {step}: " + "  ".join(f"{k} {v:.4g}" for k, v in state.scores.items()), flush=True)
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps or stop.requested:
            state.save(run)
    if state.step == cfg.steps:
        save_grid(state.model, cfg, run, state.step)


def score_run(run_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Score a run's ``checkpoints/last`` again (``modwire gan --score RUN_DIR``), with the run's own
    config and ``eval.*`` / ``device`` overrides only, e.g. ``eval.random_attention=true`` (NFM §4.4)
    or more samples. Nothing in the run directory changes, except ``fid_classifier/`` if it was missing."""
    run = Path(run_dir)
    if not (run / "config.yaml").is_file() or not (run / "checkpoints" / "last").exists():
        raise FileNotFoundError(f"--score {run}: expected a GAN run directory with config.yaml and checkpoints/last")
    bad = [o for o in overrides if not o.split("=", 1)[0].removesuffix(":").strip().startswith(("eval.", "device"))]
    if bad:
        raise UserError(f"--score: only eval.* and device overrides apply to a trained run, got {bad[0]!r}")
    cfg = load_gan_config(run / "config.yaml", [*overrides, f"out_dir={json.dumps(str(run))}"])
    device = resolve_device(cfg.device)
    state = build_state(cfg, device)
    state.load(run / "checkpoints" / "last")
    c = state.model.config
    dataset = build_dataset(cfg.data.task, cfg.data.split, max_samples=cfg.data.max_samples, **cfg.data.params)
    real = RealImages(dataset, cfg.data.batch_size, cfg.seed, (c.image_channels, c.image_size, c.image_size))
    return {"run": str(run), "step": state.step, "random_attention": cfg.eval.random_attention,
            **score(state, cfg, real, run, device)}


# ----------------------------------------------------------------------------- entry point

def run_command(args: argparse.Namespace) -> int:
    if args.score:
        if args.config or args.resume or args.overwrite:
            raise UserError("--score RUN_DIR takes the run's own config: give no CONFIG, --resume or --overwrite")
        print(json.dumps(score_run(args.score, args.overrides)))
        return 0
    cfg = load_gan_config(args.config, args.overrides)
    result = train_gan(cfg, resume=args.resume, overwrite=args.overwrite)
    print(f"done: step {result['step']}  " + "  ".join(f"{k} {v:.4g}" for k, v in result["scores"].items()))
    return result["exit_code"]

