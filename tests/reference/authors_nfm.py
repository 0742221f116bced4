"""The NFM authors' Sort-of-CLEVR network, re-stated from reading their code (``CNN_MLP_NFL`` with
``ConvInputModel_NFL2`` and ``FCOutputModel`` of their ``models/model.py``; ``AttentiveDensenet``,
``ScaledDotProductAttention`` and ``SparseAttention`` of their ``models/attentive_densenet.py``),
written independently of ``modwire``; evaluation mode, float64 in the tests. Nothing is copied
from their files: the facts below are what their forward computes.

* Parameters are a dict laid out as their ``state_dict()``: ``conv.conv1`` … ``conv.conv4`` (pass 1)
  and ``conv.conv1b`` … ``conv.conv4b`` (pass 2), each 3×3, stride 2, padding 1, with
  ``conv.batchNorm<i>[b]``; the attentive densenet ``conv.ad.*`` holds eight slots ``L = 0 … 7``
  (pass 1: 0-3, pass 2: 4-7), each with 1×1 convs ``key_layers.L``, ``query_layers.L``,
  ``val_layers.L`` (C → 4·16), ``out_layers.L`` (Conv3×3(64 → C), BatchNorm2d(C), ReLU,
  Conv3×3(C → C), so ``.0``, ``.1``, ``.3``) and ``gammas.L``; the head ``conv1`` (1×1, 384 → 64),
  ``fc1`` (5·5·64 + 11 → 256), ``fcout.fc2`` (256 → 256), ``fcout.fc3`` (256 → 10). Pass 1 never
  reads, so ``query_layers``, ``out_layers`` and ``gammas`` 0-3 exist but are never used.
* Block: conv → ReLU → BatchNorm (running statistics, eps 1e-5). Pass 1 runs the four blocks on the
  image and writes each output (its key and value, 1×1 convs of slot ``L``) to the memory. Pass 2
  runs its own four blocks from the image again; after each block it writes the output, then reads
  with the output as the query, and ``x + γ_L · out_layers_L(read)`` goes on.
* Read at a grid ``h × w``: every memory key / value (all of pass 1, then pass 2's up to this block)
  resized to ``h × w`` by ``F.interpolate(·, (h, w), mode="nearest")`` (their ``position_attend``
  is off); per sample, position and head one query row ``q [16]`` against the keys in memory order
  and then a zero key (the null slot, appended last) with a zero value; ``softmax(q·k / 16 ** 0.5)``;
  attention dropout 0 (their ``attn_dropout=0.0``); then ``SparseAttention`` with ``top_k = 3``
  (their ``ScaledDotProductAttention`` replaces the ``SparseAttention(top_k=att_sparsity)`` it built
  by ``SparseAttention()``, default 3): with ``n`` slots, if ``n ≤ top_k + 1`` the weights stay, else
  ``δ`` = the (top_k + 1)-th largest weight + 1e-7 (their ``eps = 10e-8``),
  ``w ← max(w − δ, 0) / (Σ max(w − δ, 0) + 1e-7)``. The heads' reads are concatenated head-major
  (channel ``head·16 + d``).
* Head: ``avg_pool2d(x, 4)`` on the final grid, resized (nearest) back to it (their literal
  ``[5, 5]``: the final grid of a 75×75 image), ``conv1``, flatten (channels first) ⊕ question,
  ``fc1`` → ReLU → ``fc2`` → ReLU → ``fc3`` → ``log_softmax``. Their ``F.dropout`` after the second
  ReLU is on even at test time (``training=True`` by default), a bug; here it is off, as modwire's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

WIDTHS = (48, 96, 192, 384)
HEADS, D_K, D_V = 4, 16, 16
EPS_SPARSE, EPS_BN = 1e-7, 1e-5


def authors_shapes(image_grid: int = 5) -> dict[str, tuple[int, ...]]:
    """Every parameter and BatchNorm buffer of their ``CNN_MLP_NFL`` (``num_batches_tracked`` left out),
    named as in their ``state_dict()``; ``image_grid``: the final grid side (5 at 75×75)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def bn(name: str, c: int) -> None:
        for part in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{name}.{part}"] = (c,)

    def conv(name: str, c_in: int, c_out: int, size: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (c_out, c_in, size, size), (c_out,)

    for suffix in ("", "b"):
        for i, (a, b) in enumerate(zip((3,) + WIDTHS[:-1], WIDTHS)):
            conv(f"conv.conv{i + 1}{suffix}", a, b, 3)
            bn(f"conv.batchNorm{i + 1}{suffix}", b)
    for slot, c in enumerate(WIDTHS + WIDTHS):
        for layer in ("key_layers", "query_layers", "val_layers"):
            conv(f"conv.ad.{layer}.{slot}", c, HEADS * D_K, 1)
        conv(f"conv.ad.out_layers.{slot}.0", HEADS * D_V, c, 3)
        bn(f"conv.ad.out_layers.{slot}.1", c)
        conv(f"conv.ad.out_layers.{slot}.3", c, c, 3)
        shapes[f"conv.ad.gammas.{slot}"] = ()
    conv("conv1", WIDTHS[-1], 64, 1)
    shapes["fc1.weight"], shapes["fc1.bias"] = (256, image_grid * image_grid * 64 + 11), (256,)
    shapes["fcout.fc2.weight"], shapes["fcout.fc2.bias"] = (256, 256), (256,)
    shapes["fcout.fc3.weight"], shapes["fcout.fc3.bias"] = (10, 256), (10,)
    return shapes


def _bn(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    """BatchNorm2d in evaluation mode: ``(x - running_mean) / √(running_var + 1e-5) · weight + bias``."""
    view = lambda t: t[None, :, None, None]
    return (x - view(p[f"{name}.running_mean"])) / torch.sqrt(view(p[f"{name}.running_var"]) + EPS_BN) \
        * view(p[f"{name}.weight"]) + view(p[f"{name}.bias"])


def _conv(x: Tensor, p: dict[str, Tensor], name: str, stride: int = 1) -> Tensor:
    w = p[f"{name}.weight"]
    return F.conv2d(x, w, p[f"{name}.bias"], stride=stride, padding=w.shape[-1] // 2)


def _rows(t: Tensor, d: int) -> Tensor:
    """``[B, heads·d, h, w]`` → one row per (sample, position, head): ``[B·h·w·heads, d]``."""
    b, _, hh, ww = t.shape
    return t.reshape(b, HEADS, d, hh * ww).permute(0, 3, 1, 2).reshape(b * hh * ww * HEADS, d)


def sparse_attention(w: Tensor, top_k: int) -> Tensor:
    """Their ``SparseAttention(top_k)`` on weight rows ``w [R, n]`` (module docstring)."""
    n = w.shape[1]
    if n <= top_k + 1:
        return w
    delta = torch.sort(w, dim=1, descending=True).values[:, top_k:top_k + 1] + EPS_SPARSE
    kept = torch.clamp(w - delta, min=0)
    return kept / (kept.sum(dim=1, keepdim=True) + EPS_SPARSE)


def read(p: dict[str, Tensor], slot: int, x: Tensor, memory: list[tuple[Tensor, Tensor]], top_k: int) -> Tensor:
    """The read of slot ``slot`` with query state ``x [B, C, h, w]`` over ``memory`` (key, value per
    written state, in order): ``x + γ · out_layers(A)``."""
    b, _, hh, ww = x.shape
    ad = "conv.ad"
    q = _rows(_conv(x, p, f"{ad}.query_layers.{slot}"), D_K)                            # [R, 16]
    keys = [_rows(F.interpolate(k, (hh, ww), mode="nearest"), D_K) for k, _ in memory]
    vals = [_rows(F.interpolate(v, (hh, ww), mode="nearest"), D_V) for _, v in memory]
    keys = torch.stack(keys + [torch.zeros_like(keys[0])], dim=1)                       # [R, n, 16], null last
    vals = torch.stack(vals + [torch.zeros_like(vals[0])], dim=1)
    scores = torch.einsum("rd,rnd->rn", q / D_K ** 0.5, keys)
    w = sparse_attention(torch.softmax(scores, dim=1), top_k)
    a = torch.einsum("rn,rnd->rd", w, vals)                                             # [R, 16]
    a = a.reshape(b, hh * ww, HEADS * D_V).permute(0, 2, 1).reshape(b, HEADS * D_V, hh, ww)
    out = f"{ad}.out_layers.{slot}"
    out = _conv(torch.relu(_bn(_conv(a, p, f"{out}.0"), p, f"{out}.1")), p, f"{out}.3")
    return x + p[f"{ad}.gammas.{slot}"] * out


def authors_forward(p: dict[str, Tensor], img: Tensor, qst: Tensor, *, top_k: int = 3) -> Tensor:
    """``CNN_MLP_NFL.forward(img [B, 3, S, S], qst [B, 11])`` in evaluation mode → log-probabilities ``[B, 10]``."""
    memory: list[tuple[Tensor, Tensor]] = []

    def block(x: Tensor, i: int, suffix: str) -> Tensor:
        return _bn(torch.relu(_conv(x, p, f"conv.conv{i + 1}{suffix}", stride=2)), p, f"conv.batchNorm{i + 1}{suffix}")

    def write(x: Tensor, slot: int) -> None:
        memory.append((_conv(x, p, f"conv.ad.key_layers.{slot}"), _conv(x, p, f"conv.ad.val_layers.{slot}")))

    x = img
    for i in range(4):                                  # pass 1: write only
        x = block(x, i, "")
        write(x, i)
    x = img
    for i in range(4):                                  # pass 2: write, then read with the block's output
        x = block(x, i, "b")
        write(x, 4 + i)
        x = read(p, 4 + i, x, memory, top_k)
    grid = x.shape[-2:]                                 # their literal [5, 5] at 75×75
    x = F.interpolate(F.avg_pool2d(x, 4), list(grid), mode="nearest")
    x = _conv(x, p, "conv1").reshape(len(x), -1)
    x = torch.cat([x, qst], dim=1)
    x = torch.relu(x @ p["fc1.weight"].T + p["fc1.bias"])
    x = torch.relu(x @ p["fcout.fc2.weight"].T + p["fcout.fc2.bias"])   # their F.dropout here: off (module docstring)
    x = x @ p["fcout.fc3.weight"].T + p["fcout.fc3.bias"]
    return torch.log_softmax(x, dim=1)
