"""Pre-activation ResNets (He et al. 2016b, "Identity mappings in deep residual networks"), the
base networks of NFM §4.4 / Table 2, with Neural Function Modules (NFM Algorithm 1) before each
stage (or, as an option, each residual block).

The network reads top to bottom::

    h⁽⁰⁾ = stem(x)                       3×3 conv, stride 1 (CIFAR, 32×32) or 2 (Tiny-ImageNet, 64×64)
    h⁽ⁱ⁾ = f⁽ⁱ⁾(h⁽ⁱ⁻¹⁾),  i = 1..N         the residual blocks of the 4 stages (64·2ˢ·expansion wide)
    logits = W · avgpool(h⁽ᴺ⁾)           (optionally BN → ReLU first: ``final_norm``)

As in the code of Verma et al. (2019)'s Manifold Mixup (``supervised/models/preresnet.py``), whose
experimental procedure NFM Table 2 follows: a 3×3 stem without BN, the 1×1 projection shortcut
applied to the *pre-activated* input when the shape changes, no BN → ReLU before the pooling
(``final_norm=False``; He et al. 2016b's Fig. 1 has one: ``final_norm=True``), stem stride 2 on
Tiny-ImageNet (their ``main.py``). Default PyTorch initialisation, as there.

NFM (``nfm.enabled``; NFM §4.4: "two-pass setup with k = 5"): the stages (``nfm_modules="stage"``,
default: the placement of the paper's ResNet integrations, 4 modules per pass) or the residual blocks
(``"block"``) become Algorithm 1's modules ``f⁽¹⁾..f⁽ᴺ⁾`` (:func:`modwire.models.nfm.build_body`);
before each module its input attends over every module output written so far (both passes), rescaled
to its size;
pass 2 runs a deep copy of the blocks (``f_θ₂``). The stem is outside Algorithm 1 (its
``x``): both passes start from the same ``h⁽⁰⁾``. With γ = 0 (initialisation) the model computes
the base network exactly (pass 2's blocks are copies of pass 1's).

Evaluation option ``random_attention`` (NFM §4.4's ablation: attention drawn from a Gaussian at
test time): ``modwire eval RUN --set model.overrides.random_attention=true``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.checks import check_float, check_not_empty
from .base import BATCHNORM_REFUSAL
from ..nn.blocks import linear_head
from .classifier_api import Classifier
from .config import CLASSES, COUNT, Bounds, ModelConfig, check_single_head, example_generator
from .inputs import Inputs, named_inputs
from .nfm import NFMConfig, NFMModelRecord, body_blocks, body_layer_groups, build_body, set_random_attention
from .registry import register_model_type, register_preset
from ..errors import UserError

BLOCKS = ("basic", "bottleneck")
NFM_MODULES = ("block", "stage")


@dataclass
class PreActResNetConfig(ModelConfig):
    """PreActResNet hyperparameters; defaults are PreActResNet-18 on CIFAR-10 (NFM Table 2).

    ``block``: ``basic`` (two 3×3 convs, ResNet-18/34) or ``bottleneck`` (1×1, 3×3, 1×1, expansion
    4, ResNet-50); ``num_blocks``: blocks per stage (stage ``s`` has ``initial_channels·2ˢ`` planes,
    stride 2 from the second stage on); ``stem_stride``: 1 for 32×32 inputs, 2 for 64×64 (Verma et
    al.'s Tiny-ImageNet setting); ``image_size``: the (square) input the model is fitted to (any size
    runs; used for test inputs and benchmarks); ``nfm``: :class:`~modwire.models.nfm.NFMConfig`;
    ``nfm_modules``: what Algorithm 1's modules are, ``stage`` (default: each stage's blocks run as one
    module, a reader before each stage, 4 per pass; the paper's placement in its ResNet integrations:
    §4.2 "we used two passes ... Thus the NFM module is used 8 times", §4.5 "the NFM module is added at
    four places"; Table 2 does not say) or ``block`` (a reader before every residual block: 8 per pass
    for ResNet-18, an option; its cost against ``stage``'s, over the base network run twice:
    ``benchmarks/bench_nfm.py``)."""

    model_type = "preact_resnet"

    num_classes: int = 10
    in_channels: int = 3
    image_size: int = 32
    block: str = "basic"
    num_blocks: list[int] = field(default_factory=lambda: [2, 2, 2, 2])
    initial_channels: int = 64
    stem_stride: int = 1
    final_norm: bool = False
    nfm: NFMConfig = field(default_factory=NFMConfig)
    nfm_modules: str = "stage"

    bounds = {"num_classes": CLASSES, "in_channels": COUNT, "image_size": COUNT, "initial_channels": COUNT,
              "stem_stride": Bounds(lo=1, hi=2)}
    choices = {"block": BLOCKS, "nfm_modules": NFM_MODULES}

    def validate(self) -> None:
        if not self.num_blocks or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                          for n in self.num_blocks):
            raise UserError(f"config field 'num_blocks': got {self.num_blocks!r}, expected a non-empty list of "
                            f"integers >= 1 (blocks per stage, e.g. [2, 2, 2, 2] for PreActResNet-18)")

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        import torch

        size = (batch, self.in_channels, self.image_size, self.image_size)
        return {"x": torch.rand(*size, generator=example_generator(device, seed), device=device)}

    def input_overrides(self, inputs: Inputs, num_classes: int, heads: int = 1) -> dict[str, Any]:
        check_single_head(heads, self.model_type)
        named = named_inputs(inputs)
        spec = named.get("x")
        if len(named) != 1 or spec is None or spec.kind != "image" or spec.height != spec.width:
            got = {k: (s.kind, s.channels, s.height, s.width) for k, s in named.items()}
            raise UserError(f"a {self.model_type!r} model reads one square image input 'x' [C, S, S]; the task "
                            f"gives {got}")
        return {"in_channels": spec.channels, "image_size": spec.height, "num_classes": num_classes}


class PreActBlock(nn.Module):
    """He et al. 2016b's full pre-activation basic block: ``x + conv(σ(BN(conv(σ(BN(x))))))``; when
    the shape changes, the shortcut is a 1×1 conv of ``σ(BN(x))``. ``[B, c_in, H, W] → [B, planes, H/s, W/s]``."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.shortcut = _projection(c_in, planes * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        a = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(a)
        return self.conv2(F.relu(self.bn2(self.conv1(a)))) + skip


class PreActBottleneck(nn.Module):
    """The pre-activation bottleneck (1×1 → 3×3 (stride) → 1×1, each after BN → ReLU), expansion 4.
    ``[B, c_in, H, W] → [B, 4·planes, H/s, W/s]``."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.shortcut = _projection(c_in, planes * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        a = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(a)
        out = self.conv2(F.relu(self.bn2(self.conv1(a))))
        return self.conv3(F.relu(self.bn3(out))) + skip


def _projection(c_in: int, c_out: int, stride: int) -> nn.Module | None:
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False) if stride != 1 or c_in != c_out else None


def residual_blocks(c: PreActResNetConfig) -> tuple[list[nn.Module], list[int]]:
    """Algorithm 1's modules in order, and ``channels = (c₀, c₁, .., c_N)``: the stem's width and each
    module's output width (NFM's ``channels``). A module is one residual block (``nfm_modules="block"``)
    or one stage, an ``nn.Sequential`` of its blocks (``"stage"``)."""
    kind = PreActBlock if c.block == "basic" else PreActBottleneck
    stages, channels, width = [], [c.initial_channels], c.initial_channels
    for stage, n in enumerate(c.num_blocks):
        planes = c.initial_channels * 2 ** stage
        blocks = []
        for j in range(n):
            blocks.append(kind(width, planes, 2 if stage > 0 and j == 0 else 1))
            width = planes * kind.expansion
            channels += [width] if c.nfm_modules == "block" else []
        stages.append(blocks)
        channels += [width] if c.nfm_modules == "stage" else []
    if c.nfm_modules == "stage":
        return [nn.Sequential(*blocks) for blocks in stages], channels
    return [b for blocks in stages for b in blocks], channels


class PreActResNet(Classifier):
    """``model(x [B, C, H, W]) → logits [B, num_classes]``; ``forward_record(x)`` adds the
    pooled features (``states [B, c_N]``) and, with NFM, one ``NFMRecord`` per reader (``nfm``;
    :class:`~modwire.models.nfm.NFMModelRecord`)."""

    config_class = PreActResNetConfig
    grad_checkpointing_refusal = BATCHNORM_REFUSAL
    record_type = NFMModelRecord

    def __init__(self, config: PreActResNetConfig) -> None:
        super().__init__()
        self.config = c = config
        self.stem = nn.Conv2d(c.in_channels, c.initial_channels, 3, stride=c.stem_stride, padding=1, bias=False)
        blocks, channels = residual_blocks(c)
        self.body_channels = tuple(channels)                               # c_0 … c_N (the head reads c_N)
        self.body = build_body(c.nfm, blocks, channels)
        self.norm = nn.BatchNorm2d(channels[-1]) if c.final_norm else None
        self.head = linear_head(channels[-1], c.num_classes)

    def features(self, x: Tensor, *, record: bool = False) -> Tensor:
        """``x [B, C, H, W]`` → pooled features ``[B, c_N]``."""
        return self._feature_map(x, record=record).mean(dim=(-2, -1))   # [B, c_N]

    def _feature_map(self, x: Tensor, *, record: bool = False) -> Tensor:
        self._check_input(x)
        h = self.body(self.stem(x), record=record)                      # [B, c_N, H', W']
        if self.norm is not None:
            h = F.relu(self.norm(h))
        return h

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def forward_record(self, x: Tensor) -> NFMModelRecord:
        feats = self.features(x, record=True)
        return NFMModelRecord(self.head(feats), feats, nfm=list(self.body.records))

    # timm's API (classifier_api): the features are the final map [B, c_N, H', W'] (after the final BN →
    # ReLU when there is one); the head is the average pool (timm's "avg") and the linear layer; a block is
    # one of Algorithm 1's modules (a stage by default, nfm_modules), of the last pass with NFM.
    input_layer, feature_kind, fixed_input_size = "stem", "map", False    # any image size runs
    stem_modules = ("stem",)

    def forward_features(self, x: Tensor) -> Tensor:
        """The final feature map ``[B, c_N, H', W']``."""
        return self._feature_map(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """``[B, c_N, H', W']`` → logits ``[B, C]``, or the pooled features ``[B, c_N]``."""
        pooled = x.mean(dim=(-2, -1))                                   # [B, c_N]
        return pooled if pre_logits else self.head(pooled)

    @property
    def num_features(self) -> int:
        return self.body_channels[-1]

    def global_pool(self) -> str | None:
        return "avg"

    def intermediate_blocks(self) -> list[tuple[nn.Module, int]]:
        return body_blocks(self.body)

    def layer_groups(self) -> list[list[nn.Module]]:
        return body_layer_groups(self.body)

    def classifier_name(self) -> str:
        return "head"

    @classmethod
    def timm_overrides(cls, config: PreActResNetConfig, *, in_chans: int | None = None,
                       drop_rate: float | None = None, global_pool: str | None = None) -> dict[str, Any]:
        """``in_chans`` → ``in_channels``; ``global_pool``: ``avg`` only; no dropout (``drop_rate``)."""
        if global_pool not in (None, "avg"):
            raise UserError(f"create_model: global_pool {global_pool!r}: a PreActResNet average-pools ('avg') "
                            f"and has no other pooling")
        return {**({} if in_chans is None else {"in_channels": in_chans}),
                **super().timm_overrides(config, drop_rate=drop_rate)}

    def _check_input(self, x: Tensor) -> None:
        c = self.config.in_channels
        layout = f"float images [B, {c}, H, W]"
        if not isinstance(x, Tensor) or x.dim() != 4 or x.shape[1] != c or not x.is_floating_point():
            got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
            raise UserError(f"{type(self).__name__} expects {layout}, got {got}")
        check_not_empty(x, "x", layout)
        check_float(x, "x", layout, self.stem.weight)                 # the weights' dtype and device, finite

    def parameter_sets(self) -> dict[str, tuple[str, ...]]:
        """Fine-tuning sets (``modwire finetune --train``): ``head`` (the linear classifier), ``nfm``
        (the readers, NFM models only) and ``all``."""
        return {"head": ("head.",), **({"nfm": ("body.readers.",)} if self.config.nfm.enabled else {}),
                "all": ("",)}

    def new_task(self, num_classes: int, heads: int = 1) -> None:
        """A freshly initialised ``head`` for ``num_classes`` outputs (one head only); ``config`` follows."""
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise UserError(f"new_task: num_classes must be a positive int, got {num_classes!r}")
        check_single_head(heads, self.config.model_type)
        self.replace_classifier(num_classes)

    eval_options = ("random_attention",)   # `modwire eval RUN --set model.overrides.random_attention=true`

    def set_eval_options(self, *, random_attention: bool) -> None:
        """NFM §4.4's ablation: attention scores drawn from N(0, 1) at test time (NFM only)."""
        self.config = self.config.replace(nfm={"random_attention": random_attention})   # type-checked field
        set_random_attention(self.body, self.config.nfm.random_attention)


register_model_type(PreActResNet)

# ----------------------------------------------------------------------------- presets
# NFM Table 2 (Input Mixup α = 1.0, Verma et al.'s procedure): PreActResNet-18 / 34 / 50 on CIFAR-10,
# 18 / 34 on CIFAR-100, 18 on Tiny-ImageNet. The other depth × dataset pairs are registered too
# (same recipe, no row in Table 2). NFM: two passes, k = 5 (§4.4), d_k = d_v = 16, 4 heads.
_DEPTHS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]), 50: ("bottleneck", [3, 4, 6, 3])}
_DATASETS = {"cifar10": (10, 3, 32, 1), "cifar100": (100, 3, 32, 1), "tiny_imagenet": (200, 3, 64, 2)}
_TABLE2 = {(18, "cifar10"): "96.27 vs 96.56", (34, "cifar10"): "96.79 vs 97.05", (50, "cifar10"): "97.31 vs 97.58",
           (18, "cifar100"): "78.15 vs 78.66", (34, "cifar100"): "80.13 vs 80.77",
           (18, "tiny_imagenet"): "57.12 vs 58.32"}
# output_bias False: every path from a read starts with a BatchNorm (pre-activation blocks), which would
# cancel W_o2's bias in training (modwire.nn.nfm, module docstring).
NFM_CLASSIFIER = {"enabled": True, "passes": 2, "k": 5, "d_k": 16, "d_v": 16, "num_heads": 4, "output_bias": False}
# NFM Table 9 conflicts with the nfm_preact_resnet34_cifar100 preset (the settings above): its twelve runs of
# PreActResNet34 on CIFAR-100 use k = 3 or 4 (never 5) with 2 heads × d_k 8 or 4 heads × d_k 16 / 32, and Table 2's
# NFM number for that row, 80.77 %, is Table 9's row "2 heads, top-k 4, d_k 8, d_v 32". The preset keeps §4.4's
# k = 5 and the classifiers' d_k = d_v = 16, 4 heads; Table 9's best row is
# `--set model.overrides.nfm.num_heads=2 model.overrides.nfm.k=4 model.overrides.nfm.d_k=8 model.overrides.nfm.d_v=32`.


def preact_resnet(depth: int, classes: int, channels: int, size: int, stem_stride: int,
                  nfm: bool = False) -> PreActResNetConfig:
    block, num_blocks = _DEPTHS[depth]
    return PreActResNetConfig(num_classes=classes, in_channels=channels, image_size=size, block=block,
                              num_blocks=list(num_blocks), stem_stride=stem_stride,
                              nfm=NFM_CLASSIFIER if nfm else {})


def _source(depth: int, dataset: str, nfm: bool) -> str:
    row = _TABLE2.get((depth, dataset))
    what = f"NFM(PreActResNet-{depth})" if nfm else f"PreActResNet-{depth} (He et al. 2016b)"
    where = f"NFM Table 2 ({dataset}: {row} % base vs NFM)" if row else f"NFM §4.4 recipe ({dataset}; not in Table 2)"
    if nfm and (depth, dataset) == (34, "cifar100"):
        where += ("; conflicts with Table 9 (k 3-4, never 5; 80.77 % is its row 2 heads, k 4, d_k 8, d_v 32): "
                  "k = 5, 4 heads, d_k = d_v = 16 kept")
    return f"{what}, {where}"


for _depth in _DEPTHS:
    for _data, _shape in _DATASETS.items():
        for _nfm in (False, True):
            register_preset(f"{'nfm_' if _nfm else ''}preact_resnet{_depth}_{_data}", PreActResNet,
                            lambda d=_depth, s=_shape, n=_nfm: preact_resnet(d, *s, nfm=n),
                            _source(_depth, _data, _nfm))

# NFM §4.2 (Table 5): multi-digit recognition, 64×64 one-channel images, 10 outputs (which digit classes
# are present; helper task `multi_digit`). The appendix with its network is not available: PreActResNet-18
# with the Tiny-ImageNet stem (stride 2 for 64×64), NFM as in Table 2.
for _nfm in (False, True):
    register_preset(f"{'nfm_' if _nfm else ''}preact_resnet18_multi_digit", PreActResNet,
                    lambda n=_nfm: preact_resnet(18, 10, 1, 64, 2, nfm=n),
                    f"{'NFM(PreActResNet-18)' if _nfm else 'PreActResNet-18'}, NFM §4.2 multi-digit (64×64×1, "
                    f"10 outputs; network of the unavailable appendix assumed)")

_MICRO = dict(num_classes=5, in_channels=1, image_size=8, num_blocks=[1, 1], initial_channels=8)
register_preset("preact_resnet_micro", PreActResNet, lambda: PreActResNetConfig(**_MICRO),
                "test-sized PreActResNet (8×8×1 images, 2 stages of 1 block, 8 / 16 channels)")
register_preset("nfm_preact_resnet_micro", PreActResNet, lambda: PreActResNetConfig(
    **_MICRO, nfm={"enabled": True, "passes": 2, "k": 2, "d_k": 4, "d_v": 4, "num_heads": 2, "output_bias": False}),
    "test-sized NFM(PreActResNet) (two passes, k 2, 2 heads × 4)")
