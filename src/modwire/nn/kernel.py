"""Signature kernels as small functions (NAC Eq. 2-3; NI Eq. 2-3), and NAC's kernel module.

Both papers connect things by a kernel of the cosine distance between unit vectors:

* NAC Eq. 2: ``P_ij = exp(-d(s_i, s_j)/ε)`` between module signatures, ``d = 1 - cos``;
  Eq. 3: ``K_ij ~ Concrete(P_ij, τ)``, ``K̂_ij = K_ij / (δ + Σ_j K_ij)`` (over *senders*),
  entering the attention logits as ``log K̂``.
* NI Eq. 2-3: ``C̃_ui = exp(-d(s_u, t_i)/σ)`` where ``d ≤ τ`` (truncation), 0 elsewhere;
  ``C_ui = C̃_ui / (ε + Σ_u C̃_ui)`` (over *functions*): :func:`type_matching`. The paper's
  Eq. 3 prints "if ``d > τ``"; its text keeps the *close* pairs ("functions are only granted
  access to set elements whose types lie in the immediate vicinity of their signatures",
  App. A.1.3; Fig. 2) and so does the authors' code (``kernels.py`` sends ``d > τ`` to ``∞``):
  we keep ``d ≤ τ``.

The functions here compose into either: :func:`signature_log_kernel` (log-kernel and
truncation mask), :func:`concrete_log_sample` (NAC's stochastic kernel),
:func:`normalize_log_kernel` (δ-normalisation along any axis). Everything stays in the log
domain, where ``log P = -d/ε`` and ``log K = logsigmoid(·)`` are exact and finite; a masked
pair is a bool mask, never a distance of ∞, so gradients still reach the signatures through
the kept pairs (the authors' straight-through truncation gives zero gradient there). A
module's link to itself is exact: ``d(s_i, s_i) = 0`` (:func:`cosine_distance` of a set with
itself), so ``P_ii = 1`` and ``K_ii = 1`` in every mode (``Concrete(1, τ) = 1``), with finite
gradients.

:class:`SignatureKernel` is the thin NAC module over them: ε (log-parameterised, so it stays
positive), τ, δ and the train / eval modes. It returns ``(bias, key_mask)`` for
:func:`~modwire.nn.attention.attend`, which turns a receiver with no allowed sender into a
zero message (the authors' code returns NaN there).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import mask_value
from ..errors import UserError
from ..fields import check_argument

KernelMode = Literal["expected", "sample", "threshold"]
KERNEL_MODES = ("expected", "sample", "threshold")


def cosine_distance(a: Tensor, b: Tensor) -> Tensor:
    """``d_ij = 1 - cos(a_i, b_j)``: ``[..., Uq, Uk]`` from ``[..., Uq, d]`` and ``[..., Uk, d]``.

    ``b is a`` (one set of signatures against itself, NAC's propagators): the diagonal is exactly
    0, ``d(s_i, s_i) = 0`` (NAC Eq. 2, so ``P_ii = 1``; App. A: "P_ii = 1 by definition"), where
    the rounding of ``cos`` would leave ~1e-7, and it gets no gradient (``d_ii`` is 0 whatever
    ``s_i`` is)."""
    na = F.normalize(a, dim=-1)
    nb = na if b is a else F.normalize(b, dim=-1)
    d = 1.0 - na @ nb.transpose(-1, -2)
    if b is a:
        d = d.masked_fill(torch.eye(d.shape[-1], dtype=torch.bool, device=d.device), 0.0)
    return d.clamp_min(0.0)


def signature_log_kernel(s_recv: Tensor, s_send: Tensor, epsilon: float | Tensor, *,
                         truncation: float | None = None) -> tuple[Tensor, Tensor | None]:
    """``(log P, mask)`` with ``log P_ij = -d(s_i, s_j)/ε`` ``[..., Uq, Uk]`` (NAC Eq. 2; NI Eq. 3's
    ``log C̃`` with σ as ε) and ``mask = d ≤ truncation`` (bool; None without truncation).
    Signatures are shared ``[U, d]`` or per sample ``[B, U, d]``."""
    d = cosine_distance(s_recv, s_send)
    return -d / epsilon, (None if truncation is None else d <= truncation)


def concrete_log_sample(log_p: Tensor, tau: float, *, generator: torch.Generator | None = None) -> Tensor:
    """``log K`` for ``K ~ Concrete(P, τ)`` (RelaxedBernoulli, reparameterised; NAC Eq. 3):
    ``K = σ((logit P + log u - log(1-u)) / τ)``, ``u ~ U(0, 1)``. Same shape as ``log_p``.
    ``P = 1`` (``log_p = 0``: a module and itself) gives ``K = 1`` exactly, as ``Concrete(1, τ) = 1``,
    with a zero gradient; every other entry has a finite ``logit P`` and follows the formula."""
    certain = log_p == 0                                # P = 1: logit P = ∞ and K = 1
    safe = torch.where(certain, torch.full_like(log_p, -1.0), log_p)   # finite in the unused branch
    logit_p = safe - torch.log(-torch.expm1(safe))      # log P - log(1 - P)
    # (torch.rand's own draw, written so that a dynamic batch size compiles: no shape argument)
    u = torch.empty_like(log_p).uniform_(generator=generator).clamp_(1e-6, 1 - 1e-6)
    log_k = F.logsigmoid((logit_p + torch.log(u) - torch.log1p(-u)) / tau)
    return torch.where(certain, torch.zeros_like(log_k), log_k)


def normalize_log_kernel(log_k: Tensor, *, dim: int = -1, delta: float = 1e-6,
                         mask: Tensor | None = None) -> Tensor:
    """``log K̂`` with ``K̂ = K·1[mask] / (δ + Σ_dim K·1[mask])`` (NAC Eq. 3 over senders, ``dim=-1``;
    NI Eq. 3 over functions with ``δ = ε``). Masked entries get a large finite negative value
    (their ``exp`` is 0), so a fully masked slice stays finite (and, with ``δ = 0``, all 0)."""
    if delta < 0:
        raise UserError(f"normalize_log_kernel: delta must be >= 0, got {delta!r}")
    fill = mask_value(log_k.dtype)
    if mask is not None:
        log_k = log_k.masked_fill(~mask, fill)
    log_sum = torch.logsumexp(log_k, dim=dim, keepdim=True)
    if delta > 0:
        log_sum = torch.logaddexp(log_sum, torch.full_like(log_sum, math.log(delta)))
    out = log_k - log_sum
    return out if mask is None or delta > 0 else out.masked_fill(~mask, fill)


def type_matching(types: Tensor, signatures: Tensor, sigma: float | Tensor, *, truncation: float | None,
                  eps: float) -> Tensor:
    """NI Eq. 2-3, the function-variable compatibility ``C [B, U, N]``::

        d_ui = 1 - s_u·t_i,   C̃_ui = exp(-d_ui/σ) if d_ui ≤ τ else 0,   C_ui = C̃_ui / (ε + Σ_u C̃_ui)

    types ``[B, N, d_type]`` (TypeInference's output), signatures ``[U, d_type]`` (or per sample
    ``[B, U, d_type]``); both are projected onto the unit sphere here (``d = 1 - cos``). σ > 0
    (learned, log-parameterised by the model); ``truncation`` τ (None: keep every pair; the
    module docstring says why ``d ≤ τ``); ε ≥ 0 (0: a variable no function reaches gets
    ``C = 0``, not 0/0). Built from :func:`signature_log_kernel` and :func:`normalize_log_kernel`
    (over the functions axis) in the log domain."""
    log_c, keep = signature_log_kernel(signatures, types, sigma, truncation=truncation)   # [B, U, N]
    return normalize_log_kernel(log_c, dim=-2, delta=eps, mask=keep).exp()


class SignatureKernel(nn.Module):
    """NAC's stochastic signature kernel (Eq. 2-3) for :func:`~modwire.nn.attention.attend`.

    Args:
        epsilon: bandwidth ε (NAC Table 4: 1.0), kept positive by a log parameterisation.
        learn_epsilon: make ε a parameter (the paper treats it as a hyperparameter).
        tau: Concrete temperature τ (NAC Table 4: 0.5). delta: δ of Eq. 3.
        train_mode / eval_mode: ``"sample"`` (a fresh Concrete sample per example),
            ``"expected"`` (``K = P``, deterministic, the authors' evaluation default) or
            ``"threshold"`` (``K = 1[P > 0.5]``).
        truncation: keep only pairs with ``d ≤ truncation`` (mask the rest).
    """

    def __init__(self, epsilon: float = 1.0, learn_epsilon: bool = False, tau: float = 0.5,
                 delta: float = 1e-6, train_mode: KernelMode = "sample", eval_mode: KernelMode = "expected",
                 truncation: float | None = None) -> None:
        super().__init__()
        for name, mode in (("train_mode", train_mode), ("eval_mode", eval_mode)):
            check_argument(name, mode, KERNEL_MODES)
        if not (epsilon > 0 and tau > 0 and delta > 0):
            raise UserError(f"epsilon, tau and delta must be > 0, got {epsilon}, {tau}, {delta}")
        log_eps = torch.tensor(math.log(epsilon))
        if learn_epsilon:
            self.log_epsilon = nn.Parameter(log_eps)
        else:
            self.register_buffer("log_epsilon", log_eps)
        self.tau, self.delta, self.truncation = tau, delta, truncation
        self.train_mode, self.eval_mode = train_mode, eval_mode

    @property
    def epsilon(self) -> Tensor:
        return self.log_epsilon.exp()

    @property
    def mode(self) -> KernelMode:
        return self.train_mode if self.training else self.eval_mode

    @property
    def deterministic(self) -> bool:
        """True when two calls give the same kernel (no sampling): compute it once per forward."""
        return self.mode != "sample"

    def link_probs(self, s_recv: Tensor, s_send: Tensor) -> Tensor:
        """``P_ij = exp(-d(s_i, s_j)/ε)`` ``[..., Uq, Uk]`` (NAC Eq. 2)."""
        return signature_log_kernel(s_recv, s_send, self.epsilon)[0].exp()

    def forward(self, s_recv: Tensor, s_send: Tensor, batch_size: int = 1, *,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``(bias, key_mask)`` for :func:`attend`: ``bias = log K̂`` ``[B|1, 1, Uq, Uk]`` (one kernel
        shared by all heads) and a bool mask of the same shape, or None when nothing is masked.
        Signatures ``[(B,) U, d_sig]``; a sampled kernel is drawn per example (``batch_size``).
        ``mask``: optional bool ``[(B,) Uq, Uk]`` of allowed pairs (e.g. kept edges)."""
        log_p, trunc = signature_log_kernel(s_recv, s_send, self.epsilon, truncation=self.truncation)
        mask = trunc if mask is None else (mask if trunc is None else mask & trunc)
        mode = self.mode
        if mode == "sample":
            shape = (batch_size, *log_p.shape[-2:]) if log_p.dim() == 2 else log_p.shape
            log_k = concrete_log_sample(log_p.expand(shape), self.tau)
        elif mode == "threshold":
            keep = log_p > math.log(0.5)
            log_k, mask = torch.zeros_like(log_p), keep if mask is None else mask & keep
        else:
            log_k = log_p
        log_k_hat = normalize_log_kernel(log_k, dim=-1, delta=self.delta, mask=mask)
        return _heads_axis(log_k_hat), None if mask is None else _heads_axis(mask)

    def extra_repr(self) -> str:
        return (f"tau={self.tau}, delta={self.delta}, train_mode={self.train_mode}, "
                f"eval_mode={self.eval_mode}, truncation={self.truncation}")


def _heads_axis(x: Tensor) -> Tensor:
    """``[(B,) Uq, Uk] → [B|1, 1, Uq, Uk]``: broadcast over heads."""
    return (x if x.dim() == 3 else x.unsqueeze(0)).unsqueeze(1)


class EdgeMaskedKernel(nn.Module):
    """A kernel restricted to a fixed set of edges (NAC App. F, "Eliminating connections
    between modules"): wraps a :class:`SignatureKernel` and ANDs its mask with ``edge_mask``
    ``[U, U]`` (bool, True = kept, saved as a buffer). Installed on a model from outside
    (:func:`modwire.analysis.eliminate_edges`); ``link_probs`` reports eliminated pairs as 0."""

    def __init__(self, kernel: SignatureKernel, edge_mask: Tensor) -> None:
        super().__init__()
        if edge_mask.dtype != torch.bool or edge_mask.dim() != 2 or edge_mask.shape[0] != edge_mask.shape[1]:
            raise UserError(f"edge_mask must be a square bool [U, U] tensor, got {edge_mask.dtype} "
                            f"{list(edge_mask.shape)}")
        # Not registered as a submodule: the wrapped kernel belongs to (and is saved with) the
        # model; this wrapper adds only the edge mask (state-dict key ``…edge_mask``).
        object.__setattr__(self, "inner", kernel)
        self.register_buffer("edge_mask", edge_mask.clone())

    @property
    def deterministic(self) -> bool:
        return self.inner.deterministic

    def link_probs(self, s_recv: Tensor, s_send: Tensor) -> Tensor:
        return self.inner.link_probs(s_recv, s_send).masked_fill(~self.edge_mask, 0.0)

    def forward(self, s_recv: Tensor, s_send: Tensor, batch_size: int = 1) -> tuple[Tensor, Tensor | None]:
        return self.inner(s_recv, s_send, batch_size, mask=self.edge_mask)
