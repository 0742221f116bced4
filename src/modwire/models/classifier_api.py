"""timm's model API on every modwire classifier, natively (no timm dependency): :class:`Classifier`.

A classifier (ViT, AiT, Neural Interpreter, NAC, Perceiver IO, PreActResNet, CNN_MLP; not the GAN
nor the causal LM, which predicts a sequence) splits its forward pass as timm's models do::

    model(x, **inputs) == model.forward_head(model.forward_features(x, **inputs), **inputs)

``forward_features`` returns the unpooled features (``num_features`` wide: a set model's final token
set after its LayerNorm ``[B, N, d]``, NAC's final processor states / Perceiver IO's latents
``[B, U, d]``, the CNNs' final feature map ``[B, C, H, W]``); ``forward_head(f, pre_logits=True)``
returns what the last linear layer reads (``head_hidden_size`` wide). ``inputs`` are the model's other
declared inputs (``task``, ``question``, ``condition``): both take all of them, each reading those it
needs (a ViT's ``task`` chooses the head; a conditional NAC's ``condition`` designs the read-out). In
training mode the split draws its random numbers (dropout, NAC's sampled kernel) in the forward's order,
so it equals the forward under the same seed (an AiT's training forward also writes its workspace
memory, AiT "Reset memory": each training call, split or not, sees the memory the last one left).

``forward_intermediates(x, indices, norm, stop_early, output_fmt, intermediates_only, return_prefix_tokens)``
is timm's contract (timm >= 1.0): ``(final features, [block outputs])``, or only the list. A "block" is each
family's layer (:meth:`Classifier.intermediate_blocks`). modwire's paper records are
``forward_record`` (the ``Records`` capability); ``forward_intermediates`` was an alias of it for one
release (issue 37) and an old call that reads a record field from the tuple gets an error saying so.

``group_matcher(coarse)`` is timm's parameter grouping by depth (what timm's layer-wise learning-rate
decay, ``param_groups_layer_decay``, reads): the stem (:attr:`Classifier.stem_modules`), then each block
with what belongs to it (:meth:`Classifier.layer_groups`), then everything else (the final norm and the
head) last. ``pretrained_cfg`` / ``default_cfg`` (what ``timm.data.resolve_data_config`` reads),
``num_classes`` (timm's 0: built without the last linear layer, :meth:`Classifier.replace_classifier`),
``reset_classifier``, ``get_classifier`` and ``no_weight_decay`` (full names, from
:class:`~modwire.models.base.PretrainedModel`) complete the API; ``create_model(name, in_chans=,
drop_rate=, global_pool=)`` maps those keywords onto config fields (:meth:`Classifier.timm_overrides`).
"""
from __future__ import annotations

import re
from typing import Any, ClassVar, Sequence

from torch import Tensor, nn

from ..nn.blocks import linear_head
from .base import PretrainedModel
from .config import ModelConfig
from ..errors import UserError, UserTypeError

__all__ = ["Classifier", "Intermediates", "take_indices"]

#: The fields of every record: reading one from forward_intermediates' tuple is an old call.
_RECORD_HINT = ("forward_intermediates follows timm's contract since issue 38 and returns (final features, "
                "[block outputs]); it was an alias of forward_record for one release: call "
                "model.forward_record(x, **inputs) for the paper's record (docs/layout.md, 'timm's model API')")


class Intermediates(tuple):
    """``(final_features, [intermediates])`` as timm returns it (a plain tuple for every use). Reading an
    attribute such as ``.logits`` or ``.states`` (what the former alias of ``forward_record`` returned)
    raises an AttributeError that names ``forward_record``, so the old call fails loudly."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"'{name}': {_RECORD_HINT}")


def take_indices(num_blocks: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's ``feature_take_indices``: ``None`` → every block; an int ``n`` → the last ``n`` blocks; a
    sequence → those blocks (negative counts from the end). Returned sorted (blocks run in order)."""
    if indices is None:
        return list(range(num_blocks))
    if isinstance(indices, int) and not isinstance(indices, bool):
        if not 0 < indices <= num_blocks:
            raise UserError(f"forward_intermediates: indices={indices} (the last n blocks) must lie in "
                            f"[1, {num_blocks}]: this model has {num_blocks} blocks")
        return list(range(num_blocks - indices, num_blocks))
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence) or not indices or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise UserTypeError(f"forward_intermediates: indices must be None, an int (the last n blocks) or a "
                            f"non-empty list of block indices, got {indices!r}")
    out = sorted({i + num_blocks if i < 0 else i for i in indices})
    if out[0] < 0 or out[-1] >= num_blocks:
        raise UserError(f"forward_intermediates: block indices must lie in [-{num_blocks}, {num_blocks}) "
                        f"(this model has {num_blocks} blocks), got {list(indices)}")
    return out


class _StopEarly(Exception):
    """Raised by the hook of the last block asked for (``stop_early=True``): the rest is not run."""


def _first_layer(module: nn.Module, prefix: str) -> str:
    """The full name of the first Conv / Linear / Embedding under ``prefix`` (registration order)."""
    root = module.get_submodule(prefix) if prefix else module
    for name, m in root.named_modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear, nn.Embedding)):
            return f"{prefix}.{name}".strip(".")
    raise UserError(f"{type(module).__name__}: no convolution, linear or embedding layer under {prefix!r}")


class Classifier(PretrainedModel):
    """timm's model API (module docstring). A family defines ``forward_features``, ``forward_head``,
    :meth:`intermediate_blocks`, :attr:`num_features`, :attr:`head_hidden_size`, the class attributes
    below and, where its head is more than ``new_task`` rebuilds, :meth:`reset_classifier`; the rest is
    shared."""

    #: The module the input enters (``pretrained_cfg["first_conv"]``: its first conv / linear / embedding).
    input_layer: ClassVar[str] = ""
    #: What the features are, for errors: ``tokens`` ([B, N, d]) or ``map`` ([B, C, H, W]).
    feature_kind: ClassVar[str] = "tokens"
    #: Whether the model reads only the input size it was built for (timm's ``fixed_input_size``).
    fixed_input_size: ClassVar[bool] = True
    #: The top-level modules and parameters before the first block: the input's embedding and what every
    #: block shares (timm's ``stem`` group, :meth:`group_matcher`); those a model lacks are skipped.
    stem_modules: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------------- what a family defines

    def forward_features(self, x: Tensor, **inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_head(self, x: Tensor, pre_logits: bool = False, **inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier for ``num_classes`` (timm's ``reset_classifier``): the family's ``new_task``
        (``modwire finetune``'s, :class:`~modwire.models.capabilities.FineTunable`), the body kept; 0: no
        classifier (:meth:`replace_classifier`). A family whose head is more than that overrides this."""
        self._check_reset(num_classes, global_pool)
        if num_classes:
            self.new_task(num_classes)
        else:
            self.replace_classifier(0)

    def replace_classifier(self, num_classes: int) -> None:
        """The last linear layer (:meth:`classifier_name`) freshly initialised for ``num_classes`` outputs
        (PyTorch's ``nn.Linear`` initialisation, on the model's device and dtype), or with 0 the identity
        (timm's ``num_classes=0``: the model returns its pre-logits features); ``config.num_classes`` follows."""
        like = next(self.parameters())
        self.set_submodule(self.classifier_name(), linear_head(self.head_hidden_size, num_classes,
                                                               device=like.device, dtype=like.dtype))
        self.config = self.config.replace(num_classes=num_classes)

    @property
    def num_features(self) -> int:
        """The channel width of ``forward_features``' output (timm's ``num_features``)."""
        raise NotImplementedError

    @property
    def head_hidden_size(self) -> int:
        """The width of ``forward_head(f, pre_logits=True)`` (timm's ``head_hidden_size``)."""
        return self.num_features

    def intermediate_blocks(self) -> list[tuple[nn.Module, int]]:
        """The blocks whose outputs ``forward_intermediates`` returns, in order, each with the number of
        times one forward pass calls it (its last call is the one returned)."""
        raise NotImplementedError

    def layer_groups(self) -> list[list[nn.Module]]:
        """The modules at each depth, in order (:meth:`group_matcher`): each block of
        :meth:`intermediate_blocks`, and in an NFM body every pass's copy of it and its NFM modules."""
        return [[m] for m, _ in self.intermediate_blocks()]

    def global_pool(self) -> str | None:
        """How the head pools the features, in timm's words (``avg``, ``token``, ``map``: attention
        pooling), or None: no pooling (the head reads every feature)."""
        return None

    def classifier_name(self) -> str:
        """The full module name of the final linear layer (``pretrained_cfg["classifier"]``)."""
        raise NotImplementedError

    def get_classifier(self) -> nn.Module:
        return self.get_submodule(self.classifier_name())

    def intermediate_norm(self, h: Tensor) -> Tensor:
        """``norm=True``: the final norm ``forward_features`` ends with (identity where there is none)."""
        return h

    #: Whether block outputs may hold tokens besides the input's (CLS, question: timm's prefix tokens).
    has_prefix_tokens: ClassVar[bool] = False

    def prefix_tokens(self, h: Tensor) -> Tensor | None:
        """The tokens of a block output ``h`` that are not the input's (``return_prefix_tokens``), or None."""
        return None

    def to_output_fmt(self, h: Tensor, output_fmt: str) -> Tensor:
        """A block output in ``output_fmt``: ``NLC`` ``[B, N, C]`` or ``NCHW`` ``[B, C, H, W]``."""
        if self.feature_kind == "map":
            if output_fmt == "NCHW":
                return h
            if output_fmt == "NLC":
                return h.flatten(2).transpose(1, 2)
        elif output_fmt == "NLC":
            return h
        raise UserError(f"forward_intermediates: output_fmt {output_fmt!r} does not apply to a "
                        f"{type(self).__name__} (its blocks output {self.feature_kind}); use "
                        f"{self.default_output_fmt()!r}")

    def default_output_fmt(self) -> str:
        return "NCHW" if self.feature_kind == "map" else "NLC"

    @classmethod
    def timm_overrides(cls, config: ModelConfig, *, in_chans: int | None = None, drop_rate: float | None = None,
                       global_pool: str | None = None) -> dict[str, Any]:
        """The config fields (nested form) that timm's ``in_chans``, ``drop_rate`` and ``global_pool`` set;
        a keyword that has no field in this family is a UserError naming what applies."""
        name = cls.__name__
        if in_chans is not None:
            raise UserError(f"create_model: in_chans does not apply to a {name} (it reads no image channels)")
        if drop_rate is not None:
            raise UserError(f"create_model: drop_rate (timm's dropout before the classifier) does not apply to a "
                            f"{name}: it has no dropout before its classifier")
        if global_pool is not None:
            raise UserError(f"create_model: global_pool does not apply to a {name} (it has no pooling choice)")
        return {}

    # ------------------------------------------------------------------------- shared

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str | None = None,
                              intermediates_only: bool = False, *, return_prefix_tokens: bool = False,
                              **inputs: Tensor) -> Any:
        """timm's contract: ``(final_features, [intermediates])``, or ``[intermediates]`` with
        ``intermediates_only``. ``indices``: None (every block), ``n`` (the last ``n``) or a list of block
        indices (negative from the end), returned in block order; ``norm``: each intermediate through the
        final norm of ``forward_features`` (identity where there is none); ``stop_early``: run the blocks
        only up to the last one asked for (the final features are then that block's output, normed);
        ``output_fmt``: ``NLC`` or ``NCHW`` (default: the family's, :meth:`default_output_fmt`); a set
        model's intermediates hold its input's tokens only, without the CLS and question tokens (timm's
        prefix tokens), which ``return_prefix_tokens`` (timm's ViT keyword) adds: ``(tokens, [B', T, d])``
        pairs. ``inputs``: the model's other inputs (``task``, ``question``, ``condition``)."""
        fmt = self.default_output_fmt() if output_fmt is None else output_fmt
        if not isinstance(return_prefix_tokens, bool):
            raise UserTypeError(f"forward_intermediates: return_prefix_tokens must be a bool, got "
                                f"{return_prefix_tokens!r}")
        if return_prefix_tokens and not self.has_prefix_tokens:
            raise UserError(f"forward_intermediates: return_prefix_tokens applies to a model with CLS or question "
                            f"tokens; a {type(self).__name__}'s blocks output {self.feature_kind} and it has none")
        blocks = self.intermediate_blocks()
        take = take_indices(len(blocks), indices)
        stop = stop_early and take[-1] < len(blocks) - 1
        outputs: dict[int, Tensor] = {}
        calls = [0] * len(blocks)

        def hook(i: int, expected: int):
            def record(module: nn.Module, args: Any, output: Any) -> None:
                calls[i] += 1
                if calls[i] == expected:                       # its last call: the output the pass keeps
                    outputs[i] = output[0] if isinstance(output, tuple) else output
                    if stop and i == take[-1]:
                        raise _StopEarly
            return record

        handles = [m.register_forward_hook(hook(i, n)) for i, (m, n) in enumerate(blocks) if i <= take[-1]]
        try:
            final = self.forward_features(x, **inputs)
        except _StopEarly:
            final = self.intermediate_norm(outputs[take[-1]])
        finally:
            for h in handles:
                h.remove()
        normed = [self.intermediate_norm(outputs[i]) if norm else outputs[i] for i in take]
        inter = [self.to_output_fmt(h, fmt) for h in normed]
        prefix = [self.prefix_tokens(h) for h in normed] if return_prefix_tokens else [None]
        if prefix[0] is not None:                                     # timm: no prefix tokens → the plain list
            inter = list(zip(inter, prefix))
        return inter if intermediates_only else Intermediates((final, inter))

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's ``group_matcher``: regular expressions on full parameter names that order the parameters
        by depth, as timm's ``group_parameters`` reads them: ``stem`` (:attr:`stem_modules`; None when the
        model has none), then ``blocks``, one ``(pattern, (i,))`` per module of :meth:`layer_groups` ``i``;
        a parameter that neither matches (the final norm, the head) comes last. ``coarse``: timm groups a
        stage's blocks together; a modwire block already is a stage or a layer, so both are the same."""
        if not isinstance(coarse, bool):
            raise UserTypeError(f"group_matcher: coarse must be a bool, got {coarse!r}")
        names = {id(m): name for name, m in self.named_modules()}
        present = {n for n, _ in self.named_children()} | {n for n, _ in self.named_parameters(recurse=False)}
        stem = [re.escape(n) for n in self.stem_modules if n in present]
        return {"stem": rf"^(?:{'|'.join(stem)})(?:\.|$)" if stem else None,
                "blocks": [(rf"^{re.escape(names[id(m)])}\.", (i,)) for i, group in enumerate(self.layer_groups())
                           for m in group]}

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's ``pretrained_cfg`` (what ``timm.data.resolve_data_config(model=...)`` reads): the
        input's per-sample shape (its config's ``example_inputs``), mean / std of the default data
        pipeline, crop, ``first_conv``, ``classifier`` (full module names), ``num_classes``."""
        c = self.config
        shape = tuple(c.example_inputs(1, device="meta")["x"].shape[1:])
        image = len(shape) == 3 and _is_image(c)
        cfg: dict[str, Any] = {
            "architecture": c.model_type, "input_size": shape, "fixed_input_size": self.fixed_input_size,
            "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center",
            "mean": (0.0,) * shape[0] if image else None, "std": (1.0,) * shape[0] if image else None,
            "num_classes": self.num_classes, "first_conv": _first_layer(self, self.input_layer),
            "classifier": self.classifier_name(),
            "notes": ("mean/std: identity; modwire's task loaders give images in [0, 1], unnormalised "
                      "(modwire.tasks); an augment pipeline's Normalize is opt-in" if image else
                      "not an image input: no mean/std, crop or interpolation applies",)}
        return cfg

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's former name of :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    def _check_reset(self, num_classes: int, global_pool: str | None) -> None:
        """``reset_classifier``'s arguments: a class count (0: none); ``global_pool`` None or the current one."""
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
            raise UserError(f"reset_classifier: num_classes must be an int >= 0 (0: no classifier, the model "
                            f"returns its pre-logits features), got {num_classes!r}")
        current = self.global_pool()
        if global_pool is not None and global_pool != current:
            raise UserError(f"reset_classifier: global_pool {global_pool!r} is not this {type(self).__name__}'s "
                            f"pooling ({current!r}); a different pooling is another model: build it with "
                            f"create_model(..., global_pool=...)")


class ReadOutClassifier(Classifier):
    """The timm API shared by NAC and Perceiver IO (a NAC module generalises a Perceiver IO latent, NAC
    App. B.2): the features are the final module states / latents ``[B, U, d]``; the head is the
    read-out (output queries attend to them: attention pooling, timm's ``map``) and its linear layer
    ``read_out.head``; a block is one propagator layer. A subclass has ``propagators``, ``new_task``
    and ``config.d_model``."""

    @property
    def num_features(self) -> int:
        return self.config.d_model

    def global_pool(self) -> str | None:
        return "map"

    def intermediate_blocks(self) -> list[tuple[nn.Module, int]]:
        return [(layer, 1) for layer in self.propagators]

    def classifier_name(self) -> str:
        return "read_out.head"

    @classmethod
    def timm_overrides(cls, config: ModelConfig, *, in_chans: int | None = None, drop_rate: float | None = None,
                       global_pool: str | None = None) -> dict[str, Any]:
        """``in_chans`` → ``tokenizer.in_channels`` (the conv tokenizer); ``global_pool``: ``map`` only (the
        read-out's attention pooling, NAC §2.1)."""
        out: dict[str, Any] = {}
        if in_chans is not None:
            if config.tokenizer.kind != "conv":
                field = "tokenizer.input_dim" if config.tokenizer.kind == "linear" else "tokenizer.vocab_size"
                raise UserError(f"create_model: in_chans sets the image channels of the conv tokenizer; this "
                                f"{cls.__name__} reads {config.tokenizer.kind!r} (tokenizer.kind): set {field}")
            out["tokenizer"] = {"in_channels": in_chans}
        if global_pool not in (None, "map"):
            raise UserError(f"create_model: global_pool {global_pool!r}: a {cls.__name__} pools by attention, its "
                            f"read-out's output queries (timm's 'map'), and has no other pooling")
        return {**out, **super().timm_overrides(config, drop_rate=drop_rate)}


def _is_image(config: ModelConfig) -> bool:
    """The first input is an image ``[C, H, W]`` (not a PGM puzzle's panels, not vectors)."""
    tok = getattr(config, "tokenizer", None)
    return tok is None or tok.kind in ("conv", "patches")

