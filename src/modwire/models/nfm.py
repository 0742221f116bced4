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

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from torch import Tensor, nn

from ..nn.nfm import (READER_ACTIVATIONS, LAYOUTS, NFM, NFMRecord, NORMS, READ_AT, READER_OUTPUTS, RESCALES, SCORE_SCALES, TOPK_SOFTMAX,
                      LayerFactory)
from ..nn.blocks import run_block
from .base import PretrainedModel, Record
from .config import COUNT, Bounds, ConfigBase, check_choice
from ..errors import UserError

__all__ = ["NFMConfig", "NFMModelRecord", "BlockSequence", "body_blocks", "body_layer_groups", "build_body", "load_base_weights"]


@dataclass
class NFMModelRecord(Record):
    """The forward pass of a model whose blocks can run in NFM (the LM, PreActResNet, CNN_MLP): its
    ``logits``, its final ``states`` (LM ``[B, T, d]``; PreActResNet the pooled features ``[B, c_N]``;
    CNN_MLP the final conv state ``[B, C, s, s]``) and ``nfm``, one :class:`~modwire.nn.nfm.NFMRecord`
    per reader (which layers and passes it read, NFM Alg. 1; empty without NFM)."""

    nfm: list[NFMRecord] = field(default_factory=list)


@dataclass
class NFMConfig(ConfigBase):
    """The NFM hyperparameters (NFM §3.2, §4; defaults: the classifiers' and relational CNN's
    two passes, ``k = 5``, ``d_k = d_v = 16``, 4 heads, ReLU with BatchNorm before it).

    ``enabled``: False gives the base network (no reader, no extra parameter). ``ffn_hidden``:
    width of ``W_o1`` (0: the query state's channels). ``rescale``: ``space_to_depth`` (§3.2.2) or
    ``nearest`` (§4.7 ablation). ``score_scale``: ``d_k`` (the printed ``QKᵀ/d_k``) or
    ``sqrt_d_k`` (the authors' code). ``topk_softmax``: ``kept`` (§3.2.1's text: a softmax over the
    top-k scores) or ``subtract`` (the authors' code, Ke et al. 2018: the softmax minus its (k+1)-th
    weight, clipped at 0, renormalised). ``reader_output``: ``linear`` (§3.2.1: linear, activation,
    linear) or ``conv3x3`` (the authors' two 3×3 convolutions; 2-D states). ``read_at``: ``before``
    (NFM Alg. 1: a read before every block of every pass) or ``after_last_pass`` (the authors'
    Sort-of-CLEVR code: only the last pass reads, after each block). ``output_bias``: ``W_o2``'s bias
    (False where every path from a read starts with a BatchNorm, which would cancel it: the
    PreActResNet and GAN integrations). ``share_blocks``: every pass
    reuses the first pass's blocks (default False: Alg. 1's per-pass ``f_{θ_k}``).
    ``random_attention``: evaluation ablation of §4.4 (scores drawn from N(0, 1)); refused in
    training."""

    enabled: bool = False
    k: int = 5
    passes: int = 2
    d_k: int = 16
    d_v: int = 16
    num_heads: int = 4
    ffn_hidden: int = 0
    norm: str = "batch"
    activation: str = "relu"
    rescale: str = "space_to_depth"
    score_scale: str = "d_k"
    topk_softmax: str = "kept"
    reader_output: str = "linear"
    output_bias: bool = True
    read_at: str = "before"
    share_blocks: bool = False
    random_attention: bool = False

    bounds = {"k": COUNT, "passes": COUNT, "d_k": COUNT, "d_v": COUNT, "num_heads": COUNT,
              "ffn_hidden": Bounds(lo=0, note="0: the query state's channels")}
    choices = {"norm": NORMS, "activation": tuple(READER_ACTIVATIONS), "rescale": RESCALES,
               "score_scale": SCORE_SCALES, "topk_softmax": TOPK_SOFTMAX, "reader_output": READER_OUTPUTS,
               "read_at": READ_AT}
    # The names of every other model config's head count and FFN width (issue 37): config.ConfigBase.renamed.
    renamed = {"heads": "num_heads", "hidden": "ffn_hidden"}

    def unused_fields(self) -> tuple[str, ...]:
        return () if self.enabled else tuple(n for n in self.bounds)

    def validate(self) -> None:
        if self.random_attention and not self.enabled:
            raise UserError(f"config field '{self._prefix}random_attention': NFM §4.4's random-attention "
                            f"evaluation needs NFM readers, and this model has none ({self._prefix}enabled is false)")

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~modwire.nn.nfm.NFM`."""
        return dict(k=self.k, passes=self.passes, d_k=self.d_k, d_v=self.d_v, num_heads=self.num_heads,
                    ffn_hidden=self.ffn_hidden,
                    norm=self.norm, activation=self.activation, rescale=self.rescale,
                    score_scale=self.score_scale, topk_softmax=self.topk_softmax, reader_output=self.reader_output,
                    output_bias=self.output_bias, read_at=self.read_at, share_blocks=self.share_blocks)


class BlockSequence(nn.Module):
    """The base network's body: ``blocks`` run once, in order (``nfm.enabled = False``). Same
    interface as :class:`~modwire.nn.nfm.NFM` (``forward(x, record=False)``, ``records``,
    ``random_attention``) and the same parameter names for the blocks (``blocks.<i>.…``), so a
    base network's weights load into its NFM version, every pass (:func:`load_base_weights`)."""

    passes = 1
    gammas: list = []              # no reader, no gate
    grad_checkpointing: bool = False   # each block recomputed in the backward (nn.blocks.run_block)

    def __init__(self, blocks: Sequence[nn.Module], layout: str = "channels_first") -> None:
        super().__init__()
        check_choice("layout", layout, LAYOUTS)
        self.blocks = nn.ModuleList(blocks)
        self.records: list = []
        self.random_attention = False

    def forward(self, x: Tensor, *, record: bool = False) -> Tensor:
        for block in self.blocks:
            x = run_block(self.grad_checkpointing, block, x)
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


def body_blocks(body: nn.Module) -> list[tuple[nn.Module, int]]:
    """The blocks of a body from :func:`build_body` whose outputs make the network's output: the last
    pass's (NFM Alg. 1), each with the number of times one forward calls it (every pass, when they share
    blocks). timm's ``forward_intermediates`` blocks (:mod:`modwire.models.classifier_api`)."""
    if isinstance(body, BlockSequence):
        return [(b, 1) for b in body.blocks]
    last, calls = body.passes - 1, body.passes if body.share_blocks else 1
    return [(body.block(last, i), calls) for i in range(body.num_blocks)]


def body_layer_groups(body: nn.Module) -> list[list[nn.Module]]:
    """The modules at each depth ``i`` of a body from :func:`build_body`: block ``i`` of every pass (one
    module when the passes share blocks) and the NFM modules ``(k, i)`` of every pass (Alg. 1's reader
    before block ``i``, or after it with ``read_at="after_last_pass"``). timm's ``group_matcher``."""
    if isinstance(body, BlockSequence):
        return [[b] for b in body.blocks]
    n = body.num_blocks
    return [[body.blocks[i], *[copy[i] for copy in body.pass_blocks], *body.readers[i::n]] for i in range(n)]


def set_random_attention(body: nn.Module, enabled: bool) -> None:
    """The §4.4 evaluation ablation on a body from :func:`build_body` (no-op without NFM)."""
    body.random_attention = bool(enabled)


def load_base_weights(model: nn.Module, state: Mapping[str, Tensor]) -> list[str]:
    """Load a base network's weights (``state``: the state dict of the same model with
    ``nfm.enabled = False``) into its NFM version ``model``: every pass of the body starts from the
    base's blocks (implementation notes §3; :func:`modwire.nn.nfm._fill_pass_copies`), so with
    ``γ = 0`` the NFM model computes the base network exactly. Returns the NFM-only entries left
    at their initialisation (the readers'); a base entry the model lacks or holds with another
    shape, or a missing entry that is not a reader's (e.g. another ``stem_layers`` split), is a
    ValueError (checked before anything is loaded)."""
    state = dict(state)
    if isinstance(model, PretrainedModel):
        model.prepare_state_dict(state)       # e.g. an LM saved under its blocks' former names
    own = model.state_dict()
    unexpected = sorted(k for k in state if k not in own or own[k].shape != state[k].shape)
    loaded = {k for k in state} | {k for k in own if _pass_copy_of(k) in state}
    foreign = sorted(k for k in own if k not in loaded and ".readers." not in f".{k}")
    if unexpected or foreign:
        raise UserError(f"load_base_weights: the base weights do not fit this NFM model: unexpected or of another "
                        f"shape {unexpected[:5]}, missing (not NFM readers) {foreign[:5]}")
    return list(model.load_state_dict(state, strict=False).missing_keys)


def _pass_copy_of(key: str) -> str:
    """``….pass_blocks.<p>.<rest>`` → ``….blocks.<rest>`` (the first pass's entry it is filled from)."""
    head, sep, tail = key.partition("pass_blocks.")
    return f"{head}blocks.{tail.partition('.')[2]}" if sep else ""
