"""One AiT training step per workspace pool under torchrun (2 CPU processes, gloo), for
``tests/training/test_ait_ddp.py``; also imported there for the single-process references.

    python -m torch.distributed.run --nproc-per-node 2 tests/ddp_ait_worker.py OUT_DIR

Rank ``r`` takes the ``r``-th contiguous half of one fixed batch (so the all-gathered pool is the
whole batch's squashed pool in its order ``l = b·N + n``), wraps the model in
``DistributedDataParallel`` as the trainer does, runs forward, cross entropy + the weighted
balance loss (AiT Eq. 5-6), backward, and saves ``OUT_DIR/<pool>-rank<r>.pt``: logits, losses,
buffers (the workspace memory after its update, AiT Eq. 4) and gradients (after DDP's
averaging). Then rank 0 alone runs an evaluation forward (the trainer validates on rank 0 only,
while the other ranks wait at a barrier): it must not need the other process.
"""
from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PRESET = "ait_micro"
BATCH = 8
OVERRIDES = {"bottleneck_size": 12,   # k well below the half pool (4 samples x 16 patches): selection matters
             "write_dropout": 0.0}   # the processes and the single-process reference draw no dropout masks
POOLS = ("global", "batch", "sample")
BALANCE_WEIGHT = 0.01


def build(pool: str) -> nn.Module:
    from modwire.models.registry import create_model

    torch.manual_seed(0)
    return create_model(PRESET, pool=pool, **OVERRIDES)


def data(model: nn.Module, batch: int = BATCH) -> tuple[Tensor, Tensor]:
    """The fixed batch every run reads: images ``[B, C, S, S]`` and labels ``[B]``."""
    e = model.config.tokenizer
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, e.in_channels, e.image_size, e.image_size, generator=g)
    return x, torch.randint(model.config.num_classes, (batch,), generator=g)


def half(t: Tensor, rank: int, world: int = 2) -> Tensor:
    n = len(t) // world
    return t[rank * n:(rank + 1) * n]


def step(model: nn.Module, net: nn.Module, x: Tensor, y: Tensor) -> dict:
    """Forward (train mode), CE + 0.01 · balance, backward; what the test compares."""
    model.train()
    model.zero_grad(set_to_none=True)
    logits = net(x)
    task = F.cross_entropy(logits, y)
    aux = model.auxiliary_losses()
    loss = task + sum(BALANCE_WEIGHT * v for v in aux.values())
    loss.backward()
    return {"logits": logits.detach(), "task": task.detach(), "aux": {k: v.detach() for k, v in aux.items()},
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
            "buffers": {n: b.detach().clone() for n, b in model.named_buffers()}}


def evaluate(model: nn.Module, x: Tensor) -> Tensor:
    model.eval()
    with torch.no_grad():
        return model(x)


def main(out: Path) -> None:
    import torch.distributed as dist
    from modwire.training.distributed import setup, teardown

    if not dist.is_initialized():      # as setup() would, with a short timeout: a collective that the
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # other rank never joins fails
    info = setup("cpu")
    assert info.world == 2, f"run with --nproc-per-node 2 (world size {info.world})"
    for pool in POOLS:
        model = build(pool)
        net = nn.parallel.DistributedDataParallel(model)
        x, y = data(model)
        res = step(model, net, half(x, info.rank), half(y, info.rank))
        dist.barrier()
        if info.main:      # validation on rank 0 alone, as the trainer does
            res["eval_logits"] = evaluate(model, half(x, 0))
        dist.barrier()
        torch.save(res, out / f"{pool}-rank{info.rank}.pt")
    teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
