"""Neural Function Modules as a model option: the ``nfm`` sub-config every NFM integration shares
(NFM §3.3: "in all of these integrations, the internal structure of the NFM module itself remains
the same") and :func:`build_body`, which turns a base network's blocks into the network's body,
with or without NFM.

The integrations (NFM §4), each a base network whose config has ``nfm: NFMConfig``:

* PreActResNet classifiers (§4.4, Table 2): :mod:`modwire.models.resnet`;
* the relational CNN on Sort-of-CLEVR (§4.3, Tables 6-7): :mod:`modwire.models.relational_cnn`;
* the ResNet GAN generator (§4.1, Table 4): :mod:`modwire.models.gan`;
* the transformer language model (§4.6, Table 8): :mod:`modwire.models.lm`.

The mechanism (Algorithm 1, attention over layers and passes, rescaling) is
:class:`modwire.nn.nfm.NFM`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from torch import Tensor, nn

from ..nn.nfm import ACTIVATIONS, LAYOUTS, NFM, NORMS, RESCALES, SCORE_SCALES, LayerFactory
from .config import COUNT, Bounds, ConfigBase, check_choice

__all__ = ["NFMConfig", "BlockSequence", "build_body"]


@dataclass
class NFMConfig(ConfigBase):
    """The NFM hyperparameters (NFM §3.2, §4; defaults: the classifiers' and relational CNN's
    two passes, ``k = 5``, ``d_k = d_v = 16``, 4 heads, ReLU with BatchNorm before it).

    ``enabled``: False gives the base network (no reader, no extra parameter). ``hidden``: width
    of ``W_o1`` (0: the query state's channels). ``rescale``: ``space_to_depth`` (§3.2.2) or
    ``nearest`` (§4.7 ablation). ``score_scale``: ``d_k`` (the printed ``QKᵀ/d_k``) or
    ``sqrt_d_k``. ``share_blocks``: every pass reuses the first pass's blocks (default False: Alg.
    1's per-pass ``f_{θ_k}``). ``random_attention``: evaluation ablation of §4.4 (scores drawn
    from N(0, 1)); refused in training."""

    enabled: bool = False
    k: int = 5
    passes: int = 2
    d_k: int = 16
    d_v: int = 16
    heads: int = 4
    hidden: int = 0
    norm: str = "batch"
    activation: str = "relu"
    rescale: str = "space_to_depth"
    score_scale: str = "d_k"
    share_blocks: bool = False
    random_attention: bool = False

    bounds = {"k": COUNT, "passes": COUNT, "d_k": COUNT, "d_v": COUNT, "heads": COUNT,
              "hidden": Bounds(lo=0, note="0: the query state's channels")}

    def unused_fields(self) -> tuple[str, ...]:
        return () if self.enabled else tuple(n for n in self.bounds)

    def validate(self) -> None:
        p = self._prefix
        check_choice(p + "norm", self.norm, NORMS)
        check_choice(p + "activation", self.activation, tuple(ACTIVATIONS))
        check_choice(p + "rescale", self.rescale, RESCALES)
        check_choice(p + "score_scale", self.score_scale, SCORE_SCALES)

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~modwire.nn.nfm.NFM`."""
        return dict(k=self.k, passes=self.passes, d_k=self.d_k, d_v=self.d_v, heads=self.heads, hidden=self.hidden,
                    norm=self.norm, activation=self.activation, rescale=self.rescale,
                    score_scale=self.score_scale, share_blocks=self.share_blocks)


class BlockSequence(nn.Module):
    """The base network's body: ``blocks`` run once, in order (``nfm.enabled = False``). Same
    interface as :class:`~modwire.nn.nfm.NFM` (``forward(x, record=False)``, ``records``,
    ``random_attention``) and the same parameter names for the blocks (``blocks.<i>.…``), so a
    base network's weights load into the first pass of its NFM version."""

    passes = 1

    def __init__(self, blocks: Sequence[nn.Module], layout: str = "channels_first") -> None:
        super().__init__()
        check_choice("layout", layout, LAYOUTS)
        self.blocks = nn.ModuleList(blocks)
        self.records: list = []
        self.random_attention = False

    def forward(self, x: Tensor, *, record: bool = False) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build_body(cfg: NFMConfig, blocks: Sequence[nn.Module], channels: Sequence[int],
               layout: str = "channels_first", layer_factory: LayerFactory | None = None) -> nn.Module:
    """``blocks`` wrapped in :class:`~modwire.nn.nfm.NFM` (``cfg.enabled``) or run plainly
    (:class:`BlockSequence`). ``channels``: ``(c_0, …, c_N)``, the input's and each block's output."""
    if not cfg.enabled:
        return BlockSequence(blocks, layout)
    body = NFM(blocks, channels=channels, layout=layout, layer_factory=layer_factory, **cfg.options())
    body.random_attention = cfg.random_attention
    return body


def set_random_attention(body: nn.Module, enabled: bool) -> None:
    """The §4.4 evaluation ablation on a body from :func:`build_body` (no-op without NFM)."""
    body.random_attention = bool(enabled)
