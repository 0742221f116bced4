"""The scaffolding that the ViT and the Neural Interpreter share (NI §4.2: "the set-up with CLS
tokens and classification heads is identical to that of Neural Interpreters").

A :class:`SetModel` reads a set of vectors and answers through CLS tokens:

1. **embed** (``tokenizer`` sub-config, a :class:`~modwire.models.tokenizer_config.TokenizerConfig`
   of kind patches / linear / panels): an image → patch tokens (ViT; NI §4.2's 4×4 patches),
   a sequence of vectors → a linear map plus learned positions (NI §4.1's five scalars), or a
   PGM puzzle → one set per candidate panel (NI §4.3, :class:`~modwire.nn.PanelEncoder`);
2. **question token** (optional, ``question_dim > 0``): a question vector ``[B, 1, Q]`` (input
   ``question``) embedded by LayerNorm → Linear(Q, d) → LayerNorm and appended after the elements
   (AiT §5.8: "a question was embedded with an embedding layer that consists of a learnable
   linear projection and layer normalization before and after the linear projection. The
   question embedding was then concatenated to image patch embeddings");
3. **CLS tokens**: ``num_cls_tokens`` learned vectors appended AFTER the embedded elements (and the
   question token) (NI §2: "one or more learned vectors, called CLS Tokens"); ``0`` reads the mean
   of all outputs instead (AiT §5.1 removes the CLS token);
4. **encode**: the subclass's body (ViT blocks, or NI scripts), ``[B, N, d] → [B, N, d]``;
5. **heads**: a final LayerNorm, then one linear head per CLS token (NI §4.2: one per dataset)
   or one head shared by all (``shared_head``; NI §4.1's shared regression head).

Outputs: ``o [B, T, C]`` per CLS token. ``model(x, task=t)`` with ``t`` ``LongTensor [B]``
returns each sample's own head ``o[b, t_b]`` ``[B, C]`` (NI §4.2: "given an input sample from a
certain dataset, the respective classification head is trained"); one CLS token (or pooled):
``[B, C]``; several without ``task``: ``[B, T]`` when ``C = 1`` (NI §4.1: one regression per
function) else ``[B, T, C]``. A model with a question token takes ``model(x, question=q)``
(``q [B, 1, Q]``). A PGM model scores each candidate's set with one number and
returns ``[B, K]`` logits over the ``K`` candidates.

Fine-tuning protocol (``modwire finetune``): :meth:`SetModel.parameter_sets` names parameter
subsets (NI Table 1, Fig. 5b); :meth:`SetModel.new_task` gives a new task fresh CLS tokens, and
fresh heads unless the model's shared head fits the task (NI §4.1: the new CLS tokens feed the
pre-trained shared regression head, and Table 1's "Finetuning CLS Tokens" trains the tokens alone).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..nn.init import trunc_normal_
from ..nn.tokenizers import NormLinearNorm
from ..nn.checks import check_float, check_tensor, min_max, values_checkable
from .base import Record
from .classifier_api import Classifier
from .config import CLASSES, COUNT, Bounds, ModelConfig, example_generator
from .inputs import Inputs, named_inputs
from .tokenizer_config import EMBEDDINGS, TokenizerConfig, build_tokenizer
from ..errors import UserError

@dataclass
class SetModelConfig(ModelConfig):
    """Fields every set model (ViT, NI, AiT) shares. ``num_classes``: width of one head;
    ``num_cls_tokens``: CLS tokens (0: mean-pooled output); ``shared_head``: one head for every
    CLS token; ``task_input``: the model takes ``task`` ids choosing each sample's head;
    ``question_dim``: width ``Q`` of a ``question`` input embedded as one token (AiT §5.8; 0: none);
    ``head_pretrained``: the shared head is the pre-trained one that ``new_task`` kept (set by it and
    saved with the model, so that ``cls`` still names the CLS tokens alone after a reload)."""

    num_classes: int = 10
    d_model: int = 192
    num_cls_tokens: int = 1
    shared_head: bool = False
    task_input: bool = False
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="patches"))
    question_dim: int = 0
    head_pretrained: bool = False

    bounds = {"num_classes": CLASSES, "d_model": COUNT, "num_cls_tokens": Bounds(lo=0, note="0: mean-pooled output"),
              "question_dim": Bounds(lo=0, note="0: no question input")}
    choices = {"tokenizer.kind": EMBEDDINGS}
    # ``tokenizer`` was ``embed`` (NAC's and Perceiver IO's name for the same TokenizerConfig won; the
    # module keeps its name, ``embed``, so the weights' names are unchanged): config.ConfigBase.renamed.
    renamed = {"embed": "tokenizer"}

    def validate(self) -> None:
        if self.head_pretrained and not self.shared_head:
            raise UserError("config field 'head_pretrained': only a shared head (shared_head=true) is kept by "
                            "new_task, got shared_head=false")
        if self.task_input and self.num_cls_tokens < 2:
            raise UserError(f"config field 'task_input': choosing a head per sample needs num_cls_tokens >= 2, "
                            f"got {self.num_cls_tokens}")
        if self.tokenizer.kind == "panels" and self.num_classes != 1:
            raise UserError(f"config field 'num_classes': a PGM (panels) model scores each candidate with one "
                            f"number (num_classes=1), got {self.num_classes}")
        if self.tokenizer.kind == "panels" and self.question_dim:
            raise UserError(f"config field 'question_dim': a PGM (panels) model reads no question, got "
                            f"{self.question_dim} (expected 0)")

    def input_overrides(self, inputs: Inputs, num_classes: int, heads: int = 1) -> dict[str, Any]:
        """Images → patches (or the preset's PGM ``panels``), vectors → a linear map with learned
        positions for an ordered sequence; ``heads`` CLS tokens; a ``task`` index input chooses
        each sample's head (NI §4.2); a ``question`` (one vector ``[1, Q]``) becomes the question
        token (``question_dim = Q``, AiT §5.8; without one, ``question_dim = 0``)."""
        named = named_inputs(inputs)
        if "x" not in named or set(named) - {"x", "task", "question"}:
            raise UserError(f"a {self.model_type!r} model reads an input 'x', optionally a 'task' index (which "
                            f"CLS token's head answers, NI §4.2) and a 'question' vector (AiT §5.8); the task "
                            f"gives {sorted(named)}")
        out: dict[str, Any] = {"tokenizer": _embed_for(named["x"], self.tokenizer), "num_classes": num_classes,
                               "question_dim": _question_dim(named.get("question"))}
        if self.tokenizer.kind == "panels":      # one score per candidate set; the task counts candidates
            out["num_classes"] = 1
        task = named.get("task")
        if task is not None:
            if task.kind != "index" or task.vocab_size != heads:
                raise UserError(f"the 'task' input must be an index over the task's {heads} heads, got {task!r}")
            out["task_input"] = True
        if heads > 1 or task is not None:
            out["num_cls_tokens"] = heads
        return out

    def input_names(self) -> tuple[str, ...]:
        return ("x",) + ("task",) * self.task_input + ("question",) * bool(self.question_dim)

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        x = {"x": self.tokenizer.example_input(batch, device=device, seed=seed)}
        if self.task_input:                        # NI App. C.1: which CLS token's head scores each sample
            x["task"] = torch.arange(batch, device=device) % self.num_cls_tokens
        if self.question_dim:                      # AiT §5.8's question token
            x["question"] = torch.randn(batch, 1, self.question_dim, generator=example_generator(device, seed + 1),
                                        device=device)
        return x

    def output_shape(self, inputs: dict[str, Any]) -> tuple[int, ...]:
        """``[B, candidates]`` for PGM panels, ``[B, T]`` / ``[B, T, C]`` for ``T > 1`` CLS tokens without
        ``task`` ids (NI §4.1), else ``[B, num_classes]``."""
        b, e = len(inputs["x"]), self.tokenizer
        if e.kind == "panels":
            return (b, e.in_channels - e.num_context)
        if self.num_cls_tokens > 1 and not self.task_input:
            return (b, self.num_cls_tokens) if self.num_classes == 1 else (b, self.num_cls_tokens, self.num_classes)
        return (b, self.num_classes)


def _question_dim(spec) -> int:
    """``Q`` of a ``question`` input ``InputSpec.vectors(1, Q)``; 0 without one."""
    if spec is None:
        return 0
    if spec.kind != "vectors" or spec.length != 1 or spec.padded:
        raise UserError(f"the 'question' input must be one vector per sample, InputSpec.vectors(1, Q) "
                        f"(AiT §5.8), got {spec!r}")
    return spec.dim


def _embed_for(spec, current: TokenizerConfig) -> dict[str, Any]:
    """The ``tokenizer`` fields that read ``spec``: images → patches (or the preset's PGM panels),
    vectors → a linear map (:meth:`TokenizerConfig.for_input`)."""
    if spec.kind not in ("image", "vectors"):
        raise UserError(f"a set model reads images or vectors as 'x', got {spec!r}")
    return TokenizerConfig.for_input(spec, image="panels" if current.kind == "panels" else "patches")


class QuestionEmbedding(NormLinearNorm):
    """AiT §5.8's question embedding: LayerNorm(Q) → Linear(Q, d) → LayerNorm(d)
    (:class:`~modwire.nn.tokenizers.NormLinearNorm`, also the AiT authors' patch embedding).
    ``question [B, 1, Q]`` (or ``[B, Q]``) → one token ``[B, 1, d]``."""

    def forward(self, question: Tensor, batch: int) -> Tensor:
        q = self.proj.in_features
        layout = f"[B={batch}, 1, {q}] (or [B, {q}]): one question vector per sample"
        check_tensor(question, "question", layout)
        if question.dim() == 2:
            question = question[:, None]
        if tuple(question.shape) != (batch, 1, q):
            raise UserError(f"question: expected {layout}, got {list(question.shape)}")
        check_float(question, "question", layout, self.proj.weight)
        return super().forward(question)


class TokenHeads(nn.Module):
    """One linear head per CLS token, batched (``weight [T, C, d]``), or one shared (``[1, C, d]``).
    ``[B, T, d] → [B, T, C]``."""

    def __init__(self, num_tokens: int, dim: int, num_classes: int, *, shared: bool) -> None:
        super().__init__()
        n = 1 if shared else num_tokens
        bound = 1 / math.sqrt(dim)   # nn.Linear's default initialisation
        self.weight = nn.Parameter(torch.empty(n, num_classes, dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n, num_classes).uniform_(-bound, bound))

    def forward(self, y: Tensor) -> Tensor:
        return torch.einsum("btd,tcd->btc", y, self.weight.expand(y.shape[1], -1, -1)) + self.bias


@dataclass
class SetModelRecord(Record):
    """A set model's forward pass (the ViT's record; the Neural Interpreter's and the AiT's add their own
    fields: :class:`~modwire.models.neural_interpreter.NIRecord`, :class:`~modwire.models.ait.AiTRecord`).
    For a batch of ``B``: ``logits`` (shapes: module docstring), ``states`` the final set ``[B, N, d]``
    (after the final LayerNorm), ``propagator_attention`` one ``[B, (U,) H, N, N]`` per attention layer
    (the ViT's / AiT's blocks ``[B, H, N, N]``; NI's LOCs ``[B, U, H, N, N]``)."""

    propagator_attention: list[Tensor] = field(default_factory=list)


class SetModel(Classifier):
    """Embed → CLS tokens → :meth:`encode` (the subclass) → LayerNorm → heads (module docstring).

    timm's API (:mod:`modwire.models.classifier_api`): ``forward_features`` is the final token set after
    the LayerNorm ``[B', N, d]`` (``B' = B·K`` for PGM panels: one set per candidate); ``forward_head``
    reads the CLS tokens (timm's ``global_pool="token"``) or the mean of the tokens (``"avg"``, no CLS
    token), then the heads; ``pre_logits`` gives ``[B, d]`` (one head, or each sample's ``task`` head),
    ``[B, T, d]`` (``T`` CLS tokens without ``task``) or ``[B, K, d]`` (PGM candidates). A block is one
    layer of the body (:meth:`intermediate_blocks`), its output the token set ``[B', N, d]``."""

    config_class: ClassVar[type[SetModelConfig]]
    record_type: ClassVar[type[SetModelRecord]] = SetModelRecord
    input_layer = "embed"
    stem_modules = ("embed", "cls_tokens", "question", "relative")   # "relative": the ViT's shared position bias

    def __init__(self, config: SetModelConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = build_tokenizer(c.tokenizer, c.d_model)
        self.question = QuestionEmbedding(c.question_dim, c.d_model) if c.question_dim else None
        self._build_outputs()
        self.norm = nn.LayerNorm(c.d_model)

    @property
    def num_classes(self) -> int:
        """The width of the logits: a head's classes, or a PGM model's candidates (one score each)."""
        e = self.config.tokenizer
        return e.in_channels - e.num_context if e.kind == "panels" else self.config.num_classes

    def _build_outputs(self) -> None:
        c, t = self.config, max(self.config.num_cls_tokens, 1)
        self._build_cls_tokens()
        self.heads = TokenHeads(t, c.d_model, c.num_classes, shared=c.shared_head) if c.num_classes else nn.Identity()

    def _build_cls_tokens(self) -> None:
        c = self.config
        self.cls_tokens = nn.Parameter(trunc_normal_(torch.empty(c.num_cls_tokens, c.d_model), std=0.02)) \
            if c.num_cls_tokens else None

    # ------------------------------------------------------------------------- the subclass's part

    def encode(self, x: Tensor, *, record: bool, **options: Any) -> tuple[Tensor, dict[str, Any]]:
        """``[B, N, d] → ([B, N, d], the fields of its record_type beyond SetModelRecord's base)``: the model
        body; ``options``: the body's own (NI's ``iterations``), from the subclass's ``forward``."""
        raise NotImplementedError

    # ------------------------------------------------------------------------- forward

    def forward(self, x: Tensor, task: Tensor | None = None, question: Tensor | None = None) -> Tensor:
        return self._run(x, task, question, record=False).logits

    def forward_record(self, x: Tensor, *, task: Tensor | None = None,
                       question: Tensor | None = None) -> SetModelRecord:
        """Logits plus what :meth:`encode` recorded (attention weights; NI: ``C`` and types; AiT: the workspace)."""
        return self._run(x, task, question, record=True)

    def forward_features(self, x: Tensor, task: Tensor | None = None, question: Tensor | None = None) -> Tensor:
        """The final token set after the LayerNorm ``[B', N, d]`` (``task`` is read by ``forward_head``)."""
        return self._features(x, question, record=False)[0]

    def forward_head(self, x: Tensor, pre_logits: bool = False, task: Tensor | None = None,
                     question: Tensor | None = None) -> Tensor:
        """Features ``[B', N, d]`` → logits (module docstring), or with ``pre_logits`` what the heads read."""
        e = self.config.tokenizer
        batch = len(x) // (e.in_channels - e.num_context) if e.kind == "panels" else len(x)
        return self._head(x, task, batch, pre_logits=pre_logits)

    def _run(self, x: Tensor, task: Tensor | None, question: Tensor | None = None, *, record: bool,
             **options: Any) -> SetModelRecord:
        y, extra = self._features(x, question, record=record, **options)
        return self.record_type(self._head(y, task, len(x)), y, **extra)

    def _features(self, x: Tensor, question: Tensor | None, *, record: bool,
                  **options: Any) -> tuple[Tensor, dict[str, Any]]:
        """Embed, append the question and CLS tokens, :meth:`encode`, LayerNorm: ``([B', N, d], record fields)``."""
        tokens = self.embed(x)                                              # [B', N, d]; x checked
        b = tokens.shape[0]
        if (self.question is None) != (question is None):
            raise UserError(f"this model {'takes no' if self.question is None else 'needs a'} 'question' input "
                            f"(config question_dim={self.config.question_dim})")
        if self.question is not None:                                       # AiT §5.8: after the patches
            tokens = torch.cat([tokens, self.question(question, b).to(tokens.dtype)], dim=1)   # [B, N + 1, d]
        if self.cls_tokens is not None:                                     # appended after the elements
            tokens = torch.cat([tokens, self.cls_tokens.expand(b, -1, -1)], dim=1)
        y, extra = self.encode(tokens, record=record, **options)
        return self.norm(y), extra

    def _head(self, y: Tensor, task: Tensor | None, batch: int, *, pre_logits: bool = False) -> Tensor:
        """Final states ``[B', N, d]`` → logits, or what the heads read (``pre_logits``)."""
        read = self._read(y)                                                # [B', T, d]
        if pre_logits:
            return self._select(self._pre_logits(read), task, batch, features=True)
        return self._select(self.heads(read), task, batch)

    def _pre_logits(self, read: Tensor) -> Tensor:
        """What the heads' linear map reads from ``read [B', T, d]`` (the ViT's flattened classifier: its norm)."""
        return read

    def _read(self, y: Tensor) -> Tensor:
        """What the heads read from the final states ``y [B', N, d]``: the CLS tokens ``[B', T, d]``,
        or the mean of the outputs ``[B', 1, d]``."""
        t = self.config.num_cls_tokens
        return y[:, -t:] if t else y.mean(dim=1, keepdim=True)

    def _select(self, out: Tensor, task: Tensor | None, batch: int, *, features: bool = False) -> Tensor:
        """``out [B', T, C]`` → the logits the module docstring describes (``features``: ``out [B', T, F]``
        pre-logits, never squeezed over ``F``)."""
        if self.config.tokenizer.kind == "panels":                             # one score per candidate set
            return out.reshape(batch, -1, out.shape[-1]) if features else out.reshape(batch, -1)   # [B, K(, F)]
        if self.config.task_input != (task is not None):
            raise UserError(f"this model {'needs' if self.config.task_input else 'takes no'} 'task' ids "
                            f"(config task_input={self.config.task_input})")
        if task is not None:
            return out[torch.arange(batch, device=out.device), self._check_task(task, batch)]
        if out.shape[1] == 1:
            return out[:, 0]
        return out if features or out.shape[-1] != 1 else out[..., 0]

    def _check_task(self, task: Tensor, batch: int) -> Tensor:
        t = self.config.num_cls_tokens
        check_tensor(task, "task", f"ids [B] in [0, {t})")
        if task.shape != (batch,) or task.is_floating_point() or task.dtype == torch.bool:
            raise UserError(f"task: expected integer ids [B={batch}] in [0, {t}), got {task.dtype} "
                             f"{list(task.shape)}")
        if values_checkable(task):       # one reduction, one device-to-host copy per forward
            lo, hi = min_max(task)
            if lo < 0 or hi >= t:
                raise UserError(f"task: ids must lie in [0, {t}) (one per CLS token), got {lo}..{hi}")
        return task.long()

    # ------------------------------------------------------------------------- fine-tuning protocol

    def parameter_sets(self) -> dict[str, tuple[str, ...]]:
        """Named parameter subsets (prefixes of parameter names) for ``modwire finetune``:
        ``cls``: the CLS tokens, and the heads unless they are the pre-trained shared head that
        :meth:`new_task` kept (NI Table 1 "Finetuning CLS Tokens": "the CLS tokens are the only
        trainable parameters"); ``heads``: the heads (``cls,heads`` also trains a kept shared head,
        a departure from Table 1); ``all``."""
        cls = ("cls_tokens",) if self.config.head_pretrained else ("cls_tokens", "heads.")
        return {"cls": cls, "heads": ("heads.",), "all": ("",)}

    def new_task(self, num_classes: int, heads: int = 1) -> None:
        """New task outputs (NI §4.1: "we always instantiate and train 10 new CLS tokens"; §4.2:
        K-MNIST), on the model's device and dtype; the config follows. Fresh CLS tokens always;
        fresh heads, except that a shared head (``shared_head``) of the same width is kept: it is
        the pre-trained regression head every CLS token feeds (NI §4.1), and ``cls`` then names the
        CLS tokens alone (:meth:`parameter_sets`)."""
        c = self.config
        cls = 0 if c.num_cls_tokens == 0 and heads == 1 else heads
        keep = c.shared_head and num_classes == c.num_classes
        self.config = c.replace(num_classes=num_classes, num_cls_tokens=cls,
                                task_input=c.task_input and heads > 1, head_pretrained=keep)
        like = self.norm.weight
        if keep:
            self._build_cls_tokens()
        else:
            self._build_outputs()
        if self.cls_tokens is not None:
            self.cls_tokens.data = self.cls_tokens.data.to(like)
        self.heads.to(like)

    # ------------------------------------------------------------------------- timm's API (classifier_api)

    @property
    def num_features(self) -> int:
        return self.config.d_model

    def global_pool(self) -> str | None:
        return "token" if self.config.num_cls_tokens else "avg"

    def classifier_name(self) -> str:
        return "heads"

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New heads for ``num_classes`` (timm's ``reset_classifier``): the CLS tokens and the body are kept
        (:meth:`new_task` also draws fresh CLS tokens); a PGM model's width is its candidates (refused)."""
        self._check_reset(num_classes, global_pool)
        c = self.config
        if c.tokenizer.kind == "panels":
            raise UserError("reset_classifier: a PGM (panels) model scores each candidate with one number; its "
                            "logits are as wide as the puzzle's candidates, not a class count")
        if not num_classes:                                                  # timm's num_classes=0
            self.replace_classifier(0)
        else:
            self.config = c.replace(num_classes=num_classes)
            self.heads = TokenHeads(max(c.num_cls_tokens, 1), c.d_model, num_classes,
                                    shared=c.shared_head).to(next(self.parameters()))
        self.config = self.config.replace(head_pretrained=False)

    def intermediate_norm(self, h: Tensor) -> Tensor:
        return self.norm(h)

    has_prefix_tokens = True

    def _extra_tokens(self) -> int:
        """The question and CLS tokens after the input's tokens (:meth:`_features`)."""
        return (self.question is not None) + (0 if self.cls_tokens is None else len(self.cls_tokens))

    def prefix_tokens(self, h: Tensor) -> Tensor | None:
        """The question and CLS tokens of ``h [B', N, d]`` (timm's prefix tokens; here after the input's), or None."""
        extra = self._extra_tokens()
        return h[:, h.shape[1] - extra:] if extra else None

    def to_output_fmt(self, h: Tensor, output_fmt: str) -> Tensor:
        """The input's tokens only (timm's ViT: the prefix tokens split off, :meth:`prefix_tokens`): ``NLC``
        ``[B', N, d]``; ``NCHW`` (patch tokens): their grid ``[B, d, rows, cols]``."""
        h = h[:, :h.shape[1] - self._extra_tokens()]
        grid = self.config.tokenizer.grid
        if output_fmt != "NCHW" or grid is None:
            return super().to_output_fmt(h, output_fmt)
        rows, cols = grid
        return h.transpose(1, 2).reshape(len(h), -1, rows, cols)

    def default_output_fmt(self) -> str:
        """timm's ViT default, ``NCHW``, where the tokens are an image's patches; else ``NLC``."""
        return "NLC" if self.config.tokenizer.grid is None else "NCHW"

    @classmethod
    def timm_overrides(cls, config: SetModelConfig, *, in_chans: int | None = None, drop_rate: float | None = None,
                       global_pool: str | None = None) -> dict[str, Any]:
        """``in_chans`` → ``tokenizer.in_channels`` (patch embeddings); ``global_pool``: ``token`` (one CLS
        token unless there are some) or ``avg`` (no CLS token: the mean of the tokens); no ``drop_rate``."""
        out: dict[str, Any] = {}
        if in_chans is not None:
            kind = config.tokenizer.kind
            if kind != "patches":
                field = "tokenizer.in_channels (the panels)" if kind == "panels" else "tokenizer.input_dim"
                raise UserError(f"create_model: in_chans sets the image channels of a patch embedding; this "
                                f"{cls.__name__} reads {kind!r} (tokenizer.kind): set {field}")
            out["tokenizer"] = {"in_channels": in_chans}
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise UserError(f"create_model: global_pool {global_pool!r}: a {cls.__name__} reads its CLS tokens "
                                f"('token') or the mean of its tokens ('avg')")
            out["num_cls_tokens"] = 0 if global_pool == "avg" else max(config.num_cls_tokens, 1)
        out.update(super().timm_overrides(config, drop_rate=drop_rate))
        return out

    # Learned tokens and positions: the CLS tokens, the embedding's positions and PGM slots, the relative
    # position modules (their tables and maps)
    decay_exempt = ("cls_tokens", "embed.pos", "embed.slots", "relative")
