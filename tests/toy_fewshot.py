"""A tiny 6-class task for fine-tuning tests: sets of 6 vectors in R^8 whose class c shifts
feature c (same inputs as ``toy_sets``, so a model pretrained there reads it)."""
import torch
from torch.utils.data import Dataset

from modwire.tasks import InputSpec, TaskInfo, get_task, register_task

CLASSES = 6


class ToyClasses(Dataset):
    def __init__(self, split: str, size: int = 60, seed: int = 0):
        self.size, self.offset, self.seed = size, {"train": 0, "val": 10_000, "test": 20_000}[split], seed

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.offset + i)
        label = i % CLASSES
        x = torch.randn(6, 8, generator=g)
        x[:, label] += 1.5
        return x, torch.tensor(label)


try:
    get_task("toy_classes")
except KeyError:
    register_task(TaskInfo("toy_classes", "generator", "test task: which of 6 features is shifted", CLASSES,
                           InputSpec.vectors(6, 8), params={"size": 60, "seed": 0}), ToyClasses)
