"""``build_dataset(..., max_samples=N)``: the first N items of a split, as a view."""
import pickle

import pytest
import torch
from torch.utils.data import Dataset

from modwire.tasks import InputSpec, TaskInfo, build_dataset, get_task, register_task


class Epochal(Dataset):
    """Items depend on the epoch set by ``set_epoch`` (as the augmentation wrapper's do)."""

    def __init__(self, split: str, size: int = 10):
        self.size, self.epoch, self.classes = size, 0, ["a", "b"]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if not 0 <= i < self.size:
            raise IndexError(i)
        return torch.tensor([float(i)]), torch.tensor(self.epoch)


try:
    get_task("epochal_test")
except KeyError:
    register_task(TaskInfo("epochal_test", "generator", "test task with set_epoch", 2,
                           InputSpec.vectors(1, 1), params={"size": 10}), Epochal)


def test_first_n_items_identical_to_the_full_split():
    full = build_dataset("epochal_test", "train")
    part = build_dataset("epochal_test", "train", max_samples=4)
    assert len(part) == 4 and [part[i][0].item() for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert all(torch.equal(part[i][0], full[i][0]) for i in range(4))
    with pytest.raises(IndexError):
        part[4]
    part.set_epoch(7)                       # forwarded to the dataset itself
    assert part[0][1].item() == 7 and part.classes == ["a", "b"]
    again = pickle.loads(pickle.dumps(part))    # DataLoader workers (spawn) pickle the dataset
    assert len(again) == 4 and again[3][0].item() == 3.0


@pytest.mark.parametrize("n", [None, 0, 10, 1000])
def test_none_zero_or_more_than_the_split_keep_everything(n):
    ds = build_dataset("epochal_test", "train", max_samples=n)
    assert len(ds) == 10 and isinstance(ds, Epochal)


def test_bad_max_samples_are_clear_errors():
    with pytest.raises(ValueError, match="max_samples must be >= 0.*got -1"):
        build_dataset("epochal_test", "train", max_samples=-1)
    with pytest.raises(TypeError, match="max_samples must be an int.*'5'"):
        build_dataset("epochal_test", "train", max_samples="5")
    with pytest.raises(TypeError, match="max_samples must be an int"):
        build_dataset("epochal_test", "train", max_samples=True)
