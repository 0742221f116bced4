"""The signature kernel of SKMDPA (NAC Eq. 2-3).

Link probabilities from signatures (NAC Eq. 2)::

    d(s_i, s_j) = 1 - cos(s_i, s_j),        P_ij = exp(-d(s_i, s_j) / ε)

A kernel ``K_ij ~ Concrete(P_ij, τ)`` (a RelaxedBernoulli, reparameterised) and its
δ-normalised form ``K̂_ij = K_ij / (δ + Σ_j K_ij)`` (NAC Eq. 3), which enters the
attention logits as the additive bias ``log K̂_ij``.

Everything is computed in the log domain: ``log P = -d/ε`` and
``log K = logsigmoid(z)`` are exact and finite, so no ``log(0)`` appears except
where a pair is *masked* (truncation, or an explicit edge mask). Masked pairs get
a large finite negative bias rather than ``-inf``, and receivers whose senders are
all masked are reported so the attention can return a zero message instead of the
NaN of a softmax over ``-inf`` (a bug of the authors' code). Because masking
multiplies ``K`` by 0 instead of replacing the distance by ``∞``, gradients still
reach the signatures through the kept pairs.

Note: the row normaliser ``log(δ + Σ_j K_ij)`` is constant in ``j`` and therefore
cancels in ``softmax_j``; it is kept so that the bias is literally ``log K̂``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KernelMode = Literal["expected", "sample", "threshold"]
KERNEL_MODES = ("expected", "sample", "threshold")


def mask_value(dtype: torch.dtype) -> float:
    """A large finite negative logit bias: exp() of it is 0, adding scores stays finite."""
    return -1e9 if dtype in (torch.float32, torch.float64) else torch.finfo(dtype).min / 4


def cosine_distance(s_recv: Tensor, s_send: Tensor) -> Tensor:
    """``d_ij = 1 - cos(s_i, s_j)``: ``[..., Uq, Uk]`` from ``[..., Uq, d]`` and ``[..., Uk, d]``."""
    a = F.normalize(s_recv, dim=-1)
    b = F.normalize(s_send, dim=-1)
    return (1.0 - a @ b.transpose(-1, -2)).clamp_min(0.0)


@dataclass
class KernelBias:
    """What the kernel hands to the attention.

    log_kernel: ``[B|1, 1, Uq, Uk]`` additive logit bias ``log K̂`` (broadcast over heads:
        one kernel sample is shared by all heads).
    has_sender: ``[B|1, Uq]`` bool, False for a receiver all of whose senders are
        masked; None when no pair is masked.
    """

    log_kernel: Tensor
    has_sender: Tensor | None = None


class SignatureKernel(nn.Module):
    """Stochastic signature kernel (NAC Eq. 2-3).

    Args:
        epsilon: bandwidth ε (NAC Table 4: 1.0). Kept positive by a log parameterisation.
        learn_epsilon: make ε a parameter (the paper treats it as a hyperparameter).
        tau: Concrete temperature τ (NAC Table 4: 0.5).
        delta: δ of Eq. 3.
        train_mode / eval_mode: how the kernel is formed in ``train()`` / ``eval()``:
            ``"sample"`` (a fresh Concrete sample per example), ``"expected"``
            (``K = P``, deterministic, the authors' evaluation default) or
            ``"threshold"`` (``K = 1[P > 0.5]``).
        truncation: if set, keep only pairs with ``d ≤ truncation`` (mask the rest).
    """

    def __init__(
        self,
        epsilon: float = 1.0,
        learn_epsilon: bool = False,
        tau: float = 0.5,
        delta: float = 1e-6,
        train_mode: KernelMode = "sample",
        eval_mode: KernelMode = "expected",
        truncation: float | None = None,
    ) -> None:
        super().__init__()
        for name, mode in (("train_mode", train_mode), ("eval_mode", eval_mode)):
            if mode not in KERNEL_MODES:
                raise ValueError(f"{name} must be one of {KERNEL_MODES}, got {mode!r}")
        if epsilon <= 0 or tau <= 0 or delta <= 0:
            raise ValueError(f"epsilon, tau and delta must be > 0, got {epsilon}, {tau}, {delta}")
        log_eps = torch.tensor(math.log(epsilon))
        if learn_epsilon:
            self.log_epsilon = nn.Parameter(log_eps)
        else:
            self.register_buffer("log_epsilon", log_eps)
        self.tau, self.delta = tau, delta
        self.train_mode, self.eval_mode = train_mode, eval_mode
        self.truncation = truncation

    @property
    def epsilon(self) -> Tensor:
        return self.log_epsilon.exp()

    @property
    def mode(self) -> KernelMode:
        return self.train_mode if self.training else self.eval_mode

    def log_link_probs(self, s_recv: Tensor, s_send: Tensor) -> tuple[Tensor, Tensor]:
        """``(log P, d)``, both ``[..., Uq, Uk]`` (NAC Eq. 2)."""
        d = cosine_distance(s_recv, s_send)
        return -d / self.epsilon, d

    def link_probs(self, s_recv: Tensor, s_send: Tensor) -> Tensor:
        """``P_ij = exp(-d(s_i, s_j)/ε)``, ``[..., Uq, Uk]``."""
        return self.log_link_probs(s_recv, s_send)[0].exp()

    def log_kernel(self, log_p: Tensor, batch_size: int, mode: KernelMode) -> Tensor:
        """``log K`` under a mode; ``[B, Uq, Uk]`` when sampling, else like ``log_p``.
        ``threshold`` returns 0 where ``P > 0.5`` and ``-inf`` elsewhere."""
        if mode == "expected":
            return log_p
        if mode == "threshold":
            return torch.zeros_like(log_p).masked_fill(log_p <= math.log(0.5), float("-inf"))
        # Concrete(P, τ): K = σ((logit P + logistic noise) / τ). logit P = log P - log(1-P),
        # with log(1-P) = log(-expm1(log P)); the clamp keeps P_ii = 1 (d = 0) finite.
        log_p = log_p.clamp(max=-1e-6)
        logit_p = log_p - torch.log(-torch.expm1(log_p))
        shape = (batch_size, *logit_p.shape[-2:]) if logit_p.dim() == 2 else logit_p.shape
        u = torch.rand(shape, device=log_p.device, dtype=log_p.dtype).clamp_(1e-6, 1 - 1e-6)
        noise = torch.log(u) - torch.log1p(-u)
        return F.logsigmoid((logit_p + noise) / self.tau)

    def forward(self, s_recv: Tensor, s_send: Tensor, batch_size: int = 1,
                mask: Tensor | None = None) -> KernelBias:
        """Attention bias ``log K̂`` for receivers ``s_recv`` ``[(B,) Uq, d_sig]`` and
        senders ``s_send`` ``[(B,) Uk, d_sig]``. ``mask``: optional bool ``[(B,) Uq, Uk]``,
        True where an edge is allowed."""
        log_p, d = self.log_link_probs(s_recv, s_send)
        mode = self.mode
        log_k = self.log_kernel(log_p, batch_size, mode)
        if mode == "threshold":
            allowed = torch.isfinite(log_k)
            mask = allowed if mask is None else mask & allowed
        if self.truncation is not None:
            keep = d <= self.truncation
            mask = keep if mask is None else mask & keep
        has_sender = None
        if mask is not None:
            # Finite fill (not -inf): keeps logsumexp and its gradient finite for empty rows.
            log_k = log_k.masked_fill(~mask, mask_value(log_k.dtype))
            has_sender = mask.any(dim=-1)
        # log K̂ = log K - log(δ + Σ_j K)   (NAC Eq. 3)
        log_delta = torch.full_like(log_k[..., :1], math.log(self.delta))
        log_k_hat = log_k - torch.logaddexp(torch.logsumexp(log_k, dim=-1, keepdim=True), log_delta)
        if log_k_hat.dim() == 2:
            log_k_hat = log_k_hat.unsqueeze(0)
        if has_sender is not None and has_sender.dim() == 1:
            has_sender = has_sender.unsqueeze(0)
        return KernelBias(log_k_hat.unsqueeze(1), has_sender)

    def extra_repr(self) -> str:
        return (f"tau={self.tau}, delta={self.delta}, train_mode={self.train_mode}, "
                f"eval_mode={self.eval_mode}, truncation={self.truncation}")
