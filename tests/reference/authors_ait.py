"""A literal float64 re-statement of the AiT authors' released model, written from reading their
code (``vit_hn.py``'s ViT and Transformer, ``ait.py``'s ModularNN and MemoryUpdate, ``MHA.py``'s
MultiHeadAttention and ScaledDotProductAttention, and hflayers' ``Hopfield`` with static patterns,
scaling β and no projections), independently of modwire: loops over heads, slots, patches and
samples as their code loops or as the equations read, one parameter dict laid out under their
names (:func:`parameter_shapes`).

Their model, one forward (``sparse=True``: the AiT; ``sparse=False``: their ViT of the same file):

* patches flattened in (row, column, channel) order, LayerNorm → Linear → LayerNorm; their
  ``pos_embedding``, ``cls_token`` and ``to_patch_embedding_cnn`` are created and never used;
* per block ``x = x + Attn(LN x)`` (``to_qkv`` without bias, heads of ``dim_head``, ``to_out``
  with bias), then
  - AiT: ``Ξ = LN(fc2(GELU(fc1(LN x))))`` (``ModularNN``), the memory written from the squashed
    ``Ξ`` (``MemoryUpdate``), ``x = x + Ξ + Hopfield(Ξ)`` with the patterns ``fc3(γ^{t+1})``;
  - ViT: ``x = x + FFN(LN x)``;
* classifier: LayerNorm over the flattened ``N·E`` features, then Linear.

The memory write (``MHA.py``): queries ``γ^t W^Q``, keys and values ``Ξ W^K``, ``Ξ W^V``, each of
the ``A`` heads ``D`` wide; per head the logits ``(q / √D) kᵀ`` ``[M, L]``, each slot's top-k
logits softmaxed (the rest 0); the heads are stacked as ``[M, A, D]`` and then read as
``[M, D·A]`` (their ``transpose(1, 2).view``: column ``d·A + a``, heads interleaved), ``fc`` (W^O),
their ``Dropout(0.1)`` (left out here: the comparisons run with it off), ``+ γ^t``, LayerNorm with
eps 1e-6; then ``γ^{t+1} = normalize(α γ^t + (1-α) γ̂)`` with ``γ̂`` detached. Per head the
balance loss ``(cv²(importance) + cv²(loads)) · 1e-2``, ``cv²(x) = var(x) / (mean(x)² + 1e-10)``
with the unbiased variance (they compute it in float32; here in float64), 0 for one position.

Two of their float32 details are taken at their intended values: ``α`` (their buffer
``torch.tensor(0.9)``, 0.8999999762 in float32) is 0.9, and ``cv²`` is float64.

``inplace_memory``: their ``ait.py`` passes ``memory.data`` as the query and then overwrites that
storage in place (``mul_``, ``add_``) before the backward, so autograd's saved input of ``W^Q``
is ``α γ^t + (1-α) γ̂`` (the EWMA before Eq. 4's normalisation) and their ``dL/dW^Q`` is taken
there, not at ``γ^t``: with ``inplace_memory=True`` this re-statement does the same (to show the
bug); the comparisons with modwire use the correct gradient (``False``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .nac import layer_norm

UNUSED = ("to_patch_embedding_cnn.0.weight", "to_patch_embedding_cnn.0.bias", "pos_embedding", "cls_token")


@dataclass(frozen=True)
class AuthorsConfig:
    """Their hyperparameter names: ``dim`` E (their ``hidden_dim``), ``depth`` (``n_layer``),
    ``heads``, ``dim_head`` (their ViT's default 64 = 768 / 12), ``mlp_dim``, ``memory_head`` A,
    ``memory_dim`` D, ``pattern_size`` M, ``bottleneck`` k, ``beta`` β, ``sparse``."""

    image_size: int = 8
    patch_size: int = 2
    channels: int = 3
    num_classes: int = 3
    dim: int = 16
    depth: int = 2
    heads: int = 2
    dim_head: int = 8
    mlp_dim: int = 24
    memory_head: int = 3
    memory_dim: int = 6
    pattern_size: int = 5
    bottleneck: int = 7
    beta: float = 1.0
    alpha: float = 0.9
    sparse: bool = True

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def parameter_shapes(c: AuthorsConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of their model, by their name (``net.named_parameters()``), with its shape;
    the memory (``...memoryupdate.memory``) is a Parameter with ``requires_grad=False`` there."""
    pd, e, n, inner = c.channels * c.patch_size ** 2, c.dim, c.num_patches, c.heads * c.dim_head
    a, d = c.memory_head, c.memory_dim
    s = {"to_patch_embedding.1.weight": (pd,), "to_patch_embedding.1.bias": (pd,),
         "to_patch_embedding.2.weight": (e, pd), "to_patch_embedding.2.bias": (e,),
         "to_patch_embedding.3.weight": (e,), "to_patch_embedding.3.bias": (e,),
         "to_patch_embedding_cnn.0.weight": (768, 3, 5, 5), "to_patch_embedding_cnn.0.bias": (768,),  # as written
         "pos_embedding": (1, n + 1, e), "cls_token": (1, 1, e)}
    for i in range(c.depth):
        at, ff = f"transformer.layers.{i}.0.", f"transformer.layers.{i}.1."
        s.update({at + "norm.weight": (e,), at + "norm.bias": (e,), at + "fn.to_qkv.weight": (3 * inner, e),
                  at + "fn.to_out.0.weight": (e, inner), at + "fn.to_out.0.bias": (e,),
                  ff + "norm.weight": (e,), ff + "norm.bias": (e,)})
        if c.sparse:
            mu = ff + "fn.memoryupdate."
            s.update({ff + "fn.fc1.weight": (c.mlp_dim, e), ff + "fn.fc1.bias": (c.mlp_dim,),
                      ff + "fn.fc2.weight": (e, c.mlp_dim), ff + "fn.fc2.bias": (e,),
                      ff + "fn.fc3.weight": (e, d), ff + "fn.fc3.bias": (e,),
                      ff + "fn.norm.weight": (e,), ff + "fn.norm.bias": (e,),
                      mu + "mha.w_qs.weight": (a * d, d), mu + "mha.w_ks.weight": (a * d, e),
                      mu + "mha.w_vs.weight": (a * d, e), mu + "mha.fc.weight": (d, a * d),
                      mu + "mha.layer_norm.weight": (d,), mu + "mha.layer_norm.bias": (d,),
                      mu + "memory": (c.pattern_size, d)})
        else:
            s.update({ff + "fn.net.0.weight": (c.mlp_dim, e), ff + "fn.net.0.bias": (c.mlp_dim,),
                      ff + "fn.net.3.weight": (e, c.mlp_dim), ff + "fn.net.3.bias": (e,)})
    s.update({"mlp_head.0.weight": (n * e,), "mlp_head.0.bias": (n * e,),
              "mlp_head.1.weight": (c.num_classes, n * e), "mlp_head.1.bias": (c.num_classes,)})
    return s


def init_params(c: AuthorsConfig, seed: int = 0) -> dict[str, Tensor]:
    """Random float64 values for every parameter of :func:`parameter_shapes` (LayerNorm weights
    near 1); all but the memory and the never-used ones require a gradient."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in parameter_shapes(c).items():
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if "norm" in name or name.startswith(("to_patch_embedding.1", "to_patch_embedding.3", "mlp_head.0")):
            t = (1.0 if name.endswith("weight") else 0.0) + 0.2 * t
        elif not name.endswith("memory"):
            t = t * 0.5
        out[name] = t.requires_grad_(not name.endswith("memory") and name not in UNUSED)
    return out


def ln(x: Tensor, p: dict[str, Tensor], name: str, eps: float = 1e-5) -> Tensor:
    return layer_norm(x, eps) * p[name + ".weight"] + p[name + ".bias"]


def linear(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    bias = p.get(name + ".bias")
    return x @ p[name + ".weight"].T + (0 if bias is None else bias)


def gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def softmax(x: Tensor) -> Tensor:
    z = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    return z / z.sum(dim=-1, keepdim=True)


def patches(img: Tensor, c: AuthorsConfig) -> Tensor:
    """``[B, C, S, S] → [B, N, p·p·C]``: their ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')``."""
    p, side = c.patch_size, c.image_size // c.patch_size
    rows = []
    for b in range(img.shape[0]):
        rows.append(torch.stack([img[b, :, r * p:(r + 1) * p, col * p:(col + 1) * p].permute(1, 2, 0).reshape(-1)
                                 for r in range(side) for col in range(side)]))
    return torch.stack(rows)


def self_attention(x: Tensor, p: dict[str, Tensor], pre: str, c: AuthorsConfig) -> Tensor:
    """``vit_hn.py``'s Attention on ``x [B, N, E]`` (already LayerNormed), one head at a time."""
    q, k, v = linear(x, p, pre + "to_qkv").chunk(3, dim=-1)
    dh, heads = c.dim_head, []
    for h in range(c.heads):
        cols = slice(h * dh, (h + 1) * dh)
        attn = softmax(q[..., cols] @ k[..., cols].transpose(-1, -2) * dh ** -0.5)
        heads.append(attn @ v[..., cols])
    return linear(torch.cat(heads, dim=-1), p, pre + "to_out.0")


def cv_squared(x: Tensor) -> Tensor:
    """``MHA.py``'s ``cv_squared``: unbiased variance over the mean squared (+ 1e-10); 0 for one entry."""
    if x.shape[0] == 1:
        return x.new_zeros(())
    mean = x.sum() / x.shape[0]
    var = ((x - mean) ** 2).sum() / (x.shape[0] - 1)
    return var / (mean ** 2 + 1e-10)


def memory_write(memory: Tensor, moe: Tensor, p: dict[str, Tensor], pre: str, c: AuthorsConfig,
                 inplace_memory: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``MemoryUpdate.forward`` and ``MultiHeadAttention`` / ``ScaledDotProductAttention``:
    ``memory γ^t [M, D]`` (their Parameter's storage), ``moe Ξ [L, E]`` → ``(γ^{t+1} [M, D]
    detached, the balance loss · 1e-2, the gates [A, M, L])``."""
    a, d, m, n_pool = c.memory_head, c.memory_dim, c.pattern_size, moe.shape[0]
    query = memory.data if inplace_memory else memory.clone()         # their self.memory.data
    q = linear(query, p, pre + "w_qs").view(m, a, d)                  # [M, A, D]
    k = linear(moe, p, pre + "w_ks").view(n_pool, a, d)
    v = linear(moe, p, pre + "w_vs").view(n_pool, a, d)
    loss, outputs, gates = moe.new_zeros(()), [], []
    for i in range(a):                                                # "for each head"
        attn = (q[:, i] / math.sqrt(d)) @ k[:, i].T                   # [M, L]
        kept = min(c.bottleneck, n_pool)
        rows = []
        for j in range(m):                                            # each slot's top-k logits, softmaxed
            top, idx = attn[j].topk(kept)
            rows.append(torch.zeros(n_pool, dtype=attn.dtype).index_put((idx,), softmax(top)))
        gate = torch.stack(rows)
        outputs.append(gate @ v[:, i])                                # [M, D]
        gates.append(gate)
        importance, loads = gate.sum(0), (gate > 0).sum(0).to(gate.dtype)
        loss = loss + (cv_squared(importance) + cv_squared(loads)) * 1e-2
    stacked = torch.stack(outputs, dim=1)                             # [M, A, D]
    concat = stacked.transpose(1, 2).reshape(m, d * a)                # their view of [M, D, A]: column d·A + a
    gamma_hat = ln(linear(concat, p, pre + "fc") + memory.detach(), p, pre + "layer_norm", eps=1e-6)
    new = c.alpha * memory.detach() + (1 - c.alpha) * gamma_hat.detach()     # their x.data: detached
    new = new / new.pow(2).sum(1, keepdim=True).pow(0.5)
    if inplace_memory:                # their mul_ / add_ on the storage the query's linear saved, then a rebind
        memory.data.mul_(c.alpha).add_((1 - c.alpha) * gamma_hat.detach())
        memory.data = new.clone()
    return new, loss, torch.stack(gates)


def hopfield(state: Tensor, patterns: Tensor, beta: float) -> Tensor:
    """hflayers' static Hopfield (no projections or normalisations, one update): per sample
    ``softmax(β ξ Xᵀ) X``; ``state [B, N, E]``, ``patterns X [M, E]``."""
    return torch.stack([softmax(beta * state[b] @ patterns.T) @ patterns for b in range(state.shape[0])])


def forward(p: dict[str, Tensor], c: AuthorsConfig, img: Tensor, *, inplace_memory: bool = False
            ) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Their ``ViT.forward``: ``img [B, C, S, S]`` → ``(logits [B, classes], aux_loss, the memories
    written, one [M, D] per layer)``. ``aux_loss``: Σ layers Σ heads of the balance loss · 1e-2, what
    their training loop adds to the cross entropy (``torch.mean(aux_loss)`` of a 1-element tensor)."""
    x = ln(linear(ln(patches(img, c), p, "to_patch_embedding.1"), p, "to_patch_embedding.2"),
           p, "to_patch_embedding.3")                                 # [B, N, E]; no positions, no CLS
    b, n, e = x.shape
    aux, memories = x.new_zeros(()), []
    for i in range(c.depth):
        at, ff = f"transformer.layers.{i}.0.", f"transformer.layers.{i}.1."
        x = self_attention(ln(x, p, at + "norm"), p, at + "fn.", c) + x
        h = ln(x, p, ff + "norm")                                     # PreNorm
        if not c.sparse:
            x = linear(gelu(linear(h, p, ff + "fn.net.0")), p, ff + "fn.net.3") + x
            continue
        flat = h.reshape(-1, e)                                       # [B·N, E]: the squash
        moe = ln(linear(gelu(linear(flat, p, ff + "fn.fc1")), p, ff + "fn.fc2"), p, ff + "fn.norm")
        memory = p[ff + "fn.memoryupdate.memory"]
        new, loss, _ = memory_write(memory, moe, p, ff + "fn.memoryupdate.mha.", c, inplace_memory)
        aux = aux + loss
        memories.append(new)
        moe = moe.reshape(b, n, e)
        patterns = linear(new, p, ff + "fn.fc3")                      # [M, E]
        x = (hopfield(moe, patterns, c.beta) + moe) + x
    logits = linear(ln(x.reshape(b, -1), p, "mlp_head.0"), p, "mlp_head.1")
    return logits, aux, memories


def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    return torch.stack([-(logits[i, y[i]] - torch.logsumexp(logits[i], 0)) for i in range(len(y))]).mean()
