"""The Associative Transformer's global workspace layer (AiT §4, Figure 1a).

One layer, read top to bottom like AiT §4. Its input ``h [B, N, E]`` is what the block hands it
(the AiT block: the FFN's output, :mod:`modwire.models.ait`); it returns ``Ξ^{t+1} = Ξ^t + Ξ̂^t``
(§4.3's skip connection), which the block adds to its residual stream.

0. ``Ξ^t = LN(h)`` (the authors' ``ait.py``: the FFN's output LayerNorm, ``ModularNN.norm``; the
   paper does not say where the LayerNorms and residuals of the block sit).
1. **squash** (§4.1): the tokens ``Ξ [B, N, E]`` become one pool of ``B·N`` patches, so patches of
   different samples compete for the workspace. ``pool="sample"`` keeps one pool per sample
   (a sample competes only with its own patches: predictions never depend on the rest of the
   batch); ``pool="global"`` all-gathers the pool over DistributedDataParallel processes in
   training (the paper's global batch: one pool of all processes' patches); ``"batch"`` pools
   each process's own samples, and every process stores the Eq. 4 update with the mean ``γ̂``
   of the processes (:func:`_mean_over_processes`). Evaluation pools each process's own batch.
2. **low-rank explicit memory** ``γ ∈ R^{M×D}`` (§4.1), a buffer (state, not a parameter: it
   is written by Eq. 4, never by the optimiser), initialised as in Table 3 (:func:`init_memory`).
3. **bottleneck attention** (Eq. 3): per head ``i = 1..A``, the slots query the pool,
   ``A_i = softmax(γ W^Q_i (Ξ W^K_i)ᵀ / √D)``; each head has the slot width ``D``
   (``W^Q_i: D → D``, ``W^K_i, W^V_i: E → D``: the down-projection of §4.1) and the scale is the
   ``√D`` Eq. 3 prints; ``W^O: A·D → D``; none of the four projections has a bias (Eq. 1-3 print
   none, and the authors' code has none). Each slot keeps its ``k`` highest entries
   (``top-k(A_i)``: the entries of the softmax over the whole pool, not renormalised; the shared
   kernel's ``attend(topk=k, topk_softmax="all")``), ``head_i = top-k(A_i) Ξ W^V_i`` and
   ``γ̂ = LN(Dropout(Concat(head_1..head_A) W^O))`` (Eq. 3; the Dropout, ``write_dropout`` 0.1 in
   training, and the LayerNorm's eps 1e-6 are the authors' ``MHA.py``: the paper gives neither).
   Top-k needs the explicit weights, so this attention runs the kernel's explicit path, not
   SDPA's fused one (the model's other attention calls do).
4. **memory update** (Eq. 4): ``γ^{t+1} = normalize(α γ^t + (1-α) γ̂^t)``, each slot scaled to
   unit L2 norm (implementation notes §4: "row L2-normalisation"). In training the buffer keeps
   ``γ^{t+1}`` (detached; with per-sample pools, the update with the mean of the ``γ̂`` of the
   batch). In evaluation ``γ^{t+1}`` is computed for the current batch's retrieval and **not
   kept** (§4.2: "the explicit memory is frozen ... any memory update from the bottleneck
   attention will not be retained"; Figure 8 (1)); ``memory_forward = False`` skips the write
   entirely and retrieves from the stored ``γ^t`` (Figure 8 (2), Tables 7-8).
5. **balance loss** (Eq. 5-6, :func:`balance_loss`), kept in ``self.balance`` after a training
   forward.
6. **Hopfield retrieval** (Eq. 7-8): the patterns ``f_LT(γ^{t+1})`` (a learnable linear map
   ``D → E``) are the attractors; ``steps`` updates ``ξ ← softmax(β ξ f_LT(γ)ᵀ) f_LT(γ)`` (the
   shared kernel with ``scale=β``), then the skip connection ``Ξ^{t+1} = Ξ̂ + Ξ``.
   ``retrieval="attention"`` is Table 2's "W/O Hopfield": a multi-head attention with the
   tokens as queries and ``f_LT(γ^{t+1})`` as keys and values.

Where this departs from the letter of the paper or from the authors' code (each a documented
choice or option; docs/ait.md's departures table):

* Gradient through the memory written in the same step (``write_grad=True``, default): the
  retrieval of the current batch uses ``γ^{t+1}`` with its graph, so ``W^Q, W^K, W^V, W^O``
  and the LayerNorm of Eq. 3 learn from the task loss, as the end-to-end training of §1 / §4
  describes. The authors' code detaches the write (``write_grad=False``): there ``W^V``, ``W^O``
  and the write's LayerNorm never train and ``W^Q, W^K`` learn only from the balance loss; here
  they are then built frozen (``requires_grad=False``: the same training, and no parameter that
  never gets a gradient, which DistributedDataParallel rejects).
* ``write_residual=True``: the authors' ``γ̂ = LN(γ^t + Dropout(Concat(heads) W^O))``, a residual
  over the current memory that Eq. 3 does not print (default False: Eq. 3 as printed).
* ``bottleneck_softmax="kept"``: each slot's weights renormalised over its ``k`` kept patches
  (the authors' top-k; default ``"all"``: Eq. 3's ``top-k(A_i)`` of the softmax over the pool).
* Options in neither the paper nor the authors' code, each off by default: ``bias`` (biases on
  ``W^Q, W^K, W^V, W^O``; modwire's workspace before issue 23), ``head_split`` (``A`` heads of
  width ``D/A`` with scale ``1/√(D/A)``, modwire's former reading of Eq. 1), ``normalize_update``
  (``γ̂`` scaled to unit slots before Eq. 4).

**Memory collapse** (measured with modwire's workspace before issue 35, which read ``LN(x)`` after
the FFN's residual and added only ``Ξ̂``): with Eq. 3-4 as printed the slots became one vector in
training (mean cosine between slots → 1); biases on the projections collapse the memory even
with frozen random weights (tested below, unchanged); the authors' residual write kept the
slots apart on digits and Fashion-MNIST but not on Triangle. The measurements
(``modwire.experiments.ait_memory_collapse``, ``modwire.experiments.ait_analysis``) are in
``experiments/results/ait_memory_collapse_*/`` and ``experiments/results/ait_analysis/`` and in
docs/ait.md; whether the memory collapses under the current block is not measured yet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import ModulatedAttention, attend, merge_heads, split_heads
from ..errors import UserError
from ..fields import check_argument

POOLS = ("batch", "sample", "global")
MEMORY_INITS = ("gaussian", "sinusoidal", "uniform", "identity")
RETRIEVALS = ("hopfield", "attention")
BOTTLENECK_SOFTMAX = ("all", "kept")       # Eq. 3's top-k of the full softmax; renormalised over the kept


@dataclass
class WorkspaceRecord:
    """What one workspace layer computed (``forward(..., record=True)``).

    ``weights [P, A, M, L]``: bottleneck attention after top-k (Eq. 3; zero where a slot did not
    select the position), ``P`` pools (1 for the squashed batch, ``B`` per sample), ``L`` pool
    length; squashed position ``l = b·N + n``. None when the write was skipped
    (``memory_forward = False`` in evaluation). ``memory [P, M, D]``: the ``γ^{t+1}`` the
    retrieval used. ``energy_before`` / ``energy_after [B, N]``: Eq. 7 of each token before and
    after the Hopfield retrieval (None for ``retrieval="attention"``)."""

    weights: Tensor | None
    memory: Tensor
    energy_before: Tensor | None
    energy_after: Tensor | None
    num_tokens: int


def init_memory(kind: str, num_slots: int, slot_dim: int, generator: torch.Generator | None = None) -> Tensor:
    """AiT Table 3 / §5.5 memory initialisations, ``[M, D]``: ``gaussian`` N(0, 1) (default);
    ``sinusoidal`` positional embedding (Vaswani et al. 2017: ``sin`` on even, ``cos`` on odd
    columns of slot ``m``); ``uniform`` U(-b, b) with ``b = 1/√(M+D)`` (Graves et al. 2014);
    ``identity`` ones on the diagonal."""
    m, d = num_slots, slot_dim
    if kind == "gaussian":
        return torch.randn(m, d, generator=generator)
    if kind == "uniform":
        bound = 1 / math.sqrt(m + d)
        return torch.rand(m, d, generator=generator) * (2 * bound) - bound
    if kind == "identity":
        return torch.eye(m, d)
    if kind == "sinusoidal":
        pos = torch.arange(m, dtype=torch.float64).unsqueeze(1)                 # [M, 1]
        freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)      # [ceil(D/2)]
        out = torch.zeros(m, d, dtype=torch.float64)
        out[:, 0::2] = torch.sin(pos * freq)
        out[:, 1::2] = torch.cos(pos * freq[: d // 2])
        return out.float()
    check_argument("memory_init", kind, MEMORY_INITS)
    raise AssertionError(kind)                     # unreachable: every MEMORY_INITS kind returns above


def balance_loss(weights: Tensor, eps: float = 1e-10) -> Tensor:
    """AiT Eq. 5-6, summed over heads (without σ), averaged over pools. ``weights [P, A, M, L]``.

    Per head ``i``: importance ``Σ_j A_ijl`` and load ``Σ_j [A_ijl > 0]`` of each position ``l``;
    ``ℓ_i = Var(importance) / (mean² + ε) + Var(load) / (mean² + ε)`` over the ``L`` positions.
    Eq. 6's "Var" is the unbiased variance, computed in at least float32 (the authors' ``MHA.py``:
    ``x.float().var()``); a pool of one position has no variance (0, as theirs). Zero when every
    position carries the same importance and load."""
    weights = weights.to(torch.promote_types(weights.dtype, torch.float32))
    importance = weights.sum(dim=-2)                                    # [P, A, L]
    load = (weights > 0).sum(dim=-2).to(weights.dtype)                  # [P, A, L]

    def cv2(t: Tensor) -> Tensor:
        if t.shape[-1] == 1:
            return t.new_zeros(t.shape[:-1])
        return t.var(dim=-1, correction=1) / (t.mean(dim=-1) ** 2 + eps)

    return (cv2(importance) + cv2(load)).sum(dim=-1).mean()


def hopfield_energy(xi: Tensor, patterns: Tensor, beta: float) -> Tensor:
    """AiT Eq. 7: ``E(ξ) = -lse(β, Xξ) + ½ ξ·ξ + β⁻¹ log M + ½ ζ²`` with ``lse(β, z) = β⁻¹ log Σ_i
    exp(β z_i)`` and ``ζ = max_i ‖X_i‖`` (Eq. 8). ``xi [..., S, E]``, ``patterns X [..., M, E]``
    → ``[..., S]``."""
    m = patterns.shape[-2]
    lse = torch.logsumexp(beta * (xi @ patterns.transpose(-1, -2)), dim=-1) / beta          # [..., S]
    zeta = patterns.norm(dim=-1).amax(dim=-1, keepdim=True)                                 # [..., 1]
    return -lse + 0.5 * (xi * xi).sum(-1) + math.log(m) / beta + 0.5 * zeta ** 2


class GlobalWorkspace(nn.Module):
    """AiT §4 global workspace layer (module docstring). ``h [B, N, E] → (Ξ + Ξ̂ [B, N, E], record)``
    with ``Ξ = LN(h)``.

    ``dim`` E; ``num_slots`` M; ``slot_dim`` D; ``num_heads`` A bottleneck heads (each of width D; with ``head_split`` they divide D);
    ``bottleneck_size`` k (0: dense, Table 2 "W/O bottleneck"); ``alpha`` EWMA factor (Eq. 4);
    ``beta`` inverse temperature and ``steps`` Hopfield updates (Eq. 7-8); ``retrieval_heads``
    heads and ``qv_bias`` query/value biases of the "W/O Hopfield" attention; ``eps`` of Eq. 6;
    ``write_dropout`` the Dropout on ``Concat(heads) W^O`` in training; ``bias``, ``head_split``,
    ``write_residual``, ``bottleneck_softmax``, ``normalize_update``, ``write_grad``: the options of
    the module docstring."""

    def __init__(self, dim: int, *, num_slots: int = 32, slot_dim: int = 32, num_heads: int = 8,
                 bottleneck_size: int = 512, alpha: float = 0.9, beta: float = 1.0, steps: int = 1,
                 pool: str = "batch", memory_init: str = "gaussian", retrieval: str = "hopfield",
                 retrieval_heads: int = 8, qv_bias: bool = False, write_grad: bool = True, eps: float = 1e-10,
                 bottleneck_softmax: str = "all", normalize_update: bool = False, bias: bool = False,
                 head_split: bool = False, write_residual: bool = False, write_dropout: float = 0.1) -> None:
        super().__init__()
        if head_split and slot_dim % num_heads:
            raise UserError(f"slot_dim ({slot_dim}) must be divisible by the bottleneck heads ({num_heads}) "
                            f"with head_split")
        for name, value, choices in (("pool", pool, POOLS), ("memory_init", memory_init, MEMORY_INITS),
                                     ("retrieval", retrieval, RETRIEVALS),
                                     ("bottleneck_softmax", bottleneck_softmax, BOTTLENECK_SOFTMAX)):
            check_argument(name, value, choices, "GlobalWorkspace")
        self.num_heads, self.bottleneck_size, self.alpha, self.beta, self.steps = \
            num_heads, bottleneck_size, alpha, beta, steps
        self.pool, self.memory_init, self.write_grad, self.eps = pool, memory_init, write_grad, eps
        self.bottleneck_softmax, self.normalize_update = bottleneck_softmax, normalize_update
        self.head_split, self.write_residual = head_split, write_residual
        self.head_dim = slot_dim // num_heads if head_split else slot_dim   # d_h: D (AiT Eq. 3) or D / A
        inner = num_heads * self.head_dim                                   # A heads side by side
        self.memory_forward = True          # evaluation: write γ^{t+1} for this batch (Figure 8 (1))
        self.balance: Tensor | None = None  # Eq. 6 of the last training forward
        self.norm = nn.LayerNorm(dim)                                       # Ξ = LN(h)
        self.q = nn.Linear(slot_dim, inner, bias=bias)                      # W^Q_i, i = 1..A  (Eq. 3)
        self.k, self.v = nn.Linear(dim, inner, bias=bias), nn.Linear(dim, inner, bias=bias)   # W^K_i, W^V_i
        self.o = nn.Linear(inner, slot_dim, bias=bias)                      # W^O
        self.write_dropout = nn.Dropout(write_dropout)                      # the authors' MHA.py
        self.write_norm = nn.LayerNorm(slot_dim, eps=1e-6)                  # Eq. 3's LN (eps: the authors')
        self.up = nn.Linear(slot_dim, dim)                                  # f_LT
        self.retrieve = ModulatedAttention(dim, retrieval_heads, qv_bias=qv_bias) if retrieval == "attention" \
            else None
        self.register_buffer("memory", init_memory(memory_init, num_slots, slot_dim))
        if not write_grad:          # the detached write: no path from any loss to these (they stay as drawn)
            for p in (*self.v.parameters(), *self.o.parameters(), *self.write_norm.parameters()):
                p.requires_grad_(False)

    @torch.no_grad()
    def reset_memory(self, generator: torch.Generator | None = None) -> None:
        """Draw the memory afresh (Table 2 "Reset memory": at every epoch)."""
        m, d = self.memory.shape
        self.memory.copy_(init_memory(self.memory_init, m, d, generator))

    def forward(self, h: Tensor, *, record: bool = False) -> tuple[Tensor, WorkspaceRecord | None]:
        dim = self.norm.normalized_shape[0]
        if not isinstance(h, Tensor) or h.dim() != 3 or h.shape[-1] != dim or not h.is_floating_point():
            got = f"{h.dtype} {list(h.shape)}" if isinstance(h, Tensor) else type(h).__name__
            raise UserError(f"GlobalWorkspace: expected float tokens [B, N, {dim}], got {got}")
        b, n, _ = h.shape
        xi = self.norm(h)                                                   # Ξ^t = LN(h)  [B, N, E]
        gamma = self.memory.clone()                                         # γ^t [M, D] (the buffer is updated below)
        weights = None
        if self.training or self.memory_forward:
            gamma_hat, weights = self.write(self.squash(xi), gamma, need_weights=self.training or record)
            new = self.update(gamma, gamma_hat)                             # γ^{t+1}  [P, M, D]
        else:                                                               # Figure 8 (2)
            gamma_hat, new = None, gamma.unsqueeze(0)                       # [1, M, D]
        if self.training:
            self.balance = balance_loss(weights, self.eps)
            self.store(gamma, gamma_hat, new)
        if not self.write_grad:
            new = new.detach()                                              # the authors' detached write path
        patterns = self.up(new)                                             # f_LT(γ^{t+1})  [P, M, E]
        if patterns.shape[0] == 1:                                          # one memory for the whole batch
            patterns = patterns.expand(b, -1, -1)                           # [B, M, E] (a view)
        out, before, after = self.read(xi, patterns, energies=record)
        rec = WorkspaceRecord(None if weights is None else weights.detach(), new.detach(), before, after, n) \
            if record else None
        return xi + out, rec                                                # Ξ^{t+1} = Ξ^t + Ξ̂^t (§4.3)

    def squash(self, xi: Tensor) -> Tensor:
        """§4.1: ``[B, N, E] → [P, L, E]``: one pool of ``B·N`` patches (``P = 1``), one per
        sample (``"sample"``: ``[B, N, E]``), or the pools of all processes (``"global"``)."""
        if self.pool == "sample":
            return xi
        pool = xi.reshape(1, -1, xi.shape[-1])                              # [1, B·N, E]
        if self.pool == "global" and self.training and _world() > 1:        # every process's patches
            pool = _GatherPool.apply(pool)                                  # [1, W·B·N, E], differentiable
        return pool

    def write(self, pool: Tensor, gamma: Tensor, *, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Eq. 3: ``pool [P, L, E]``, ``γ^t [M, D]`` → ``(γ̂^t [P, M, D], A [P, H, M, L] or None)``,
        ``γ̂ = LN(Dropout(Concat(heads) W^O))`` (``write_residual``: ``LN(γ + Dropout(...))``); the
        softmax scale is ``1/√d_h`` (``1/√D`` as Eq. 3 prints, or ``1/√(D/A)`` with ``head_split``)."""
        p, h = pool.shape[0], self.num_heads
        q = split_heads(self.q(gamma), h).expand(p, -1, -1, -1)             # [P, A, M, d_h]
        k, v = split_heads(self.k(pool), h), split_heads(self.v(pool), h)   # [P, A, L, d_h]
        topk = self.bottleneck_size or None
        heads, w = attend(q, k, v, topk=topk, topk_softmax=self.bottleneck_softmax,
                          return_weights=need_weights)                      # [P, A, M, d_h]
        out = self.write_dropout(self.o(merge_heads(heads)))                # Dropout(Concat(heads) W^O)  [P, M, D]
        if self.write_residual:                                             # the authors' code, not Eq. 3
            out = gamma + out
        return self.write_norm(out), w                                      # γ̂^t = LN(...)

    def update(self, gamma: Tensor, gamma_hat: Tensor) -> Tensor:
        """Eq. 4: ``normalize(α γ^t + (1-α) γ̂^t)``, each slot to unit L2 norm (``normalize_update``:
        ``γ̂`` scaled to unit slots first; module docstring)."""
        if self.normalize_update:
            gamma_hat = F.normalize(gamma_hat, dim=-1)
        return F.normalize(self.alpha * gamma + (1 - self.alpha) * gamma_hat, dim=-1)

    @torch.no_grad()
    def store(self, gamma: Tensor, gamma_hat: Tensor, new: Tensor) -> None:
        """Keep ``γ^{t+1}`` in the buffer (training). One pool on every process: the ``new`` the
        retrieval used (Eq. 4 computed once); per-sample pools or per-process pools under DDP: Eq. 4
        with the mean ``γ̂`` (of the batch, then of the processes: :func:`_mean_over_processes`)."""
        if new.shape[0] == 1 and (self.pool == "global" or _world() == 1):
            self.memory.copy_(new[0])
        else:
            self.memory.copy_(self.update(gamma, _mean_over_processes(gamma_hat.mean(dim=0), self.pool)))

    def read(self, xi: Tensor, patterns: Tensor, *, energies: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Eq. 7-8 (or "W/O Hopfield"): ``xi [B, N, E]``, ``patterns [B, M, E]`` → ``Ξ̂ [B, N, E]``
        and, with ``energies``, Eq. 7 before and after ``[B, N]``."""
        if self.retrieve is not None:
            out, _ = self.retrieve(xi, patterns)
            return out, None, None
        state = xi
        for _ in range(self.steps):                                         # ξ ← softmax(β ξ Xᵀ) X
            state, _ = attend(state, patterns, patterns, scale=self.beta)
        if not energies:
            return state, None, None
        with torch.no_grad():
            return state, hopfield_energy(xi, patterns, self.beta), hopfield_energy(state, patterns, self.beta)


class _GatherPool(torch.autograd.Function):
    """``pool="global"``: every process's pool ``[1, L, E]`` concatenated along the pool axis
    (equal ``L`` on every process: the trainer drops ragged training batches). Every process's
    loss reads every patch, so the gradient of a process's own slice is the sum over processes
    of the gradients of the gathered pool; after DDP averages the parameter gradients this is
    exactly the single-process gradient of the global batch (tested on 2 processes)."""

    @staticmethod
    def forward(ctx, pool: Tensor) -> Tensor:
        import torch.distributed as dist

        parts = [torch.empty_like(pool) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, pool.contiguous())
        ctx.rank, ctx.length = dist.get_rank(), pool.shape[1]
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        import torch.distributed as dist

        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[:, ctx.rank * ctx.length:(ctx.rank + 1) * ctx.length]


def _mean_over_processes(gamma_hat: Tensor, pool: str) -> Tensor:
    """The ``γ̂`` whose Eq. 4 update every process stores: under DDP with per-process pools
    (``"batch"``, ``"sample"``) the mean over processes, so each process keeps the same memory
    (DDP broadcasts rank 0's buffers before each forward: without this, the other processes'
    writes would be lost); ``"global"`` pools already agree."""
    if pool == "global" or _world() == 1:
        return gamma_hat
    import torch.distributed as dist

    gamma_hat = gamma_hat.detach().clone()
    dist.all_reduce(gamma_hat)
    return gamma_hat / dist.get_world_size()


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
