"""Neural Attentive Circuits (NAC) — NAC §2, App. B, C, G.

Read top to bottom like the paper's method section:

1. **Circuit generator** (§2.2): produces the circuit design — for every module ``u`` a
   signature ``s_u`` (who talks to whom), a code ``c_u`` (what it computes) and an initial
   state ``θ_u⁰``. *Unconditional*: free parameters, ``θ⁰ = MLP(c)``, shared by every
   sample. *Conditional* (App. G): learned queries, one per module, cross-attend to a
   conditioning input (e.g. a question), then an FFN, a self-attention layer and two
   parallel FFNs emit each module's signature and code, per sample.
2. **Circuit executor** (§2.1), given the design and the input:
   tokenizer → read-in (Eq. 4-5) → ``L`` propagators (SKMDPA, Eq. 2-3, then ModFFN; a fresh
   kernel sample per layer and example in training) → read-out (output modules attend to the
   final states, ModFFN, confidence-weighted logits: a plain softmax over the confidences).

Where the paper is silent the defaults are the authors' final configs (docs/nac.md, "Choices and
departures"): every attention head ``head_dim`` = 64 wide, one read-out head, no LayerNorm before
the read-out pooling. With ``initial_state="code"``, ``read_in_codes="separate"`` and
``qv_bias=False`` the model is theirs (tested against a literal re-statement of their code with
their weights, ``tests/reference/authors_nac.py``).

A ``graph_prior`` (NAC §2.2, App. A Eq. 6-9) makes a training-mode forward compute the graph
structure regularizer ``L_graph(P, P0)`` on the link probabilities, reported as the auxiliary
loss ``"graph"`` (``auxiliary_losses()``; its weight is the training config's
``aux_loss_weights.graph``). ``frozen_graph`` fixes the signatures to a sampled graph (Table 1). Inference-time
sparsification (App. F) is installed from outside by ``modwire.analysis`` through
``propagator_kernel``; nothing else in this file knows about it.

With the modulation (``modulation="none"``) and the kernel (``kernel.enabled=False``) off,
one output module, ``initial_state="code"`` and ``qv_bias=False``, NAC is a Perceiver IO
(App. B.2; tested).

Attention runs on SDPA's fused kernels (4-D, :func:`~modwire.nn.attention.fused_attention`), except
a training step on the CPU: Eq. 3's ``log K̂`` is an additive bias that needs a gradient (it depends
on the signatures), which the CPU's fused kernel cannot give, so that step takes SDPA's math path.
``attention_backend="flex"`` runs every attention on FlexAttention instead (:mod:`modwire.nn.flex`:
``log K̂`` as a ``score_mod``, with its gradient, the kernel's and the padding masks as block masks),
the same maths: a speed option for GPUs (on the CPU, training still takes SDPA's math path).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..nn import (EdgeMaskedKernel, ModulationSpec, PreNorm, ReadIn, ReadOut, SelfAttention, SignatureKernel,
                  TransformerBlock, mlp)
from ..nn.attention import ATTENTION_BACKENDS, ReadInMethod
from ..nn.kernel import KERNEL_MODES
from ..nn.modulated import FFN_ACTIVATIONS, MODULATIONS
from ..nn.tokenizers import padding_mask
from .axis import ModuleAxis
from .classifier_api import ReadOutClassifier
from .config import (CLASSES, COUNT, POSITIVE, Bounds, ConfigBase, ModelConfig, check_choice, check_head_split,
                     check_single_head)
from .finetune_protocol import ReadOutHeadFineTuning
from .inputs import Inputs, named_inputs
from .perceiver_io import PerceiverIORecord
from .registry import register_model_type, register_preset
from .tokenizer_config import CONV_BEFORE_ISSUE_35, TOKENIZERS, TokenizerConfig, build_tokenizer
from ..errors import UserError


# ----------------------------------------------------------------------------- configuration

@dataclass
class KernelConfig(ConfigBase):
    """SKMDPA's signature kernel (NAC Eq. 2-3); defaults are Table 4."""

    enabled: bool = True               # False: all-to-all attention (Table 1 "+ ModFC")
    tau: float = 0.5                   # Concrete temperature τ
    epsilon: float = 1.0               # bandwidth ε
    learn_epsilon: bool = False        # ε is a hyperparameter in the paper
    delta: float = 1e-6                # δ of Eq. 3
    train_mode: str = "sample"         # sample | expected | threshold
    eval_mode: str = "expected"
    truncation: float | None = None    # keep pairs with d(s_i, s_j) ≤ truncation

    # τ → 0 and ε → 0 divide by zero (Eq. 2); δ = 0 lets an all-zero row divide by zero (Eq. 3);
    # truncation = 0 keeps only pairs at distance 0, i.e. no edges between distinct modules.
    bounds = {"tau": POSITIVE, "epsilon": POSITIVE, "delta": POSITIVE, "truncation": POSITIVE}
    choices = {"train_mode": KERNEL_MODES, "eval_mode": KERNEL_MODES}


@dataclass
class FrozenGraphConfig(ConfigBase):
    """Table 1 "+ Sparse graph (not learnable)": processor signatures fitted to one graph
    sampled from prior ``name`` (``modwire.graphs``), then frozen. ``name=None``: learned."""

    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    bounds = {"seed": Bounds(lo=0, note="numpy seeds are non-negative")}


@dataclass
class GraphPriorConfig(ConfigBase):
    """The graph structure regularizer (NAC §2.2, App. A Eq. 6-9; ``modwire.graphs.GraphRegularizer``):
    in training, the NAC reports ``L_graph(P, P0)`` of its link probabilities ``P`` (Eq. 2) against
    prior ``name`` (Eq. 7-8) as the auxiliary loss ``"graph"``. ``name=None``: no prior."""

    name: str | None = None            # erdos_renyi | scale_free | planted_partition | ring_of_cliques
    params: dict[str, Any] = field(default_factory=dict)   # graphon parameters, e.g. {beta: 0.5}
    loss: str = "mse"                  # mse (Eq. 6) | kl
    reduction: str = "sum"             # sum over i≠j (Eq. 6) | mean
    align: str = "none"                # none (the paper's Eq. 6, 9) | degree (relabelling-invariant)

    def validate(self) -> None:
        if self.name is None:
            return
        from ..graphs import list_priors
        from ..graphs.regularizer import ALIGNS, LOSSES, REDUCTIONS

        p = self._prefix
        check_choice(p + "name", self.name, tuple(list_priors()))
        check_choice(p + "loss", self.loss, LOSSES)
        check_choice(p + "reduction", self.reduction, REDUCTIONS)
        check_choice(p + "align", self.align, ALIGNS)


@dataclass
class CircuitGeneratorConfig(ConfigBase):
    """The circuit generator (NAC §2.2). ``kind="conditional"`` (App. G) reads the
    ``condition`` input through ``tokenizer`` with ``num_heads`` attention heads."""

    kind: str = "unconditional"
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="embedding"))
    num_heads: int = 4

    bounds = {"num_heads": COUNT}      # that it divides d_model when head_dim is None: NACConfig.validate
    choices = {"kind": ("unconditional", "conditional"), "tokenizer.kind": TOKENIZERS}

    def unused_fields(self) -> tuple[str, ...]:
        return () if self.kind == "conditional" else ("tokenizer",)


@dataclass
class NACConfig(ModelConfig):
    """NAC hyperparameters; defaults are NAC Table 4 (Tiny-ImageNet), and where the paper is
    silent the authors' released final configs (docs/nac.md, "Choices and departures")."""

    model_type = "nac"

    num_classes: int = 200
    d_model: int = 384                 # state dimension
    num_layers: int = 8                # propagators L (none share weights)
    num_processor_modules: int = 320   # U_p
    num_output_modules: int = 64       # U_o
    num_heads: int = 6                 # propagator attention heads
    read_in_heads: int = 1
    read_out_heads: int = 1            # not in Table 4; the authors' final configs: 1
    head_dim: int | None = 64          # features per head of every attention (authors' code); None: heads split d_model
    ffn_hidden: int = 1536
    activation: str = "geglu"
    d_sig: int = 64
    d_code: int = 384
    initial_state: str = "mlp"         # "mlp": θ⁰ = MLP(c) (paper); "code": θ⁰ = c (authors' final configs)
    read_in_codes: str = "shared"      # "shared": the module's code c_u (Eq. 4); "separate": a second code (authors')
    modulation: str = "nac"            # ModFC (Eq. 1); "none" switches conditioning off
    alpha_init: float = 0.1
    qv_bias: bool = True               # Eq. 1's b on query and value projections (the authors' configs: none)
    read_out_norm: bool = False        # a LayerNorm before the read-out pooling (neither paper nor authors' configs)
    attention_backend: str = "sdpa"    # every attention's kernel: "sdpa" or "flex" (FlexAttention); the same maths
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="conv", image_size=64))
    kernel: KernelConfig = field(default_factory=KernelConfig)
    frozen_graph: FrozenGraphConfig = field(default_factory=FrozenGraphConfig)
    generator: CircuitGeneratorConfig = field(default_factory=CircuitGeneratorConfig)
    graph_prior: GraphPriorConfig = field(default_factory=GraphPriorConfig)

    bounds = {"num_classes": CLASSES, **{n: COUNT for n in ("d_model", "num_layers", "num_processor_modules",
                                    "num_output_modules", "ffn_hidden", "d_sig", "d_code", "head_dim",
                                    "num_heads", "read_in_heads", "read_out_heads")},
              "alpha_init": Bounds(lo=0, note="ModFC's α, Eq. 1, is learned: 0 starts unmodulated")}
    choices = {"activation": FFN_ACTIVATIONS, "initial_state": ("mlp", "code"), "modulation": MODULATIONS,
               "read_in_codes": ("shared", "separate"), "tokenizer.kind": TOKENIZERS,
               "attention_backend": ATTENTION_BACKENDS}

    def unused_fields(self) -> tuple[str, ...]:
        return () if self.modulation == "nac" else ("alpha_init",)

    def validate(self) -> None:
        heads = ("num_heads", "read_in_heads", "read_out_heads")
        check_head_split(self, heads + (("generator.num_heads",) if self.generator.kind == "conditional" else ()))
        if self.frozen_graph.name is not None and (not self.kernel.enabled or self.generator.kind != "unconditional"):
            raise UserError("config field 'frozen_graph.name' needs kernel.enabled=True and an unconditional "
                            "generator (a frozen graph lives in free signatures)")
        if self.graph_prior.name is not None and self.generator.kind == "conditional":
            raise UserError("config field 'graph_prior.name': a graph prior needs one learned graph, but this "
                            "NAC designs a circuit per sample (conditional generator; the paper trains "
                            "conditional NACs without a graph prior)")
        if self.graph_prior.name is not None and not self.kernel.enabled:
            raise UserError("config field 'graph_prior.name': a graph prior needs link probabilities "
                            "(kernel.enabled=True); this NAC has none")
        if self.initial_state == "code" and self.d_code != self.d_model:
            raise UserError(f"config field 'initial_state': 'code' needs d_code == d_model, "
                            f"got d_code={self.d_code}, d_model={self.d_model}")
        if self.read_in_codes == "separate" and self.generator.kind != "unconditional":
            raise UserError("config field 'read_in_codes': 'separate' (a second free code per processor module) "
                            "needs the unconditional generator; a conditional one designs one code per module")

    def input_overrides(self, inputs: Inputs, num_classes: int, heads: int = 1) -> dict[str, Any]:
        """The executor's tokenizer reads ``x`` (§2.1); a ``condition`` input makes the circuit
        generator conditional (§2.2, App. G) and sets the tokenizer it reads the condition with.
        One read-out: ``heads`` must be 1."""
        check_single_head(heads, self.model_type)
        named = named_inputs(inputs)
        if "x" not in named or set(named) - {"x", "condition"}:
            raise UserError(f"a NAC reads an input 'x' and optionally a 'condition' (NAC §2.2, App. G), "
                            f"but the task gives the named inputs {sorted(named)}")
        out: dict[str, Any] = {"tokenizer": TokenizerConfig.for_input(named["x"]), "num_classes": num_classes}
        if "condition" in named:
            out["generator"] = {"kind": "conditional", "tokenizer": TokenizerConfig.for_input(named["condition"])}
        return out

    def input_names(self) -> tuple[str, ...]:
        return ("x", "condition") if self.generator.kind == "conditional" else ("x",)

    def example_inputs(self, batch: int = 2, *, device: Any = "cpu", seed: int = 0) -> dict[str, Any]:
        x = {"x": self.tokenizer.example_input(batch, device=device, seed=seed)}
        if self.generator.kind == "conditional":   # NAC §2.2: the generator reads its own input
            x["condition"] = self.generator.tokenizer.example_input(batch, device=device, seed=seed + 1)
        return x

    @property
    def modulation_spec(self) -> ModulationSpec:
        return ModulationSpec(self.modulation, self.d_code, self.alpha_init)


# ----------------------------------------------------------------------------- 1. circuit generator

@dataclass
class ModuleDesign:
    """The design of a group of modules (NAC §2): ``signatures [(B,) U, d_sig]`` (None without a
    kernel), ``codes [(B,) U, d_code]``, initial ``states [(B,) U, d_model]``; the batch axis is
    present for a conditional (per-sample) design. ``read_in_codes``: the codes the read-in
    (Eq. 4-5) conditions on, ``codes`` unless the design has separate ones (``read_in_codes=
    "separate"``, the authors' final configs)."""

    signatures: Tensor | None
    codes: Tensor
    states: Tensor
    read_in_codes: Tensor | None = None

    def __post_init__(self) -> None:
        if self.read_in_codes is None:
            self.read_in_codes = self.codes


@dataclass
class Circuit:
    """A circuit design: the processor modules and the output modules."""

    processors: ModuleDesign
    outputs: ModuleDesign


def _state_mlp(c: NACConfig) -> nn.Module | None:
    """``θ⁰ = MLP(c)`` (§2.2), or None for ``initial_state="code"`` (``θ⁰ = c``)."""
    return mlp(c.d_code, c.d_model, c.d_model) if c.initial_state == "mlp" else None


class FreeModules(nn.Module):
    """Unconditional design of one group of modules (§2.2): free signatures and codes.
    ``read_in_codes``: a second free code per module for the read-in, from which the initial
    state is made too (the authors' final configs: their "input latents", whose codes seed the
    states that become the "mediator latents")."""

    def __init__(self, num_modules: int, c: NACConfig, read_in_codes: bool = False) -> None:
        super().__init__()
        self.signatures = nn.Parameter(torch.randn(num_modules, c.d_sig)) if c.kernel.enabled else None
        self.codes = nn.Parameter(torch.randn(num_modules, c.d_code))
        self.read_in_codes = nn.Parameter(torch.randn(num_modules, c.d_code)) if read_in_codes else None
        self.state_mlp = _state_mlp(c)

    def forward(self) -> ModuleDesign:
        seed = self.codes if self.read_in_codes is None else self.read_in_codes
        states = seed if self.state_mlp is None else self.state_mlp(seed)
        return ModuleDesign(self.signatures, self.codes, states, seed)


class UnconditionalGenerator(nn.Module):
    """NAC §2.2, unconditional circuit generator: the design is learned by gradient descent
    and shared by every sample (``[U, ·]`` tensors, no batch axis)."""

    def __init__(self, c: NACConfig) -> None:
        super().__init__()
        self.processors = FreeModules(c.num_processor_modules, c, read_in_codes=c.read_in_codes == "separate")
        self.outputs = FreeModules(c.num_output_modules, c)

    def forward(self, condition: Tensor | None = None, *, batch_size: int | None = None) -> Circuit:
        if condition is not None:
            raise UserError("this NAC has an unconditional circuit generator: it takes no condition "
                            "(set generator.kind='conditional' to condition the design on an input)")
        return Circuit(self.processors(), self.outputs())


class ConditionalGenerator(nn.Module):
    """NAC §2.2 and App. G, conditional circuit generator: ``U_p + U_o`` learned queries (one per
    module) cross-attend to the tokens of the condition, then an FFN; a self-attention layer;
    then two FFNs in parallel emit each module's signature (``d_sig``) and code (``d_code``);
    initial states from the codes as in the unconditional generator. (Pre-LN residual blocks,
    as in the executor; App. G gives no more detail.)
    ``condition`` ``[B, M]`` ids or ``[B, M, d]`` features → a per-sample :class:`Circuit`."""

    def __init__(self, c: NACConfig) -> None:
        super().__init__()
        g, d = c.generator, c.d_model
        self.num_processors = c.num_processor_modules
        self.tokenizer = build_tokenizer(g.tokenizer)
        self.queries = nn.Parameter(torch.randn(c.num_processor_modules + c.num_output_modules, d))
        self.cross = ReadIn(d, self.tokenizer.out_dim, g.num_heads, c.ffn_hidden, activation=c.activation,
                            head_dim=c.head_dim, attention_backend=c.attention_backend)
        self.mix = PreNorm(d, SelfAttention(d, g.num_heads, head_dim=c.head_dim, attention_backend=c.attention_backend))
        self.to_signature = PreNorm(d, mlp(d, c.ffn_hidden, c.d_sig), residual=False)
        self.to_code = PreNorm(d, mlp(d, c.ffn_hidden, c.d_code), residual=False)
        self.processor_state, self.output_state = _state_mlp(c), _state_mlp(c)

    def forward(self, condition: Tensor | None = None, *, batch_size: int | None = None) -> Circuit:
        """The per-sample circuit; ``batch_size``: the executor's batch, which ``condition`` must match."""
        if condition is None:
            raise UserError("this NAC has a conditional circuit generator: call it as model(x, condition=c)")
        tokens = self.tokenizer(condition, name="condition")                # [B, M, token_dim] (checked)
        if batch_size is not None and len(condition) != batch_size:
            raise UserError(f"condition and x must hold the same samples: got {len(condition)} conditions "
                            f"for {batch_size} inputs")
        h, _ = self.cross(self.queries, tokens, key_mask=padding_mask(self.tokenizer, condition))
        h, _ = self.mix(h)                                                  # [B, U_p + U_o, d]
        signatures, codes = self.to_signature(h), self.to_code(h)         # [B, U_p + U_o, d_sig / d_code]
        groups = []
        for sl, state in ((slice(None, self.num_processors), self.processor_state),
                          (slice(self.num_processors, None), self.output_state)):
            c_sl = codes[:, sl]
            groups.append(ModuleDesign(signatures[:, sl], c_sl, c_sl if state is None else state(c_sl)))
        return Circuit(*groups)


# ----------------------------------------------------------------------------- 2. circuit executor

@dataclass
class NACRecord(PerceiverIORecord):
    """A NAC forward pass: a Perceiver IO's record (NAC App. B.2: a NAC generalises a Perceiver IO;
    ``states`` the final processor states ``[B, U, d]``, the attention of every stage) plus
    ``link_probs``, ``P`` of Eq. 2 ``[(B,) U, U]`` (per sample for a conditional NAC),
    ``readout_link_probs [(B,) U_o, U]`` (None without a kernel) and the ``circuit`` design the
    generator produced (§2.2)."""

    link_probs: Tensor | None = None
    readout_link_probs: Tensor | None = None
    circuit: Circuit | None = None


class NAC(ReadOutHeadFineTuning, ReadOutClassifier):
    """Neural Attentive Circuit classifier: ``model(x) → logits [B, num_classes]``, or
    ``model(x, condition=c)`` for a conditional NAC. ``forward_record`` also returns
    the circuit, ``P`` and the attention of every stage (:class:`NACRecord`)."""

    config_class = NACConfig
    grad_checkpointing_refusal = None                 # its propagators recompute exactly (run_block)
    record_type = NACRecord
    readout_design = ("generator.outputs.",)          # the output modules' free design (§2.2)

    def __init__(self, config: NACConfig) -> None:
        super().__init__()
        self.config = c = config
        spec, k = dict(mod=c.modulation_spec, activation=c.activation), c.kernel
        self.generator = (UnconditionalGenerator(c) if c.generator.kind == "unconditional"
                          else ConditionalGenerator(c))
        self.kernel = (SignatureKernel(k.epsilon, k.learn_epsilon, k.tau, k.delta, k.train_mode, k.eval_mode,
                                       k.truncation) if k.enabled else None)
        # The propagators' kernel when sparsified (App. F), installed by modwire.analysis; None: self.kernel.
        self.propagator_kernel: nn.Module | None = None
        self.tokenizer = build_tokenizer(c.tokenizer)
        spec.update(head_dim=c.head_dim, qv_bias=c.qv_bias, attention_backend=c.attention_backend)
        self.read_in = ReadIn(c.d_model, self.tokenizer.out_dim, c.read_in_heads, c.ffn_hidden, **spec)
        self.propagators = nn.ModuleList(
            TransformerBlock(c.d_model, c.num_heads, c.ffn_hidden, **spec) for _ in range(c.num_layers))
        self.read_out = ReadOut(c.d_model, c.num_output_modules, c.read_out_heads, c.ffn_hidden,
                                c.num_classes, norm=c.read_out_norm, **spec)
        if c.frozen_graph.name is not None:
            self._freeze_graph(c.frozen_graph)
        self.graph_regularizer = None          # App. A: L_graph, reported by auxiliary_losses()
        if c.graph_prior.name is not None:
            from ..graphs import GraphRegularizer

            gp = c.graph_prior
            self.graph_regularizer = GraphRegularizer(gp.name, dict(gp.params), loss=gp.loss,
                                                      reduction=gp.reduction, align=gp.align)
        self._aux: dict[str, Tensor] = {}

    def forward(self, x: Tensor, *, condition: Tensor | None = None) -> Tensor:
        return self._run(x, condition, record=False).logits

    def forward_record(self, x: Tensor, *, condition: Tensor | None = None) -> NACRecord:
        """Logits plus everything the pass computed (attention weights of every stage, ``P``)."""
        rec = self._run(x, condition, record=True)
        if self.kernel is not None:
            p, o = rec.circuit.processors.signatures, rec.circuit.outputs.signatures
            rec.link_probs = self._kernel_for_propagators().link_probs(p, p)
            rec.readout_link_probs = self.kernel.link_probs(o, p)
        return rec

    def _run(self, x: Tensor, condition: Tensor | None, *, record: bool,
             read_in: ReadInMethod = "factorized") -> NACRecord:
        """The forward pass. ``read_in``: how the read-in computes (``"factorized"``, or ``"literal"``: the
        explicit softmax, the reference the tests compare it with; ``modwire.nn.attention``)."""
        tokens = self.tokenizer(x)                       # [B, N, token_dim]; x checked (nn.tokenizers)
        circuit = self.generator(condition, batch_size=len(x))              # §2.2: the circuit design
        theta, w_in, w_prop = self._features(x, tokens, circuit, record=record, read_in=read_in)
        logits, w_out, conf = self._read_out(theta, circuit, record=record)
        return NACRecord(logits, theta, w_in, w_prop, w_out, conf, circuit=circuit)

    def _features(self, x: Tensor, tokens: Tensor, circuit: Circuit, *, record: bool,
                  read_in: ReadInMethod = "factorized") -> tuple[Tensor, Tensor | None, list]:
        """Read-in (Eq. 4-5) and the propagators (Eq. 2-3): ``(θ [B, U_p, d], read-in weights, theirs)``;
        in training with a graph prior, App. A's ``L_graph`` for :meth:`auxiliary_losses`."""
        p = circuit.processors
        self._aux = {}
        if self.training and self.graph_regularizer is not None:            # App. A, Eq. 6-9
            P = self._kernel_for_propagators().link_probs(p.signatures, p.signatures)
            self._aux = {"graph": self.graph_regularizer(P)}
        theta, w_in = self.read_in(p.states, tokens, codes=p.read_in_codes, return_weights=record, method=read_in,
                                   key_mask=padding_mask(self.tokenizer, x))            # Eq. 4-5
        theta, w_prop = self.propagate(theta, p, record)                    # Eq. 2-3, L layers
        return theta, w_in, w_prop

    def _read_out(self, theta: Tensor, circuit: Circuit, *, record: bool = False,
                  pre_logits: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """The read-out (§2.1): output modules attend to ``θ``, then the confidence-weighted head."""
        p = circuit.processors
        bias = None if self.kernel is None else self.kernel(circuit.outputs.signatures, p.signatures, len(theta))
        return self.read_out(circuit.outputs.states, theta, out_codes=circuit.outputs.codes, state_codes=p.codes,
                             return_weights=record, pre_logits=pre_logits, **_kernel_args(bias))

    # timm's API (classifier_api): the features are the final processor states θ [B, U_p, d]; the head is
    # the read-out (output modules attend to θ: attention pooling, timm's "map") and its linear layer, so a
    # conditional NAC's forward_head takes its ``condition`` (the circuit designs the output modules);
    # a block is one propagator, its output θ.
    input_layer = "tokenizer"
    stem_modules = ("tokenizer", "generator", "kernel", "read_in")   # the generator: every layer's codes

    def forward_features(self, x: Tensor, *, condition: Tensor | None = None) -> Tensor:
        """The final processor states ``θ [B, U_p, d]``."""
        tokens = self.tokenizer(x)
        return self._features(x, tokens, self.generator(condition, batch_size=len(x)), record=False)[0]

    def forward_head(self, x: Tensor, pre_logits: bool = False, *, condition: Tensor | None = None) -> Tensor:
        """``θ [B, U_p, d]`` → logits ``[B, C]`` (the read-out), or its pooled output ``[B, d]``."""
        return self._read_out(x, self.generator(condition, batch_size=len(x)), pre_logits=pre_logits)[0]

    def propagate(self, theta: Tensor, p: ModuleDesign, record: bool = False) -> tuple[Tensor, list]:
        """The propagators (§2.1): SKMDPA among processor modules (Eq. 2-3), then ModFFN, per layer.
        A stochastic kernel is sampled afresh per layer (and example); a deterministic one once."""
        kernel, bias, weights = self._kernel_for_propagators(), None, []
        for layer in self.propagators:
            if kernel is not None and (bias is None or not kernel.deterministic):
                bias = kernel(p.signatures, p.signatures, theta.shape[0])
            theta, w = self.run_block(layer, theta, p.codes, return_weights=record, **_kernel_args(bias))
            weights.append(w)
        return theta, weights

    def auxiliary_losses(self) -> dict[str, Tensor]:
        """``{"graph": L_graph(P, P0)}`` (NAC App. A, Eq. 6-9) of the last training-mode forward
        when the config has a ``graph_prior``; else ``{}``."""
        return dict(self._aux)

    def _kernel_for_propagators(self) -> nn.Module | None:
        return self.kernel if self.propagator_kernel is None else self.propagator_kernel

    # ------------------------------------------------------------------------- graph and weights

    def link_probs(self, condition: Tensor | None = None) -> Tensor | None:
        """``P`` among processor modules (NAC Eq. 2): ``[U_p, U_p]``, or ``[B, U_p, U_p]`` for a
        conditional NAC given ``condition``; eliminated edges (App. F) at 0; None without a kernel."""
        if self.kernel is None:
            return None
        s = self.generator(condition).processors.signatures
        return self._kernel_for_propagators().link_probs(s, s)

    def _freeze_graph(self, frozen: FrozenGraphConfig) -> None:
        """NAC Table 1, "+ Sparse graph (not learnable)": fit the processor signatures so that
        ``P`` (Eq. 2) matches one graph sampled from prior ``name``, then freeze them."""
        from ..graphs import sample_adjacency
        from ..graphs.fit import fit_signatures

        c, sig = self.config, self.generator.processors.signatures
        sig.requires_grad_(False)
        if sig.is_meta:   # built to be loaded (from_pretrained): the fitted values come from the weights
            return
        target = sample_adjacency(frozen.name, c.num_processor_modules, seed=frozen.seed, **frozen.params)
        with torch.no_grad():
            sig.copy_(fit_signatures(target, c.d_sig, c.kernel.epsilon, seed=frozen.seed))

    def prepare_state_dict(self, state: dict[str, Tensor]) -> None:
        """A model saved with eliminated edges (App. F) reloads with its edge-masked kernel."""
        if "propagator_kernel.edge_mask" in state and self.kernel is not None:
            self.propagator_kernel = EdgeMaskedKernel(self.kernel, state["propagator_kernel.edge_mask"].bool())

    def module_axis(self) -> ModuleAxis:
        """The processor modules (§2.1): their free signatures and codes are the per-module
        tensors; ``P`` (Eq. 2) exists over them with a kernel and an unconditional generator."""
        c, conditional = self.config, self.config.generator.kind != "unconditional"
        names = ("generator.processors.codes",) if self.kernel is None else \
            ("generator.processors.signatures", "generator.processors.codes")
        if c.read_in_codes == "separate":
            names += ("generator.processors.read_in_codes",)
        return ModuleAxis("modules", c.num_processor_modules, "num_processor_modules", () if conditional else names,
                          link_probs=self.kernel is not None and not conditional,
                          fixed="a conditional NAC designs its modules per sample" if conditional else None)

    # NAC App. C: no weight decay on signatures and codes; positional encodings as the authors' configs
    # (their ``grid``); the conditional generator's module queries, which play the role of free codes
    decay_exempt = ("signatures", "codes", "tokenizer.pos", "generator.queries")


def _kernel_args(kernel_out) -> dict[str, Any]:
    """A kernel's ``(bias, key_mask)`` as keyword arguments of the attention blocks."""
    if kernel_out is None:
        return {}
    bias, key_mask = kernel_out
    return {"bias": bias, "key_mask": key_mask}


register_model_type(NAC)

# Presets. Table 4: Tiny-ImageNet (64×64 → 8×8 tokens). Table 5: ImageNet (224×224 → 28×28 tokens).
# Where the tables are silent, the authors' final configs: every attention head 64 wide (so the
# one read-in head and the one read-out head attend in 64 dimensions), one read-out head, no
# LayerNorm before the read-out pooling, and App. C's preprocessor at their widths, d_model/4 then
# d_model/2 (TokenizerConfig's defaults are Table 4's 96, 192), so tokens are d_model/2 + 64 wide.
# The smaller presets keep the heads' shape: head_dim = d_model / num_heads, so their propagators
# split d_model and their read-in and read-out are one head of that width; their preprocessor is
# modwire's before issue 35 (one width throughout, CONV_BEFORE_ISSUE_35).
register_preset("nac_tiny_imagenet", NAC, lambda: NACConfig(),
                "NAC Table 4; heads 64 wide, 1 read-out head (authors' final configs)")
register_preset("nac_imagenet", NAC, lambda: NACConfig(
    num_classes=1000, tokenizer=TokenizerConfig(kind="conv", image_size=224, stem_channels=128, conv_channels=256),
    d_model=512,
    num_processor_modules=960, num_heads=8, ffn_hidden=1024, d_code=512),
    "NAC Table 5; heads 64 wide, 1 read-out head (authors' final configs)")
register_preset("nac_small", NAC, lambda: NACConfig(
    num_classes=10, tokenizer=TokenizerConfig(kind="conv", image_size=32, stem_channels=64, conv_channels=64,
                                              pos_dim=32, **CONV_BEFORE_ISSUE_35), d_model=96,
    num_layers=4, num_processor_modules=64, num_output_modules=8, num_heads=4, head_dim=24,
    ffn_hidden=192, d_sig=16, d_code=96), "CPU-sized NAC (Table 4 shape, scaled down; heads 24 wide)")


def _micro() -> NACConfig:
    return NACConfig(num_classes=5, tokenizer=TokenizerConfig(kind="linear", input_dim=8, token_dim=16),
                     d_model=32, num_layers=2, num_processor_modules=12, num_output_modules=3, num_heads=2,
                     head_dim=16, ffn_hidden=48, d_sig=8, d_code=24)


register_preset("nac_micro", NAC, _micro, "test-sized NAC on generic sets (heads 16 wide)")
# Conditional NAC (§2.2, App. G). The paper's NLVR2 model reads CLIP-base tokens (512-d) with
# the Table 4 executor; the CPU preset reads Sort-of-CLEVR questions as 3 token ids.
register_preset("nac_conditional_nlvr2", NAC, lambda: NACConfig(
    num_classes=2, tokenizer=TokenizerConfig(kind="linear", input_dim=512, token_dim=384),
    generator=CircuitGeneratorConfig(kind="conditional", num_heads=6,
                              tokenizer=TokenizerConfig(kind="linear", input_dim=512, token_dim=384))),
    "NAC §4.4 / App. G (conditional, CLIP-base features; Table 4 executor)")
register_preset("nac_conditional_small", NAC, lambda: NACConfig(
    num_classes=10, tokenizer=TokenizerConfig(kind="linear", input_dim=77, token_dim=64), d_model=64,
    num_layers=3, num_processor_modules=32, num_output_modules=4, num_heads=4, head_dim=16,
    ffn_hidden=128, d_sig=16, d_code=64,
    generator=CircuitGeneratorConfig(kind="conditional", num_heads=4,
                              tokenizer=TokenizerConfig(kind="embedding", vocab_size=16, max_len=3, token_dim=64))),
    "CPU-sized conditional NAC (Sort-of-CLEVR: question → circuit, image → executor; heads 16 wide)")
register_preset("nac_conditional_micro", NAC, lambda: _micro().replace(generator={
    "kind": "conditional", "num_heads": 2, "tokenizer": {"kind": "embedding", "vocab_size": 7, "max_len": 4,
                                                         "token_dim": 16}}), "test-sized conditional NAC")
