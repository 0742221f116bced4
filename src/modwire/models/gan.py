"""A ResNet GAN for 32×32 images, with NFM in the generator (NFM §4.1, Table 4).

The base networks are the 32×32 ResNet GAN of SNGAN (Miyato et al. 2018) as InfoMax-GAN
(Lee, Tran & Cheung 2021) uses it through the Mimicry library (Lee & Town 2020), written here
from the papers' descriptions:

- **Generator** (``ngf = 256``): ``z [B, 128]`` → linear → ``h^(0) [B, 256, 4, 4]`` → three residual
  up-blocks (BN → ReLU → ×2 nearest upsampling → conv3×3 → BN → ReLU → conv3×3, shortcut ×2
  upsampling → conv1×1) → ``[B, 256, 32, 32]`` → final block (BN → ReLU → conv3×3 → tanh) →
  image ``[B, C, 32, 32]`` in (-1, 1).
- **Discriminator** (``ndf = 128``, spectral norm on every weight): an optimised first block
  (conv3×3 → ReLU → conv3×3 → avg-pool 2, shortcut avg-pool → conv1×1), a down-sampling block,
  two plain blocks (ReLU → conv3×3 → ReLU → conv3×3, 1×1 shortcut where the shape changes) →
  ReLU → sum over positions → linear → logit ``[B, 1]``.
- **InfoMax heads** (``discriminator.infomax``): InfoMax-GAN's contrastive term reads the
  second block's output (local features ``[B, ndf, 8, 8]``) and the pooled final features
  (global ``[B, ndf]``), each projected to ``rkhs_dim`` by a two-layer map with a linear skip
  (1×1 convolutions for the local features); the InfoNCE loss is in
  :mod:`modwire.nn.gan_losses`.

**NFM (§4.1):** "NFM after this first spatial layer and after the output of each residual
block": the generator's blocks are ``[res1, res2, res3, final]`` with channels
``(256, 256, 256, 256, C)`` and :func:`modwire.models.nfm.build_body` wraps them, so a reader runs
before each of them, two passes (8 readers; pass 2 runs its own copy of the blocks), ``d_k = d_v =
32``, 4 heads; §4.1 gives no top-k, so the NFM default ``k = 5`` (§4.2-4.3's value) is kept. "We
modify only the generator": the discriminator and the losses are unchanged. Cost against the base
GAN and against two base passes: ``benchmarks/bench_nfm.py --presets '*gan_resnet*'``.

``GAN.forward(z)`` is ``D(G(z))``, the logits ``[B, 1]`` of generated images (what the generator
step optimises; the registry contract's forward); with the InfoMax heads, a training forward
also reports the InfoNCE loss of those images as ``auxiliary_losses()["infomax"]``. Training:
:mod:`modwire.training.gan`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm

from ..nn.checks import check_float, check_not_empty, check_tensor
from ..nn.gan_losses import infonce_loss
from .base import PretrainedModel
from .config import COUNT, ConfigBase, ModelConfig, example_generator
from .nfm import NFMConfig, build_body, set_random_attention
from .registry import register_model_type, register_preset
from ..errors import UserError


@dataclass
class GANGeneratorConfig(ConfigBase):
    """``latent_dim`` (nz), ``channels`` (ngf), ``bottom_width`` (the first spatial layer's size),
    ``num_blocks`` residual up-blocks (each doubles the size: image size = bottom_width·2^num_blocks)."""

    latent_dim: int = 128
    channels: int = 256
    bottom_width: int = 4
    num_blocks: int = 3
    bounds = {"latent_dim": COUNT, "channels": COUNT, "bottom_width": COUNT, "num_blocks": COUNT}


@dataclass
class DiscriminatorConfig(ConfigBase):
    """``channels`` (ndf); ``infomax``: InfoMax-GAN's projection heads; ``rkhs_dim`` their width."""

    channels: int = 128
    infomax: bool = True
    rkhs_dim: int = 1024
    bounds = {"channels": COUNT, "rkhs_dim": COUNT}


@dataclass
class GANConfig(ModelConfig):
    """Defaults: InfoMax-GAN on CIFAR-10 (32×32×3; Mimicry's ngf 256, ndf 128, nz 128, rkhs 1024).
    ``nfm``: NFM around the generator's blocks (NFM §4.1: ``enabled``, 2 passes, d_k = d_v = 32)."""

    model_type = "gan"

    image_size: int = 32
    image_channels: int = 3
    generator: GANGeneratorConfig = field(default_factory=GANGeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)
    nfm: NFMConfig = field(default_factory=NFMConfig)
    bounds = {"image_size": COUNT, "image_channels": COUNT}

    @property
    def num_classes(self) -> int:
        """One logit per image (real vs generated)."""
        return 1

    @property
    def latent_dim(self) -> int:
        return self.generator.latent_dim

    def input_names(self) -> tuple[str, ...]:
        return ("z",)                              # model(z): D(G(z))

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        """Latents ``z [B, latent_dim]``."""
        return {"z": torch.randn(batch, self.latent_dim, generator=example_generator(device, seed), device=device)}

    def validate(self) -> None:
        g = self.generator
        if g.bottom_width * 2 ** g.num_blocks != self.image_size:
            raise UserError(f"config field 'image_size': got {self.image_size}, expected generator.bottom_width · "
                            f"2^generator.num_blocks = {g.bottom_width} · 2^{g.num_blocks} = "
                            f"{g.bottom_width * 2 ** g.num_blocks} (each up-block doubles the size)")
        if self.image_size % 4:
            raise UserError(f"config field 'image_size': got {self.image_size}, expected a multiple of 4 (the "
                            f"discriminator halves it twice)")


def _xavier(module: nn.Module, gain: float) -> nn.Module:
    nn.init.xavier_uniform_(module.weight, gain)
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return module


def _conv(c_in: int, c_out: int, size: int, *, sn: bool = False, gain: float = 2 ** 0.5,
          bias: bool = True) -> nn.Module:
    """A ``size×size`` convolution (same padding), Xavier-uniform (SNGAN's initialisation: gain √2 in
    the residual paths, 1 in the shortcuts), spectrally normalised with ``sn``."""
    layer = _xavier(nn.Conv2d(c_in, c_out, size, padding=size // 2, bias=bias), gain)
    return spectral_norm(layer) if sn else layer


def _linear(d_in: int, d_out: int, *, sn: bool = False) -> nn.Module:
    layer = _xavier(nn.Linear(d_in, d_out), 1.0)
    return spectral_norm(layer) if sn else layer


# ----------------------------------------------------------------------------- generator

class UpBlock(nn.Module):
    """``[B, c_in, S, S] → [B, c_out, 2S, 2S]``: BN → ReLU → ×2 → conv3×3 → BN → ReLU → conv3×3,
    plus the shortcut ×2 → conv1×1 (SNGAN's generator block).

    The three convolutions have no bias (Mimicry's do): ``conv1`` feeds a BatchNorm, and the block's
    output (``conv2`` + shortcut) feeds the next block's or the final block's BatchNorm, directly
    or through 1×1 shortcuts, so a per-channel constant added there is cancelled in training: those
    biases never get a gradient (``tests/models/test_dead_parameters.py``). (In the NFM generator the
    readers' key, value and query projections have biases of their own that absorb such a constant.)"""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(c_in), _conv(c_in, c_out, 3, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(c_out), _conv(c_out, c_out, 3, bias=False)
        self.shortcut = _conv(c_in, c_out, 1, gain=1.0, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = F.interpolate(F.relu(self.bn1(x)), scale_factor=2, mode="nearest")
        h = self.conv2(F.relu(self.bn2(self.conv1(h))))
        return h + self.shortcut(F.interpolate(x, scale_factor=2, mode="nearest"))


class ToImage(nn.Module):
    """``[B, c, S, S] → [B, C_img, S, S]`` in (-1, 1): BN → ReLU → conv3×3 → tanh."""

    def __init__(self, channels: int, image_channels: int) -> None:
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(channels), _conv(channels, image_channels, 3, gain=1.0)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.conv(F.relu(self.bn(x))))


class ResNetGenerator(nn.Module):
    """``z [B, latent_dim] → images [B, C, S, S]``; ``body`` is the plain block sequence or the NFM
    around it (NFM §4.1), with ``records`` / ``random_attention`` (:mod:`modwire.models.nfm`)."""

    def __init__(self, c: GANConfig) -> None:
        super().__init__()
        g = c.generator
        self.channels, self.width = g.channels, g.bottom_width
        self.stem = _linear(g.latent_dim, g.bottom_width ** 2 * g.channels)
        blocks = [*(UpBlock(g.channels, g.channels) for _ in range(g.num_blocks)), ToImage(g.channels, c.image_channels)]
        self.body = build_body(c.nfm, blocks, [g.channels] * (g.num_blocks + 1) + [c.image_channels])

    def forward(self, z: Tensor, *, record: bool = False) -> Tensor:
        layout = f"latents z [B, {self.stem.in_features}]"
        check_tensor(z, "z", layout)
        if z.dim() != 2 or z.shape[1] != self.stem.in_features:
            raise UserError(f"GAN: expected {layout}, got {list(z.shape)}")
        check_not_empty(z, "z", layout)
        check_float(z, "z", layout, self.stem.weight)                            # dtype, device, finite
        h = self.stem(z).view(len(z), self.channels, self.width, self.width)     # h^(0) [B, ngf, 4, 4]
        return self.body(h, record=record)                                       # [B, C, S, S]


# ----------------------------------------------------------------------------- discriminator

class DownBlock(nn.Module):
    """SNGAN's discriminator block ``[B, c_in, S, S] → [B, c_out, S', S']`` (``S' = S/2`` with
    ``downsample``). ``first``: the optimised first block (no leading ReLU; pool, then 1×1 shortcut)."""

    def __init__(self, c_in: int, c_out: int, *, downsample: bool, first: bool = False) -> None:
        super().__init__()
        self.downsample, self.first = downsample, first
        self.conv1, self.conv2 = _conv(c_in, c_out, 3, sn=True), _conv(c_out, c_out, 3, sn=True)
        learned = first or downsample or c_in != c_out
        self.shortcut = _conv(c_in, c_out, 1, sn=True, gain=1.0) if learned else None

    def _pool(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, 2) if self.downsample else x

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv2(F.relu(self.conv1(x if self.first else F.relu(x))))
        if self.shortcut is None:
            return h + x
        skip = self.shortcut(self._pool(x)) if self.first else self._pool(self.shortcut(x))
        return self._pool(h) + skip


class InfoMaxHeads(nn.Module):
    """InfoMax-GAN's projections: local ``[B, ndf, H, W] → [B, R, H·W]``, global ``[B, ndf] → [B, R]``,
    each ``skip(x) + W₂ ReLU(W₁ x)`` with spectral norm (1×1 convolutions for the local map)."""

    def __init__(self, channels: int, rkhs: int) -> None:
        super().__init__()
        self.local1, self.local2 = _conv(channels, rkhs, 1, sn=True, gain=1.0), _conv(rkhs, rkhs, 1, sn=True, gain=1.0)
        self.local_skip = _conv(channels, rkhs, 1, sn=True, gain=1.0)
        self.global1, self.global2 = _linear(channels, rkhs, sn=True), _linear(rkhs, rkhs, sn=True)
        self.global_skip = _linear(channels, rkhs, sn=True)

    def forward(self, local: Tensor, pooled: Tensor) -> tuple[Tensor, Tensor]:
        l = self.local2(F.relu(self.local1(local))) + self.local_skip(local)
        g = self.global2(F.relu(self.global1(pooled))) + self.global_skip(pooled)
        return l.flatten(2), g


class ResNetDiscriminator(nn.Module):
    """``images [B, C, S, S] → logits [B, 1]`` (spectral norm everywhere; SNGAN / InfoMax-GAN 32×32)."""

    def __init__(self, c: GANConfig) -> None:
        super().__init__()
        d = c.discriminator.channels
        self.blocks = nn.ModuleList([DownBlock(c.image_channels, d, downsample=True, first=True),
                                     DownBlock(d, d, downsample=True), DownBlock(d, d, downsample=False),
                                     DownBlock(d, d, downsample=False)])
        self.head = _linear(d, 1, sn=True)
        self.infomax = InfoMaxHeads(d, c.discriminator.rkhs_dim) if c.discriminator.infomax else None

    def features(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(logits [B, 1], local [B, ndf, S/4, S/4], pooled [B, ndf])``."""
        h = self.blocks[1](self.blocks[0](x))
        local = h                                                   # the second block's output (InfoMax-GAN)
        pooled = F.relu(self.blocks[3](self.blocks[2](h))).sum(dim=(2, 3))  # global sum pooling
        return self.head(pooled), local, pooled

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)[0]


# ----------------------------------------------------------------------------- the pair

class GAN(PretrainedModel):
    """Generator + discriminator, saved and loaded together (module docstring)."""

    config_class = GANConfig
    eval_options = ("random_attention",)   # NFM §4.4's ablation (set_eval_options; scored by modwire eval: gan.eval.random_attention)

    def __init__(self, config: GANConfig) -> None:
        super().__init__()
        self.config = config
        self.generator = ResNetGenerator(config)
        self.discriminator = ResNetDiscriminator(config)
        self._aux: dict[str, Tensor] = {}

    def sample_latents(self, n: int, *, generator: torch.Generator | None = None) -> Tensor:
        """``z ~ N(0, I)`` ``[n, latent_dim]`` on the model's device (drawn on the CPU: reproducible)."""
        z = torch.randn(n, self.config.latent_dim, generator=generator)
        return z.to(next(self.parameters()).device)

    def generate(self, z: Tensor, *, record: bool = False) -> Tensor:
        """``G(z)``: ``z [B, latent_dim] → images [B, C, S, S]`` in [-1, 1]; ``record``: the generator's NFM
        readers keep their records (``modwire.analysis.nfm.generator_read_map``)."""
        return self.generator(z, record=record)

    def forward(self, z: Tensor) -> Tensor:
        """``D(G(z))``: ``z [B, latent_dim] → logits [B, 1]``; a training forward with InfoMax heads also
        computes the InfoNCE loss of the generated images (``auxiliary_losses``)."""
        logits, local, pooled = self.discriminator.features(self.generator(z))
        self._aux = {}
        if self.training and self.discriminator.infomax is not None:
            self._aux = {"infomax": infonce_loss(*self.discriminator.infomax(local, pooled))}
        return logits

    def auxiliary_losses(self) -> dict[str, Tensor]:
        """``{"infomax": L_NCE(G(z))}`` after a training forward with InfoMax heads; else ``{}``."""
        return dict(self._aux) if self.training else {}

    def set_eval_options(self, *, random_attention: bool) -> None:
        """NFM §4.4's ablation: the generator's readers attend at random (NFM generators only)."""
        self.config = self.config.replace(nfm={"random_attention": random_attention})   # type-checked field
        set_random_attention(self.generator.body, self.config.nfm.random_attention)

    decay_exempt = ()    # biases, norms and ≤1-D parameters only (each network has its own optimizer)


register_model_type(GAN)


# output_bias False: every path from a generator read starts with a BatchNorm (the up-blocks', the final
# block's), which would cancel W_o2's bias in training (modwire.nn.nfm, module docstring).
def _cifar10(nfm: bool) -> GANConfig:
    return GANConfig(nfm={"enabled": True, "passes": 2, "d_k": 32, "d_v": 32, "num_heads": 4, "output_bias": False}
                     if nfm else {})


def _micro(nfm: bool) -> GANConfig:
    return GANConfig(image_size=16, image_channels=1, generator={"latent_dim": 16, "channels": 16, "num_blocks": 2},
                     discriminator={"channels": 16, "rkhs_dim": 32},
                     nfm={"enabled": True, "passes": 2, "d_k": 8, "d_v": 8, "num_heads": 2, "output_bias": False}
                     if nfm else {})


register_preset("gan_resnet_cifar10", GAN, lambda: _cifar10(False),
                "InfoMax-GAN 32×32 ResNet (NFM Table 4 baseline; Mimicry's ngf 256, ndf 128)")
register_preset("nfm_gan_resnet_cifar10", GAN, lambda: _cifar10(True),
                "NFM §4.1, Table 4: NFM(InfoMax-GAN), 2 passes, d_k = d_v = 32, 4 heads")
register_preset("gan_resnet_micro", GAN, lambda: _micro(False), "test-sized ResNet GAN (16×16×1)")
register_preset("nfm_gan_resnet_micro", GAN, lambda: _micro(True), "test-sized NFM ResNet GAN (16×16×1)")
