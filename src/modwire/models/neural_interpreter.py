"""Neural Interpreters (NI; Rahaman et al. 2021) — NI §2, App. A, C.2.3.

A :class:`~modwire.models.set_model.SetModel` (embedding, CLS tokens, heads: NI §4 uses the ViT's
scaffolding) whose body is a stack of ``n_s`` scripts with no parameter sharing (Eq. 1). Read top
to bottom like NI §2:

1. **Functions** ``f_u = (s_u, c_u)``: a signature on the unit sphere of ``d_type`` dimensions
   and a code (:class:`Functions`; signatures often frozen at a random draw, App. A.1.4).
2. **Type inference** (Eq. 2): ``t_i = normalise(MLP(LN(x_i)))`` (:class:`TypeInference`).
3. **Type matching** (Eq. 3): ``C_ui = C̃_ui / (ε + Σ_u C̃_ui)``, ``C̃_ui = exp(-d_ui/σ)`` where
   ``d_ui = 1 - s_u·t_i ≤ τ`` (:func:`~modwire.nn.kernel.type_matching`; why ``≤`` is there).
4. **ModLin / ModMLP** (Eq. 4-5): :class:`~modwire.nn.modulated.ModulatedLinear` of kind ``"ni"``.
5. **ModAttn** (Eq. 6-8): per function and head, ``W_uhij = C_ui C_uj s_uhij / (ε + Σ_j C_ui C_uj
   s_uhij)`` with ``s = softmax_j(q·k/√d_key + b^{uh})`` (positional bias, App. C.2.3), through
   :func:`~modwire.nn.attention.attend` ``(key_scale=C_uj, row_scale=C_ui, renorm_eps=ε)``: one
   fused attention (the identity is stated there).
6. **LOC** (Eq. 9-10): ``a = x + C_ui·ModAttn(LN(x))``, ``y = a + C_ui·ModMLP(LN(a))``.
7. **Interpreter** (Eq. 11): ``y_i = x_i + Σ_u C_ui LOCs(x)_ui`` as printed, by default
   (``interpreter_residual``, below).
8. **FnIter / Script** (Eq. 12-14): ``n_i`` iterations of type matching + interpreter sharing
   weights (type matching recomputed every iteration).

All functions run together on a ``[B, U, N, d]`` grid: each ModLin folds the codes into one weight per
function, ``W diag LN(W_c c_u)`` ``[U, d_out, d_in]``, once per forward (:meth:`LOC.folds`), applied
to every function's stream over the batch and the tokens (no loop over functions, heads or tokens;
the first LOC reads ``x`` as ``[B, 1, N, d]``, NI: "x_ui = x_i for all u", one GEMM for all functions).

**Eq. 11, the text under it, and the authors' code.** Eq. 11 prints ``y_i = x_i + Σ_u C_ui
LOCs(x)_ui``, and the text under it gives two properties the printed equation has: a variable no
function reads passes unchanged (``C_·i = 0 ⇒ y_i = x_i``), and the results are aggregated
additively over the functions. The default is the equation as printed (the paper speaks, so the
paper's reading). Each stream ``LOCs(x)_ui`` already carries ``x_i`` through the LOC residuals
(Eq. 9-10), so with ``Σ_u C_ui ≈ 1`` the residual stream doubles every function iteration
(``2^{n_s·n_i}`` over the model). :func:`residual_growth` measures ``|x_i^{(k)}| / |x_i^{(0)}|``
per iteration at initialisation (``ni_digits``: ``experiments/results/ni_fuzzy_boolean/residual_growth.json``,
written by ``python -m modwire.experiments.ni_fuzzy_boolean --residual-growth``); the final LayerNorm hides the
scale, but each iteration's update then weighs half as much as the previous one's, and a few dozen
iterations overflow the stream into NaN (:func:`max_identity_iterations`). The authors' released
digits preset (``presets/digits.yml``: ``no_residual: true`` for the function pod and the script)
has no outer identity path; their ``vanilla`` residual mode is the printed equation.
``interpreter_residual``:

* ``"identity"`` (default): Eq. 11 as printed. Function iterations that would overflow the
  stream's dtype (more than :func:`max_identity_iterations`, 60 in float32, over all scripts) are
  refused with an error, not run into NaN;
* ``"update"``: ``y_i = x_i + Σ_u C_ui (LOCs(x)_ui - x_i)``, modwire's own reading: both properties
  of the text and no doubling (the scale stays: ``"update"`` in the same ``residual_growth.json``);
  equal to ``"none"`` where ``Σ_u C_ui = 1``;
* ``"none"``: the authors' released code, ``y_i = Σ_u C_ui LOCs(x)_ui`` (keeps the scale, but maps a
  variable no function reads to 0). With weights copied across, modwire with this reading is the
  authors' digits model (``tests/reference/authors_ni.py``).

With ``U = 1``, ``ε = 0``, no truncation (so ``C ≡ 1``) and one iteration, ``"update"`` and
``"none"`` make a script a stack of ``n_l`` pre-LN transformer layers whose linear maps are
``W·diag(LN(W_c c))`` (tested against the ViT's blocks).

**Where the authors' code differs and the paper speaks** (modwire follows the paper): their queries
have no bias (``LOCPod``), Eq. 4's ModLin has one; their per-function positional term (``sep_sum``)
is ``(W c_u)_h``, Eq. 22-23's is a ModLin of the offset embedding.

**Not in the paper** (modwire's choices, each from the authors' code or where the text is silent):
type inference (Eq. 2, "an MLP") starts with a LayerNorm, as in the authors' code; the ``H``
per-head ModLins of the relative positions (Eq. 22-23) share one ``W_c``
(:mod:`modwire.nn.positions`); the positional bias ``b^{uh}`` is added to the already scaled logits,
``softmax(q·k/√d_key + b)`` (the authors' ``LOCPod`` adds it to the raw ``q·k`` and divides the sum by
``√d_key`` only when ``scale_attention_weights`` is set, i.e. the learned bias is scaled by ``1/√d_key``
or the logits are not scaled at all).

Dynamic inference (NI §4.2-4.3): :meth:`NeuralInterpreter.add_functions` (capacity extension),
:meth:`~NeuralInterpreter.drop_functions` and :meth:`~NeuralInterpreter.module_axis` (function
dropping), ``model(x, iterations=k)`` (anytime inference), ``forward_record(x)`` (:class:`NIRecord`;
``compatibility``: ``C`` ``[B, U, N]`` and ``types`` ``[B, N, d_type]`` per function iteration).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.attention import ATTENTION_BACKENDS, attend, merge_heads, split_heads
from ..nn.kernel import type_matching
from ..nn.modulated import ModulatedFFN, ModulationSpec, PreNorm
from ..nn.positions import RelativePositionBias, pad_bias
from .axis import ModuleAxis
from .config import COUNT, POSITIVE, Bounds, heads_of
from .registry import register_model_type, register_preset
from .set_model import SetModel, SetModelConfig, SetModelRecord
from .tokenizer_config import TokenizerConfig
from ..errors import UserError

RESIDUALS = ("identity", "update", "none")


# ----------------------------------------------------------------------------- configuration

@dataclass
class NeuralInterpreterConfig(SetModelConfig):
    """NI hyperparameters; defaults are NI Table 4 (digits; see :func:`_digits` for the widths
    the table leaves open)."""

    model_type = "neural_interpreter"

    num_scripts: int = 1               # n_s (Eq. 1), no sharing between scripts
    num_iterations: int = 8            # n_i (Eq. 14), weights shared
    num_locs: int = 1                  # n_l (Eq. 11)
    num_functions: int = 5             # n_f
    num_added_functions: int = 0       # capacity extension (add_functions), kept apart for "new_functions"
    num_heads: int = 4
    qk_head_dim: int = 128             # key/query features per head; values: d_model / num_heads per head
    ffn_hidden: int = 192              # ModMLP width (Eq. 5)
    d_code: int = 192
    d_type: int = 24
    tau: float | None = 1.4            # truncation τ of Eq. 3 (keep d ≤ τ); None: no truncation
    sigma_init: float = 1.0            # σ of Eq. 3 at initialisation (learned, log-parameterised)
    eps: float = 1e-6                  # ε of Eq. 3 and Eq. 7
    type_hidden: int = 192             # type-inference MLP width (Eq. 2)
    type_depth: int = 2                # its number of linear layers
    freeze_signatures: bool = True     # signatures fixed at a random draw on the sphere (App. A.1.4)
    freeze_codes: bool = False
    interpreter_residual: str = "identity"  # Eq. 11: "identity" (as printed), "update" (keeps the scale), "none" (authors)
    pos_dim: int = 32                  # relative positions (App. C.2.3): width of e_row / e_col
    function_positions: bool = True    # each function's own positional bias (Eq. 22-23)
    attention_backend: str = "sdpa"    # ModAttn's kernel: "sdpa" or "flex" (FlexAttention); the same maths

    bounds = {**SetModelConfig.bounds,
              **{n: COUNT for n in ("num_scripts", "num_iterations", "num_locs", "num_functions", "qk_head_dim",
                                    "ffn_hidden", "d_code", "type_hidden", "type_depth", "pos_dim")},
              "num_added_functions": Bounds(lo=0),
              "num_heads": heads_of("d_model"),
              "d_type": Bounds(lo=2, note="a sphere in d_type dimensions needs d_type >= 2"),
              "tau": Bounds(lo=0, hi=2, note="d = 1 - cos lies in [0, 2]; None: no truncation"),
              "sigma_init": POSITIVE,
              "eps": Bounds(lo=0, note="ε = 0 is exact renormalisation; a variable no function reaches then gets C = 0")}
    choices = {**SetModelConfig.choices, "interpreter_residual": RESIDUALS, "attention_backend": ATTENTION_BACKENDS}

    def unused_fields(self) -> tuple[str, ...]:
        relative = self.tokenizer.kind == "patches" and self.tokenizer.positions == "relative"
        return () if relative else ("pos_dim", "function_positions")

    def validate(self) -> None:
        super().validate()
        if self.interpreter_residual == "identity":
            _check_identity_iterations(self.num_scripts * self.num_iterations, torch.float32,
                                       "config field 'num_iterations'")

    @property
    def total_functions(self) -> int:
        return self.num_functions + self.num_added_functions

    @property
    def modulation(self) -> ModulationSpec:
        return ModulationSpec("ni", self.d_code, fold=True)   # a few functions, many tokens: nn.modulated


def max_identity_iterations(dtype: torch.dtype) -> int:
    """The most function iterations (over all scripts) that ``interpreter_residual="identity"``
    (Eq. 11 as printed, the stream doubling each iteration) runs in ``dtype``: a stream of norm
    ``2^k`` must keep ``LayerNorm``'s squares finite, ``2^{2k} < finfo.max``, with a margin of
    ``2^4`` for the embedding's own scale (float32 / bfloat16: 60; float64: 508; float16: 4)."""
    return max(math.frexp(torch.finfo(dtype).max)[1] // 2 - 4, 0)     # frexp: max = m·2^e, e = 128 in float32


def _check_identity_iterations(total: int, dtype: torch.dtype, what: str) -> None:
    limit = max_identity_iterations(dtype)
    if total > limit:
        raise UserError(
            f"{what}: interpreter_residual='identity' (NI Eq. 11 as printed) doubles the residual stream "
            f"every function iteration, so {total} iterations over all scripts would scale it by 2^{total} and "
            f"overflow {dtype} (at most {limit}); use fewer iterations, or interpreter_residual='update' (the identity "
            f"path of Eq. 11 without the doubling) or 'none' (the authors' code)")


# ----------------------------------------------------------------------------- 1-3. functions, types

def random_signatures(n: int, d_type: int) -> Tensor:
    """``n`` points drawn uniformly on the unit sphere in ``d_type`` dimensions ``[n, d_type]``."""
    return F.normalize(torch.randn(n, d_type), dim=-1)


class Functions(nn.Module):
    """The functions of one script (NI §2 "Functions"): ``signatures [U, d_type]`` (unit norm) and
    ``codes [U, d_code]``; after :meth:`~NeuralInterpreter.add_functions`, ``added_signatures`` /
    ``added_codes`` hold the new ones (their own tensors, so they can be trained alone). Frozen
    signatures / codes are parameters with ``requires_grad=False``."""

    def __init__(self, c: NeuralInterpreterConfig) -> None:
        super().__init__()
        self.signatures = nn.Parameter(random_signatures(c.num_functions, c.d_type),
                                       requires_grad=not c.freeze_signatures)
        self.codes = nn.Parameter(torch.randn(c.num_functions, c.d_code), requires_grad=not c.freeze_codes)
        self.added_signatures = self.added_codes = None
        if c.num_added_functions:
            self.add(c.num_added_functions, c.d_type, c.d_code)

    def add(self, n: int, d_type: int, d_code: int) -> None:
        """Append ``n`` trainable functions: random signatures on the sphere, codes ``N(0, 1)``."""
        like = self.codes
        sig, code = random_signatures(n, d_type).to(like), torch.randn(n, d_code).to(like)
        if self.added_signatures is not None:
            sig, code = torch.cat([self.added_signatures.data, sig]), torch.cat([self.added_codes.data, code])
        self.added_signatures, self.added_codes = nn.Parameter(sig), nn.Parameter(code)

    def all(self) -> tuple[Tensor, Tensor]:
        """``(signatures [U, d_type], codes [U, d_code])``, the added functions last."""
        if self.added_signatures is None:
            return self.signatures, self.codes
        return torch.cat([self.signatures, self.added_signatures]), torch.cat([self.codes, self.added_codes])


class TypeInference(nn.Module):
    """NI Eq. 2: ``t_i = MLP(LN(x_i)) / |MLP(LN(x_i))|``, a GELU MLP with ``depth`` linear layers.
    ``[B, N, d] → [B, N, d_type]`` on the unit sphere."""

    def __init__(self, dim: int, d_type: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        widths = [dim] + [hidden] * (depth - 1) + [d_type]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            layers += [nn.Linear(a, b)] + ([nn.GELU()] if i < depth - 1 else [])
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.mlp(self.norm(x)), dim=-1)


# ----------------------------------------------------------------------------- 5-7. ModAttn, LOC

class ModAttn(nn.Module):
    """NI Eq. 6-8 for all functions at once. ``x [B, U|1, N, d]`` (normalised), ``folds``: each ModLin's
    ``W diag LN(W_c c_u)`` ``[U, d_out, d_in]`` (:meth:`LOC.folds`), ``C [B, U, N]``, ``bias``
    ``[(U,) H, N, N]`` or None → ``[B, U, N, d]``. Keys have no bias: it adds ``q_i·b_k`` to every
    logit of row ``i`` and cancels in the softmax. The attention runs on SDPA's fused kernels (4-D,
    :func:`~modwire.nn.attention.fused_attention`) except in training with the learned relative
    position bias on the CPU, whose fused kernel has no gradient for a bias (the math path then);
    ``attention_backend="flex"``: on FlexAttention, the bias as a ``score_mod`` with its gradient
    (:mod:`modwire.nn.flex`; on the CPU, training still takes SDPA's math path)."""

    def __init__(self, dim: int, num_heads: int, qk_head_dim: int, mod: ModulationSpec,
                 attention_backend: str = "sdpa") -> None:
        super().__init__()
        self.num_heads, self.scale, self.attention_backend = num_heads, qk_head_dim ** -0.5, attention_backend
        self.q = mod.linear(dim, num_heads * qk_head_dim)
        self.k = mod.linear(dim, num_heads * qk_head_dim, bias=False)
        self.v, self.o = mod.linear(dim, dim), mod.linear(dim, dim)

    def forward(self, x: Tensor, folds: dict[str, Tensor], C: Tensor, *, eps: float, bias: Tensor | None = None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        h = self.num_heads
        q, k, v = (split_heads(getattr(self, n)(x, folded=folds[n]), h) for n in "qkv")  # [B, U, H, N, ·]
        c = C.unsqueeze(-2)                                                       # [B, U, 1, N]
        y, w = attend(q, k, v, bias=bias, scale=self.scale, key_scale=c, row_scale=c, renorm_eps=eps,
                      return_weights=return_weights, backend=self.attention_backend)   # Eq. 7-8
        return self.o(merge_heads(y), folded=folds["o"]), w                       # [B, U, N, d]


class LOC(nn.Module):
    """NI Eq. 9-10: ``a = x + C_ui·ModAttn(LN(x))``, ``y = a + C_ui·ModMLP(LN(a))`` (so ``C_ui = 0``
    leaves ``x_ui`` unchanged), plus this LOC's relative positional bias (App. C.2.3) when the
    input is a grid of patches."""

    def __init__(self, c: NeuralInterpreterConfig, grid: tuple[int, int] | None) -> None:
        super().__init__()
        mod = c.modulation
        self.attn = PreNorm(c.d_model, ModAttn(c.d_model, c.num_heads, c.qk_head_dim, mod, c.attention_backend),
                            residual=False)
        self.ffn = PreNorm(c.d_model, ModulatedFFN(c.d_model, c.ffn_hidden, mod=mod, activation="gelu"),
                           residual=False)
        self.relative = None
        if grid is not None:
            self.relative = RelativePositionBias(grid, c.num_heads, c.pos_dim,
                                                 mod=mod if c.function_positions else None)

    def position_bias(self, codes: Tensor, num_tokens: int) -> Tensor | None:
        """``[U, H, N, N]`` (or ``[H, N, N]`` without per-function biases); 0 for CLS pairs."""
        if self.relative is None:
            return None
        return pad_bias(self.relative(codes if self.relative.f_row is not None else None), num_tokens)

    def folds(self, codes: Tensor) -> dict[str, Tensor]:
        """Each ModLin's ``W diag LN(W_c c_u)`` ``[U, d_out, d_in]`` (Eq. 4) for codes ``[U, d_code]``:
        computed once per forward, the codes being the same in every function iteration."""
        attn, ffn = self.attn.fn, self.ffn.fn
        layers = {"q": attn.q, "k": attn.k, "v": attn.v, "o": attn.o, "fc1": ffn.fc1, "fc2": ffn.fc2}
        return {name: layer.folded_weight(codes) for name, layer in layers.items()}

    def forward(self, x: Tensor, folds: dict[str, Tensor], C: Tensor, *, eps: float, bias: Tensor | None,
                return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        g = C.unsqueeze(-1)                                                       # C_ui  [B, U, N, 1]
        y, w = self.attn(x, folds, C, eps=eps, bias=bias, return_weights=return_weights)
        a = x + g * y                                                             # Eq. 9
        return a + g * self.ffn(a, None, (folds["fc1"], folds["fc2"])), w         # Eq. 10


# ----------------------------------------------------------------------------- 8. scripts

class Script(nn.Module):
    """NI Eq. 12-14: ``n_i`` function iterations (type matching recomputed, then the interpreter),
    sharing this script's parameters: type inference, σ, functions, ``n_l`` LOCs."""

    def __init__(self, c: NeuralInterpreterConfig, grid: tuple[int, int] | None) -> None:
        super().__init__()
        self.tau, self.eps, self.num_iterations, self.residual = c.tau, c.eps, c.num_iterations, c.interpreter_residual
        self.type_inference = TypeInference(c.d_model, c.d_type, c.type_hidden, c.type_depth)
        self.log_sigma = nn.Parameter(torch.tensor(float(c.sigma_init)).log())
        self.functions = Functions(c)
        self.locs = nn.ModuleList(LOC(c, grid) for _ in range(c.num_locs))

    def type_matching(self, x: Tensor, signatures: Tensor) -> tuple[Tensor, Tensor]:
        """Eq. 2-3 (Eq. 13): ``(C [B, U, N], types [B, N, d_type])``."""
        t = self.type_inference(x)
        return type_matching(t, signatures, self.log_sigma.exp(), truncation=self.tau, eps=self.eps), t

    def interpret(self, x: Tensor, codes: Tensor, C: Tensor, biases: Sequence[Tensor | None], *,
                  folds: Sequence[dict[str, Tensor]] | None = None, record: bool = False) -> tuple[Tensor, list]:
        """Eq. 11: the LOC stack on every function's stream, then the ``C``-weighted sum over functions
        and the identity path that ``interpreter_residual`` names (module docstring). ``folds``: each
        LOC's :meth:`LOC.folds` of ``codes`` (computed here when not given)."""
        folds = [loc.folds(codes) for loc in self.locs] if folds is None else folds
        xs, weights = x.unsqueeze(1), []                                          # x_ui = x_i  [B, 1, N, d]
        for loc, bias, fold in zip(self.locs, biases, folds):
            xs, w = loc(xs, fold, C, eps=self.eps, bias=bias, return_weights=record)  # [B, U, N, d]
            weights.append(w)
        y = torch.einsum("bun,bund->bnd", C, xs)                                  # Σ_u C_ui LOCs(x)_ui
        mode = self.residual
        if mode == "update":                                                      # x_i + Σ_u C_ui (· - x_i)
            y = y + (1 - C.sum(1)).unsqueeze(-1) * x
        elif mode == "identity":                                                  # Eq. 11 as printed
            y = x + y
        return y, weights

    def iterate(self, x: Tensor, *, iterations: int | None = None, record: bool = False
                ) -> Iterator[tuple[Tensor, Tensor, Tensor, list]]:
        """Eq. 14, one function iteration at a time: yields ``(x, C, types, attention weights)``
        after each of the ``n_i`` (or ``iterations``) iterations."""
        signatures, codes = self.functions.all()
        biases = [loc.position_bias(codes, x.shape[1]) for loc in self.locs]     # once: no x dependence
        folds = [loc.folds(codes) for loc in self.locs]                           # once: W_c c per forward
        for _ in range(self.num_iterations if iterations is None else iterations):
            C, t = self.type_matching(x, signatures)                              # Eq. 13
            x, w = self.interpret(x, codes, C, biases, folds=folds, record=record)  # Eq. 12
            yield x, C, t, w

    def forward(self, x: Tensor, *, iterations: int | None = None, record: bool = False
                ) -> tuple[Tensor, dict[str, list]]:
        out: dict[str, list] = {"compatibility": [], "types": [], "propagator_attention": []}
        for x, C, t, w in self.iterate(x, iterations=iterations, record=record):
            if record:
                out["compatibility"].append(C)
                out["types"].append(t)
                out["propagator_attention"].extend(w)
        return x, out


# ----------------------------------------------------------------------------- the model

@dataclass
class NIRecord(SetModelRecord):
    """A Neural Interpreter's forward pass: the set model's record (``states [B, N, d]``, every LOC's
    attention ``[B, U, H, N, N]`` in ``propagator_attention``) plus, one per function iteration
    (scripts in order), the ``compatibility`` ``C`` of NI Eq. 3 ``[B, U, N]`` and the inferred
    ``types`` ``[B, N, d_type]`` (Eq. 2)."""

    compatibility: list[Tensor] = field(default_factory=list)
    types: list[Tensor] = field(default_factory=list)


class NeuralInterpreter(SetModel):
    """``model(x[, task], iterations=None)`` → logits (shapes: :mod:`modwire.models.set_model`).
    ``iterations=k``: every script runs ``k`` function iterations instead of ``n_i`` (anytime
    inference, NI Fig. 8; an option of ``forward`` alone: ``forward_record`` takes the model's inputs
    only and runs ``n_i``). ``forward_record`` adds ``compatibility`` and ``types`` (:class:`NIRecord`)."""

    config_class = NeuralInterpreterConfig
    grad_checkpointing_refusal = None                 # its scripts recompute exactly (run_block)
    record_type = NIRecord

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__(config)
        c = config
        grid = self.embed.grid if c.tokenizer.positions == "relative" else None
        self.scripts = nn.ModuleList(Script(c, grid) for _ in range(c.num_scripts))   # Eq. 1

    def forward(self, x: Tensor, task: Tensor | None = None, question: Tensor | None = None, *,
                iterations: int | None = None) -> Tensor:
        return self._run(x, task, question, record=False, iterations=iterations).logits

    def intermediate_blocks(self) -> list[tuple[nn.Module, int]]:
        """timm's blocks (classifier_api): the scripts (NI Eq. 1), each output the token set after its
        ``n_i`` function iterations ``[B, N, d]``."""
        return [(s, 1) for s in self.scripts]

    def encode(self, x: Tensor, *, record: bool, iterations: int | None = None) -> tuple[Tensor, dict[str, Any]]:
        if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int)
                                       or iterations < 1):
            raise UserError(f"iterations must be a positive int (function iterations per script), got {iterations!r}")
        if self.config.interpreter_residual == "identity":     # static: Python ints and the dtype, no sync
            per_script = self.config.num_iterations if iterations is None else iterations
            _check_identity_iterations(len(self.scripts) * per_script, x.dtype, f"iterations={per_script}")
        extra: dict[str, list] = {"compatibility": [], "types": [], "propagator_attention": []}
        for script in self.scripts:
            x, out = self.run_block(script, x, iterations=iterations, record=record)
            for key, value in out.items():
                extra[key].extend(value)
        return x, extra

    # ------------------------------------------------------------------------- dynamic inference

    def add_functions(self, n: int) -> None:
        """Capacity extension (NI §4.2, Fig. 5b): ``n`` new functions per script, with random
        signatures on the sphere and random codes, kept in ``added_signatures`` / ``added_codes``
        (the ``"new_functions"`` parameter set). A new function whose signature no type reaches
        under the truncation leaves every output unchanged."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"add_functions: n must be a positive int, got {n!r}")
        c = self.config
        for script in self.scripts:
            script.functions.add(n, c.d_type, c.d_code)
        self.config = c.replace(num_added_functions=c.num_added_functions + n)

    def merge_added_functions(self) -> None:
        """Fold the added functions into ``signatures`` / ``codes`` (e.g. before module dropping)."""
        c = self.config
        if not c.num_added_functions:
            return
        for script in self.scripts:
            f = script.functions
            sig, code = (t.detach() for t in f.all())
            f.signatures = nn.Parameter(sig.clone(), requires_grad=f.signatures.requires_grad)
            f.codes = nn.Parameter(code.clone(), requires_grad=f.codes.requires_grad)
            f.added_signatures = f.added_codes = None
        self.config = c.replace(num_functions=c.total_functions, num_added_functions=0)

    def drop_functions(self, ids: Sequence[int] | Tensor) -> None:
        """Remove functions ``ids`` (indices into ``[functions..., added functions...]``) from every
        script, in place (NI Fig. 5c: functions removed at test time). Added functions are merged first."""
        self.merge_added_functions()
        u = self.config.num_functions
        drop = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        if len(drop) and (drop.min() < 0 or drop.max() >= u or len(drop.unique()) != len(drop)):
            raise UserError(f"drop_functions: ids must be distinct indices in [0, {u}), got {drop.tolist()}")
        keep = torch.tensor([i for i in range(u) if i not in set(drop.tolist())], dtype=torch.long)
        if len(keep) == 0:
            raise UserError(f"drop_functions: at least one of the {u} functions must stay")
        for script in self.scripts:
            f = script.functions
            for name in ("signatures", "codes"):
                old = getattr(f, name)
                setattr(f, name, nn.Parameter(old.data[keep.to(old.device)].clone(), requires_grad=old.requires_grad))
        self.config = self.config.replace(num_functions=len(keep))

    def module_axis(self) -> ModuleAxis:
        """The functions (NI §2): each script's ``signatures`` and ``codes`` rows (``modwire analyze``
        drops functions through them, NI Fig. 5c)."""
        c = self.config
        names = tuple(f"scripts.{i}.functions.{n}" for i in range(c.num_scripts) for n in ("signatures", "codes"))
        fixed = ("it has added functions (add_functions): call merge_added_functions() first"
                 if c.num_added_functions else None)
        return ModuleAxis("functions", c.num_functions, "num_functions", names, fixed=fixed)

    # ------------------------------------------------------------------------- fine-tuning protocol

    def parameter_sets(self) -> dict[str, tuple[str, ...]]:
        """``cls`` (the CLS tokens, plus the heads unless :meth:`new_task` kept the pre-trained shared
        head: NI Table 1 row 2, "the CLS tokens are the only trainable parameters"), ``heads``,
        ``type_inference`` (type-inference MLP and LN, signatures, σ; Table 1 row 3 is ``cls`` +
        this), ``signatures_codes`` (Fig. 5b), ``functions`` (the LOCs and the codes),
        ``new_functions`` (after :meth:`add_functions`), ``all``."""
        s = [f"scripts.{i}." for i in range(self.config.num_scripts)]
        sets = {**super().parameter_sets(),
                "type_inference": tuple(p + n for p in s for n in ("type_inference.", "log_sigma",
                                                                   "functions.signatures", "functions.added_signatures")),
                "signatures_codes": tuple(p + "functions." for p in s),
                "functions": tuple(p + n for p in s for n in ("locs.", "functions.codes", "functions.added_codes"))}
        if self.config.num_added_functions:
            sets["new_functions"] = tuple(p + "functions.added_" for p in s)
        return sets

    # The set model's, and as NAC App. C (NAC builds on NI; NI gives no rule): the functions' signatures and
    # codes (the added ones too), the type inference's log σ, the relative positional encodings' tables
    decay_exempt = SetModel.decay_exempt + ("signatures", "codes", "added_signatures", "added_codes", "log_sigma",
                                            "e_row", "e_col")


register_model_type(NeuralInterpreter)


@torch.no_grad()
def residual_growth(model: NeuralInterpreter, tokens: Tensor, *, iterations: int | None = None) -> list[float]:
    """How the residual stream's scale moves with function iterations (the Eq. 11 readings of the
    module docstring): ``tokens [B, N, d]`` (embedded, CLS tokens appended) run through every
    script; after each function iteration ``k`` (scripts in order), the mean over samples and
    tokens of ``|x_i^{(k)}| / |x_i^{(0)}|``. An analysis helper (host syncs), not part of forward."""
    x0 = tokens.norm(dim=-1)
    x, ratios = tokens, []
    for script in model.scripts:
        for x, *_ in script.iterate(x, iterations=iterations):
            ratios.append(float((x.norm(dim=-1) / x0).mean()))
    return ratios


# ----------------------------------------------------------------------------- presets

def _digits() -> NeuralInterpreterConfig:
    """NI Table 4 (digits: SVHN, MNIST-M, MNIST; 32×32 RGB in 4×4 patches, one CLS token and head
    per dataset, relative positions, App. C.2.3), 6.43 × 10⁵ parameters in the paper.

    The table leaves three widths open; the authors' released preset (``presets/digits.yml`` with
    ``nfc.py``) fixes them:

    * **key/query features per head: 128.** The config says ``num_heads_in_loc: 4``,
      ``num_features_per_loc_head: 32``; the code builds queries and keys of width
      ``num_heads · (num_heads · 32) = 512``, i.e. 4 heads × 128 — Table 4's "128" (the
      implementation notes' "4 × 32" is the config's number). Values take ``d_model / 4 = 48`` per head.
    * **ModMLP width: 192** (``d_model``; the code's ``pointwise_mlp``; Table 5 gives the ViT's as 192).
    * **positional embedding width: 32.** Not in the paper. The authors' code uses 128 but with a
      per-function term ``(W c_u)_h`` that ignores the offset (1 536 parameters), not Eq. 22-23's
      ModLin of the embedding; with Eq. 22-23's ModLin (``W_c`` of ``pos_dim × d_code`` per row
      and column) at 128 the model would overshoot Table 4's count far more than it misses it at 32.

    Count (this preset, 640 375 = 6.40 × 10⁵, −0.41 % of 6.43 × 10⁵): patch embedding 9 408;
    CLS tokens 576, final LN 384, three heads 5 790; script: type inference 42 072 (LN 384,
    192→192→24), σ 1, signatures 120 (frozen, counted), codes 960; LOC: 2 LN 768, q 135 680
    (ModLin 192→512 with bias, W_c 192×192), k 135 168 (no bias), v, o and the two ModMLP
    layers 4 × 73 920, positions 13 768 (e_row, e_col 2 × 15 × 32; w_row, w_col 2 × 4 × 32;
    ModLin_row, ModLin_col 2 × (4 × 32 + 4 + 32 × 192)). The authors' 643 059 also counts tensors
    their forward never reads (absolute positions 12 288, a type codebook 2 400, output signatures
    120) and uses one shared CLS token and head (``use_shared_cls_tokens``) where the text has three."""
    return NeuralInterpreterConfig(
        num_classes=10, num_cls_tokens=3, task_input=True,
        tokenizer=TokenizerConfig(kind="patches", image_size=32, in_channels=3, patch_size=4, positions="relative"))


def _fuzzy_boolean() -> NeuralInterpreterConfig:
    """NI Table 3 (§4.1, App. B): 5 scalar inputs with learned positions, 20 CLS tokens (one per
    function) and a shared regression head; 128-d, 2 scripts × 2 iterations × 1 LOC, 4 functions,
    1 head of 32 key features (the authors' convention above: ``1 · 32``), ModMLP 128 (``d_model``),
    type MLP 128 × 2, learned signatures and codes, τ = 1.6, d_type = 24."""
    return NeuralInterpreterConfig(
        num_classes=1, num_cls_tokens=20, shared_head=True, d_model=128, d_code=128, num_scripts=2,
        num_iterations=2, num_locs=1, num_functions=4, num_heads=1, qk_head_dim=32, ffn_hidden=128,
        type_hidden=128, freeze_signatures=False, tau=1.6, d_type=24,
        tokenizer=TokenizerConfig(kind="linear", input_dim=1, max_len=5))


# NI Table 9 on top of Table 7: (τ, d_type, frozen signatures) per PGM regime.
PGM_REGIMES = {"neutral": (1.62, 20, False), "interpolation": (1.62, 20, False),
               "attribute_pairs": (1.40, 32, True), "triple_pairs": (1.66, 24, False),
               "triples": (1.42, 24, True), "extrapolation": (1.42, 24, True)}


def _pgm(tau: float, d_type: int, frozen: bool) -> NeuralInterpreterConfig:
    """NI Table 7 (all PGM runs) with one column of Table 9: 192-d codes and features, 2 scripts ×
    8 iterations × 1 LOC, 5 functions, 4 heads × 32 key features per LOC head as in the digits
    preset (4 × 128 in the code's convention), type MLP 192 × 2, learned codes; panels of 80×80,
    8 context + 8 candidates, each candidate with the context and a CLS token (§4.3, App. D).

    Parameters: 1 403 795 (neutral; 1.40-1.41 M over the regimes) against Table 7's 1.6 M, 12.3 %
    under. The difference is the panel CNN, which App. D calls "shallow" without describing it:
    modwire uses WReN's (four 3×3 stride-2 convolutions of 32 filters with BatchNorm and no bias,
    then a linear map to 192; 183 712 parameters with the slot embeddings). ``tokenizer.panel_channels`` widens it
    (``create_model(..., tokenizer={"panel_channels": c}).num_parameters()`` gives the count at ``c``)."""
    return NeuralInterpreterConfig(
        num_classes=1, num_cls_tokens=1, num_scripts=2, num_iterations=8, num_locs=1, num_functions=5,
        tau=tau, d_type=d_type, freeze_signatures=frozen,
        tokenizer=TokenizerConfig(kind="panels", image_size=80, in_channels=16, num_context=8))


def _micro() -> NeuralInterpreterConfig:
    return NeuralInterpreterConfig(
        num_classes=5, d_model=32, d_code=16, num_scripts=2, num_iterations=2, num_functions=3, num_heads=2,
        qk_head_dim=8, ffn_hidden=48, d_type=8, tau=1.6, type_hidden=32, pos_dim=8, freeze_signatures=True,
        tokenizer=TokenizerConfig(kind="patches", image_size=8, in_channels=1, patch_size=2, positions="relative"))


register_preset("ni_digits", NeuralInterpreter, _digits, "NI Table 4 (digits, 6.43e5 parameters)")
register_preset("ni_fuzzy_boolean", NeuralInterpreter, _fuzzy_boolean, "NI Table 3 (fuzzy Boolean expressions)")
for _regime, _cols in PGM_REGIMES.items():
    register_preset(f"ni_pgm_{_regime}", NeuralInterpreter, lambda c=_cols: _pgm(*c),
                    f"NI Tables 7 and 9 (PGM, {_regime})")
register_preset("ni_micro", NeuralInterpreter, _micro, "test-sized NI (8×8 images, relative positions)")
