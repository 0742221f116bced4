"""Neural Attentive Circuits (NAC), unconditional variant — NAC §2, App. B-C.

Read top to bottom like the paper's method section:

1. **Circuit design** (§2, "Circuit Design"; §2.2 unconditional generator): every
   module ``u`` has a signature ``s_u`` (who talks to whom), a code ``c_u`` (what it
   computes) and an initial state ``θ_u⁰ = MLP(c_u)``. Processor signatures and
   codes are shared across depth; output modules have their own.
2. **Tokenizer** (§2.1): input → token set ``X`` (App. C conv preprocessor for images).
3. **Read-in** (Eq. 4-5): modules cross-attend to ``X`` with ModFC projections
   conditioned on the receiver's code — computed factorized, never materialising
   per-module keys/values.
4. **Propagators** (§2.1): ``L`` layers of SKMDPA (Eq. 2-3) among processor modules,
   then ModFFN; separate weights per layer, a fresh kernel sample per layer and
   example during training.
5. **Read-out** (§2.1): output modules attend to the final states with SKMDPA,
   ModFFN, and a confidence-weighted sum of per-module logits.

Graph priors act on ``link_probs()`` from the training loop (``modwire.graphs``);
``frozen_graph`` fixes the signatures to a sampled graph (Table 1); ``set_edge_mask``
and ``static_propagator_bias`` carry inference-time sparsification (App. F,
``modwire.analysis.sparsify``).

Switching off the modulation (``modulation="none"``) and the kernel
(``use_kernel=False``) leaves a Perceiver IO (App. B.2), which the tests check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..nn import ProcessorLayer, ReadIn, ReadOut, SignatureKernel
from ..nn.attention import ReadInMethod
from ..nn.kernel import KERNEL_MODES
from ..nn.tokenizers import padding_bias
from ..nn.modulated import ACTIVATIONS, MODULATIONS
from .base import ModelConfig, PretrainedModel, TokenizerConfig, build_tokenizer, check_choice, check_positive
from .registry import register_model_type, register_preset


@dataclass
class NACConfig(TokenizerConfig, ModelConfig):
    """NAC hyperparameters; defaults are NAC Table 4 (Tiny-ImageNet)."""

    model_type = "nac"

    num_classes: int = 200
    d_model: int = 384                 # state dimension
    num_layers: int = 8                # propagators L (none share weights)
    num_processor_modules: int = 320   # U_p
    num_output_modules: int = 64       # U_o
    num_heads: int = 6                 # propagator attention heads
    read_in_heads: int = 1
    read_out_heads: int = 6            # not in Table 4; the propagators' head count
    ffn_hidden: int = 1536
    activation: str = "geglu"
    d_sig: int = 64
    d_code: int = 384
    initial_state: str = "mlp"         # "mlp": θ⁰ = MLP(c) (paper); "code": θ⁰ = c (authors' final configs)
    modulation: str = "nac"            # ModFC (Eq. 1); "none" switches conditioning off
    alpha_init: float = 0.1
    use_kernel: bool = True            # SKMDPA; False gives all-to-all attention
    tau: float = 0.5
    epsilon: float = 1.0
    learn_epsilon: bool = False        # ε is a hyperparameter in the paper
    delta: float = 1e-6
    kernel_train_mode: str = "sample"
    kernel_eval_mode: str = "expected"
    truncation: float | None = None    # keep pairs with d(s_i, s_j) ≤ truncation
    # Table 1 "+ Sparse graph (not learnable)": processor signatures fitted to one graph
    # sampled from this prior (modwire.graphs), then frozen. None: learned signatures.
    frozen_graph: str | None = None
    frozen_graph_params: dict[str, Any] = field(default_factory=dict)
    frozen_graph_seed: int = 0

    def validate(self) -> None:
        self.validate_tokenizer()
        check_positive(self, "num_classes", "d_model", "num_layers", "num_processor_modules",
                       "num_output_modules", "num_heads", "read_in_heads", "read_out_heads",
                       "ffn_hidden", "d_sig", "d_code", "tau", "epsilon", "delta")
        check_choice("activation", self.activation, ACTIVATIONS)
        check_choice("initial_state", self.initial_state, ("mlp", "code"))
        check_choice("modulation", self.modulation, MODULATIONS)
        check_choice("kernel_train_mode", self.kernel_train_mode, KERNEL_MODES)
        check_choice("kernel_eval_mode", self.kernel_eval_mode, KERNEL_MODES)
        for name in ("num_heads", "read_in_heads", "read_out_heads"):
            if self.d_model % getattr(self, name):
                raise ValueError(f"config field {name!r}: d_model={self.d_model} is not divisible by "
                                 f"{name}={getattr(self, name)}")
        if self.frozen_graph is not None and not self.use_kernel:
            raise ValueError("config field 'frozen_graph' needs use_kernel=True (a graph lives in the kernel)")
        if self.initial_state == "code" and self.d_code != self.d_model:
            raise ValueError(f"config field 'initial_state': 'code' needs d_code == d_model, "
                             f"got d_code={self.d_code}, d_model={self.d_model}")


class CircuitDesign(nn.Module):
    """Unconditional circuit generator (NAC §2.2): free signatures and codes for a group
    of modules, and initial states from a two-layer MLP of the code (or the code itself)."""

    def __init__(self, num_modules: int, d_sig: int, d_code: int, d_model: int,
                 initial_state: str = "mlp", with_signatures: bool = True) -> None:
        super().__init__()
        self.signatures = nn.Parameter(torch.randn(num_modules, d_sig)) if with_signatures else None
        self.codes = nn.Parameter(torch.randn(num_modules, d_code))
        self.state_mlp = (nn.Sequential(nn.Linear(d_code, d_model), nn.GELU(), nn.Linear(d_model, d_model))
                          if initial_state == "mlp" else None)

    def initial_states(self) -> Tensor:
        """``θ⁰``: ``[U, d_model]``."""
        return self.codes if self.state_mlp is None else self.state_mlp(self.codes)


class NAC(PretrainedModel):
    """Neural Attentive Circuit classifier. ``forward(x) → logits [B, num_classes]``.

    ``forward(x, return_intermediates=True)`` also returns a dict with the link
    probabilities ``P`` (``link_probs`` ``[U_p, U_p]``, ``readout_link_probs``
    ``[U_o, U_p]``), the attention weights of every stage (``read_in_attention``
    ``[B, H, U_p, N]``, ``propagator_attention`` list of ``[B, H, U_p, U_p]``,
    ``read_out_attention`` ``[B, H, U_o, U_p]``), the read-out confidences
    ``[B, U_o]`` and the final processor ``states`` ``[B, U_p, d_model]``.
    """

    config_class = NACConfig

    def __init__(self, config: NACConfig) -> None:
        super().__init__()
        self.config = c = config
        mod = dict(code_dim=c.d_code, activation=c.activation, modulation=c.modulation, alpha_init=c.alpha_init)
        # 1. circuit design
        self.processors = CircuitDesign(c.num_processor_modules, c.d_sig, c.d_code, c.d_model,
                                        c.initial_state, c.use_kernel)
        self.outputs = CircuitDesign(c.num_output_modules, c.d_sig, c.d_code, c.d_model,
                                     c.initial_state, c.use_kernel)
        self.kernel = (SignatureKernel(c.epsilon, c.learn_epsilon, c.tau, c.delta, c.kernel_train_mode,
                                       c.kernel_eval_mode, c.truncation) if c.use_kernel else None)
        # 2-5. executor
        self.tokenizer = build_tokenizer(c)
        self.read_in = ReadIn(c.d_model, self.tokenizer.out_dim, c.read_in_heads, c.ffn_hidden, **mod)
        self.propagators = nn.ModuleList(
            ProcessorLayer(c.d_model, c.num_heads, c.ffn_hidden, **mod) for _ in range(c.num_layers))
        self.read_out = ReadOut(c.d_model, c.num_output_modules, c.read_out_heads, c.ffn_hidden,
                                c.num_classes, **mod)
        # Inference-time sparsification (NAC App. F, modwire.analysis.sparsify): a bool
        # [U_p, U_p] mask of the edges the propagators may use (None: all), and optionally
        # a precomputed block-sparse bias that replaces the dense kernel in eval mode.
        self.register_buffer("edge_mask", None)
        self.static_propagator_bias = None
        if c.frozen_graph is not None:
            self._freeze_graph(c.frozen_graph, c.frozen_graph_params, c.frozen_graph_seed)

    def _freeze_graph(self, name: str, params: dict[str, Any], seed: int) -> None:
        """NAC Table 1, "+ Sparse graph (not learnable)": fit the processor signatures so
        that ``P`` (Eq. 2) matches one graph sampled from prior ``name``, then freeze them."""
        from ..graphs import sample_adjacency
        from ..graphs.fit import fit_signatures

        c = self.config
        target = sample_adjacency(name, c.num_processor_modules, seed=seed, **params)
        with torch.no_grad():
            self.processors.signatures.copy_(fit_signatures(target, c.d_sig, c.epsilon, seed=seed))
        self.processors.signatures.requires_grad_(False)

    def set_edge_mask(self, mask: Tensor | None) -> None:
        """Restrict the propagators to the edges where ``mask`` ``[U_p, U_p]`` (bool) is True
        (NAC App. F, "Eliminating connections between modules"); None restores all edges."""
        self.static_propagator_bias = None
        if mask is None:
            self.edge_mask = None
            return
        u = self.config.num_processor_modules
        if self.kernel is None:
            raise ValueError("set_edge_mask needs a NAC with a kernel (use_kernel=True)")
        if mask.dtype != torch.bool or tuple(mask.shape) != (u, u):
            raise ValueError(f"edge mask must be a bool tensor of shape ({u}, {u}), "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        self.edge_mask = mask.to(self.processors.codes.device).clone()

    def prepare_state_dict(self, state: dict[str, Tensor]) -> None:
        if "edge_mask" in state and self.edge_mask is None:  # a sparsified checkpoint
            self.set_edge_mask(state["edge_mask"].to(torch.bool))

    def no_weight_decay(self) -> tuple[str, ...]:
        """NAC App. C: no weight decay on signatures, codes and positional encodings."""
        return ("signatures", "codes", "tokenizer.pos")

    def link_probs(self) -> Tensor | None:
        """``P`` among processor modules (NAC Eq. 2), ``[U_p, U_p]``, with eliminated edges
        (``edge_mask``) at 0; None without a kernel."""
        if self.kernel is None:
            return None
        s = self.processors.signatures
        p = self.kernel.link_probs(s, s)
        return p if self.edge_mask is None else p.masked_fill(~self.edge_mask, 0.0)

    def _kernel(self, receivers: CircuitDesign, batch: int):
        if self.kernel is None:
            return None
        if receivers is self.processors:
            if self.static_propagator_bias is not None:
                if self.training:
                    raise RuntimeError("this NAC has a precomputed block-sparse propagator bias, which is "
                                       "for inference only: call .eval(), or set_edge_mask() to drop it")
                return self.static_propagator_bias
            return self.kernel(receivers.signatures, self.processors.signatures, batch, mask=self.edge_mask)
        return self.kernel(receivers.signatures, self.processors.signatures, batch)

    def forward_features(self, x: Tensor, intermediates: dict[str, Any] | None = None,
                         read_in: ReadInMethod = "factorized") -> Tensor:
        """Tokenize, read in and propagate: final processor states ``[B, U_p, d_model]``."""
        want = intermediates is not None
        tokens = self.tokenizer(x)                                   # [B, N, token_dim]
        codes, theta = self.processors.codes, self.processors.initial_states()
        theta, w = self.read_in(theta, tokens, codes, want, read_in, padding_bias(self.tokenizer, x))  # Eq. 4-5
        weights, bias = [], None
        resample = self.kernel is not None and self.kernel.mode == "sample"
        for layer in self.propagators:                               # SKMDPA + ModFFN
            if bias is None or resample:  # a fresh sample per layer; a deterministic kernel once
                bias = self._kernel(self.processors, tokens.shape[0])
            theta, w_l = layer(theta, codes, bias, want)
            weights.append(w_l)
        if want:
            intermediates.update(read_in_attention=w, propagator_attention=weights, states=theta)
        return theta

    def forward_head(self, states: Tensor, intermediates: dict[str, Any] | None = None) -> Tensor:
        """Read-out: logits ``[B, num_classes]`` from processor states ``[B, U_p, d_model]``."""
        want = intermediates is not None
        logits, w, conf = self.read_out(self.outputs.initial_states(), states, self.outputs.codes,
                                        self.processors.codes, self._kernel(self.outputs, states.shape[0]), want)
        if want:
            intermediates.update(read_out_attention=w, readout_confidence=conf)
        return logits

    def forward(self, x: Tensor, return_intermediates: bool = False):
        inter: dict[str, Any] | None = {} if return_intermediates else None
        logits = self.forward_head(self.forward_features(x, inter), inter)
        if not return_intermediates:
            return logits
        if self.kernel is not None:
            inter["link_probs"] = self.link_probs()
            inter["readout_link_probs"] = self.kernel.link_probs(self.outputs.signatures,
                                                                 self.processors.signatures)
        return logits, inter


register_model_type(NAC)

# Presets. Table 4: Tiny-ImageNet (64×64 → 8×8 tokens). Table 5: ImageNet (224×224 → 28×28 tokens).
# App. C does not give the preprocessor's width: we use d_model - 64 channels so that a
# token (channels ⊕ 64-d position) is d_model wide.
register_preset("nac_tiny_imagenet", NAC, lambda: NACConfig(), "NAC Table 4")
register_preset("nac_imagenet", NAC, lambda: NACConfig(
    num_classes=1000, image_size=224, conv_channels=448, d_model=512, num_processor_modules=960,
    num_heads=8, read_out_heads=8, ffn_hidden=1024, d_code=512), "NAC Table 5")
register_preset("nac_small", NAC, lambda: NACConfig(
    num_classes=10, image_size=32, conv_channels=64, pos_dim=32, d_model=96, num_layers=4,
    num_processor_modules=64, num_output_modules=8, num_heads=4, read_out_heads=4, ffn_hidden=192,
    d_sig=16, d_code=96), "CPU-sized NAC (Table 4 shape, scaled down)")
register_preset("nac_micro", NAC, lambda: NACConfig(
    num_classes=5, tokenizer="linear", input_dim=8, token_dim=16, d_model=32, num_layers=2,
    num_processor_modules=12, num_output_modules=3, num_heads=2, read_out_heads=2, ffn_hidden=48,
    d_sig=8, d_code=24), "test-sized NAC on generic sets")
