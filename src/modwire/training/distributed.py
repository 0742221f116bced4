"""torchrun support: process group set-up and a deterministic distributed sampler."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from ..seeding import torch_generator
from ..errors import UserError


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun (``WORLD_SIZE > 1``): NCCL on GPUs,
    gloo on CPUs. Single process otherwise."""
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"config key 'device': got 'cuda', but torch {torch.__version__} sees no CUDA device "
                        f"(built with CUDA: {torch.version.cuda or 'no'}); expected 'auto' or 'cpu' here")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=torch.device("cuda" if use_cuda else "cpu"))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
    return DistInfo(rank, dist.get_world_size(), torch.device(f"cuda:{local}" if use_cuda else "cpu"))


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class EpochSampler(Sampler[int]):
    """Shuffles ``n`` indices by ``(seed, epoch)``, gives rank ``r`` every ``world``-th one,
    and can start part-way through an epoch (exact resume). The order depends only on
    ``(seed, epoch)`` (``modwire.seeding.derive_seed``), never on global RNG state."""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1, shuffle: bool = True) -> None:
        self.n, self.seed, self.rank, self.world, self.shuffle = n, seed, rank, world, shuffle
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch_generator(self.seed, self.epoch)).tolist()
        else:
            order = list(range(self.n))
        per_rank = -(-self.n // self.world)
        order += order[: per_rank * self.world - self.n]  # pad so every rank gets as many
        return order[self.rank::self.world]

    def __iter__(self):
        return iter(self._indices()[self.start:])

    def __len__(self) -> int:
        return -(-self.n // self.world) - self.start
