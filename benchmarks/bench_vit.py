"""modwire's ViT blocks vs a peer of equal dimensions: torch's TransformerEncoder, or timm's blocks (issue 11).

    OMP_NUM_THREADS=1 python benchmarks/bench_vit.py [--repeats 9] [--quick]
    python benchmarks/bench_vit.py --device cuda --precision bf16 --compile

The body of :class:`modwire.models.vit.ViT` (``ViT.encode``: ``num_layers`` pre-LN
:class:`~modwire.nn.blocks.TransformerBlock` blocks, GELU MLP) is timed against the peer built
from PyTorch's own layer with the same hyperparameters: ``nn.TransformerEncoderLayer(d, heads,
mlp, dropout=0, activation="gelu", batch_first=True, norm_first=True)`` stacked by
``nn.TransformerEncoder(..., enable_nested_tensor=False)``. Both read the same random tokens
``[B, N, d]`` (embedding, CLS tokens and heads are shared scaffolding, left out).

First the peer gets our weights (``in_proj`` = ``[W_q; W_k; W_v]``, ``out_proj`` = ``W_o``,
``linear1/2`` = the MLP, ``norm1/2`` = the two pre-norms) and the max abs difference of the
outputs is printed: the two compute the same function, so the timings compare like with like.

Shapes: NI Table 5 (the digits ViT: 192-d, 8 layers, 3 heads, MLP 192; 64 patches + 3 CLS = 67
tokens) and AiT §5.1 ViT-Small (768-d, 2 layers, 12 heads, MLP 3072; 64 patches + 1 = 65).
Timed: inference (eval, ``torch.no_grad``; the peer then takes PyTorch's fused "fast path",
``torch._transformer_encoder_layer_fwd``) and a train step (train mode, forward + backward of
a fixed random projection of the output). The two sides alternate (ours, peer, ours, ...; one
warm-up call each; ``modwire.analysis.time_interleaved``) and each reports its median; the ratio
ours/peer is in throughput (peer seconds / our seconds), so > 1 means we are faster.
Target: >= 0.95 for every row (printed PASS/FAIL, not with --quick).

``--device cuda`` moves both sides and the tokens to the GPU (refused when CUDA is not available);
``--precision bf16`` runs the forward and the loss of BOTH sides under ``torch.autocast(device,
bfloat16)`` (the backward outside it, as PyTorch recommends: it runs in the forward's dtypes);
``--compile`` wraps both sides in ``torch.compile`` (default mode, static shapes), compiled by
three untimed warm-up calls per side before the interleaved timing. The agreement check above
always runs eager, in fp32. Under CUDA autocast PyTorch turns the peer's inference fast path off
(``torch.is_autocast_enabled()``), so both sides then run ordinary ops; CPU autocast leaves it on.
"""
from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from modwire.analysis import time_interleaved
from runflags import Run, add_run_flags
from modwire.models.tokenizer_config import TokenizerConfig
from modwire.models.vit import ViT, ViTConfig

TARGET = 0.95


@dataclass(frozen=True)
class Shape:
    name: str
    d: int
    layers: int
    heads: int
    mlp: int
    tokens: int
    batch: int


SHAPES = (Shape("NI Table 5 ViT", 192, 8, 3, 192, 67, 128),
          Shape("AiT ViT-Small", 768, 2, 12, 3072, 65, 32))
QUICK = (Shape("tiny", 32, 2, 2, 48, 10, 4),)


def build_pair(s: Shape) -> tuple[ViT, nn.TransformerEncoder]:
    """Our ViT (only its ``encode`` is timed) and the peer encoder with our weights copied in."""
    ours = ViT(ViTConfig(d_model=s.d, num_layers=s.layers, num_heads=s.heads, ffn_hidden=s.mlp,
                         tokenizer=TokenizerConfig(kind="patches", positions="absolute")))
    layer = nn.TransformerEncoderLayer(s.d, s.heads, s.mlp, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
    peer = nn.TransformerEncoder(layer, s.layers, enable_nested_tensor=False)
    with torch.no_grad():
        for ob, pb in zip(ours.blocks, peer.layers, strict=True):
            a, f = ob.attn.fn, ob.ffn.fn
            pb.self_attn.in_proj_weight.copy_(torch.cat([a.q.weight, a.k.weight, a.v.weight]))
            pb.self_attn.in_proj_bias.copy_(torch.cat([a.q.bias, torch.zeros_like(a.q.bias), a.v.bias]))  # no key bias (the softmax cancels it)
            pb.self_attn.out_proj.weight.copy_(a.o.weight)
            pb.self_attn.out_proj.bias.copy_(a.o.bias)
            for pl, ol in ((pb.linear1, f.fc1), (pb.linear2, f.fc2)):
                pl.weight.copy_(ol.weight)
                pl.bias.copy_(ol.bias)
            for pn, on in ((pb.norm1, ob.attn.norm), (pb.norm2, ob.ffn.norm)):
                pn.weight.copy_(on.weight)
                pn.bias.copy_(on.bias)
    return ours, peer


def build_timm_peer(ours: ViT, s: Shape) -> nn.Module:
    """timm's ViT blocks (``timm.models.vision_transformer.Block``, pre-LN, fused SDPA attention)
    stacked in an ``nn.Sequential``, with our weights copied in (``qkv`` = ``[W_q; W_k; W_v]``,
    ``proj`` = ``W_o``, ``mlp.fc1/fc2``, ``norm1/2``). timm is imported here only: it is not a
    dependency of modwire (``--peer timm`` on a machine that has it)."""
    from timm.models.vision_transformer import Block
    blocks = [Block(s.d, s.heads, mlp_ratio=s.mlp / s.d, qkv_bias=True) for _ in range(s.layers)]
    with torch.no_grad():
        for ob, tb in zip(ours.blocks, blocks, strict=True):
            a, f = ob.attn.fn, ob.ffn.fn
            tb.attn.qkv.weight.copy_(torch.cat([a.q.weight, a.k.weight, a.v.weight]))
            tb.attn.qkv.bias.copy_(torch.cat([a.q.bias, torch.zeros_like(a.q.bias), a.v.bias]))  # no key bias (the softmax cancels it)
            tb.attn.proj.weight.copy_(a.o.weight)
            tb.attn.proj.bias.copy_(a.o.bias)
            for tl, ol in ((tb.mlp.fc1, f.fc1), (tb.mlp.fc2, f.fc2)):
                tl.weight.copy_(ol.weight)
                tl.bias.copy_(ol.bias)
            for tn, on in ((tb.norm1, ob.attn.norm), (tb.norm2, ob.ffn.norm)):
                tn.weight.copy_(on.weight)
                tn.bias.copy_(on.bias)
                tn.eps = on.eps
    return nn.Sequential(*blocks)


def our_body(ours: ViT):
    return lambda x: ours.encode(x, record=False)[0]


def max_diff(ours: ViT, peer: nn.Module, x: Tensor) -> tuple[float, float]:
    """Max abs difference of the outputs, fast path (inference) and train-mode path."""
    ours.eval(), peer.eval()
    with torch.no_grad():
        fast = (our_body(ours)(x) - peer(x)).abs().max().item()
    ours.train(), peer.train()
    slow = (our_body(ours)(x) - peer(x)).abs().max().item()
    return fast, slow


def step(mod: nn.Module, fn, x: Tensor, g: Tensor, *, train: bool, cast=contextlib.nullcontext):
    """One call to time: an inference forward, or a forward + backward of ``<fn(x), g>``
    (forward and loss under ``cast()``)."""
    def run() -> None:
        if train:
            mod.zero_grad(set_to_none=True)
            with cast():
                loss = (fn(x) * g).sum()
            loss.backward()
        else:
            with torch.no_grad(), cast():
                fn(x)
    return run


def compare(ours: ViT, peer: nn.Module, x: Tensor, *, train: bool, repeats: int,
            fns: tuple[Callable, Callable] | None = None, cast=contextlib.nullcontext,
            warmup: int = 1) -> tuple[float, float, float]:
    """Interleaved timings; returns (our median s, peer median s, ours/peer throughput).
    ``fns``: the (ours, peer) callables to time (e.g. compiled), default the eager modules."""
    ours_fn, peer_fn = fns or (our_body(ours), peer)
    g = torch.randn_like(x)
    ours.train(train), peer.train(train)
    t = time_interleaved({"ours": step(ours, ours_fn, x, g, train=train, cast=cast),
                          "peer": step(peer, peer_fn, x, g, train=train, cast=cast)},
                         iters=repeats, warmup=warmup)
    return t["ours"], t["peer"], t["peer"] / t["ours"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one tiny shape, few repeats (smoke test, < 10 s)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per side (default 9; 3 quick)")
    ap.add_argument("--batch", type=int, default=None, help="override every shape's batch size")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--peer", choices=("torch", "timm"), default="torch",
                    help="torch: nn.TransformerEncoder (default); timm: timm's ViT Block (needs timm installed)")
    add_run_flags(ap)
    args = ap.parse_args()
    run = Run.from_args(ap, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 9)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.2f}, "
          f"{run.describe()}, peer {args.peer}")
    dev = torch.device(args.device)
    results = []
    for s in (QUICK if args.quick else SHAPES):
        b = args.batch or s.batch
        torch.manual_seed(0)
        ours, peer = build_pair(s)
        if args.peer == "timm":
            peer = build_timm_peer(ours, s)
        x = torch.randn(b, s.tokens, s.d)
        ours, peer, x = ours.to(dev), peer.to(dev), x.to(dev)
        fast, slow = max_diff(ours, peer, x[:8])
        fns = (our_body(ours), peer)
        fns = (run.compiled(fns[0]), run.compiled(peer))
        print(f"\n{s.name}: d {s.d}, {s.layers} layers, {s.heads} heads, MLP {s.mlp}, {s.tokens} tokens, batch {b}")
        print(f"  max |ours - peer| = {max(fast, slow):.2e} (inference fast path {fast:.2e}, train path {slow:.2e})")
        print(f"  {'mode':<10} {'ours s':>9} {'peer s':>9} {'ours/peer':>10}")
        for train in (False, True):
            o, p, r = compare(ours, peer, x, train=train, repeats=repeats, fns=fns, cast=run.cast,
                              warmup=run.warmup)
            mode = "train" if train else "inference"
            results.append((s.name, mode, r))
            print(f"  {mode:<10} {o:>9.4f} {p:>9.4f} {r:>9.3f}x")
    print(f"\nthroughput ours / peer, median of {repeats} interleaved rounds (target >= {TARGET}):")
    for name, mode, r in results:
        verdict = "" if args.quick else ("  PASS" if r >= TARGET else "  FAIL")
        print(f"  {name}, {mode}: {r:.3f}x{verdict}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
