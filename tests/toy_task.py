"""A tiny task for trainer tests: sets of 6 vectors in R^8, label = sign of a feature sum."""
import time

import torch
from torch.utils.data import Dataset

from modwire.tasks import InputSpec, TaskInfo, get_task, register_task


class ToySets(Dataset):
    def __init__(self, split: str, size: int = 64, seed: int = 0, delay: float = 0.0):
        self.size, self.offset, self.seed = size, {"train": 0, "val": 10_000, "test": 20_000}[split], seed
        self.delay = delay  # seconds per item: makes a run slow enough to be killed mid-way

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.offset + i)
        x = torch.randn(6, 8, generator=g)
        return x, (x[:, 0].sum() > 0).long()


try:
    get_task("toy_sets")
except KeyError:
    register_task(TaskInfo("toy_sets", "generator", "test task: sign of a feature sum over a set", 2,
                           InputSpec.vectors(6, 8), params={"size": 64, "seed": 0, "delay": 0.0}), ToySets)
