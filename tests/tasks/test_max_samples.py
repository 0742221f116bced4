"""``data.max_samples`` on class-sorted loaders: a seeded, class-stratified subset when the dataset
declares its labels (``targets`` / ``labels``), the first N otherwise, each with a one-line note."""
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from modwire.tasks import InputSpec, TaskInfo, build_dataset, get_task, register_task
from modwire.tasks.base import FirstN, Subsample, class_targets, stratified_indices, subsample
from task_fixtures import write_imdb, write_mnist


def test_imdb_subset_holds_both_classes_in_proportion(tmp_path):
    write_imdb(tmp_path / "aclImdb", "train", neg=30, pos=10)       # class-sorted: 30 neg, then 10 pos
    full = build_dataset("imdb_bytes", "train", root=tmp_path)
    assert [int(full[i][1]) for i in range(8)] == [0] * 8          # the first items are of one class
    part = build_dataset("imdb_bytes", "train", root=tmp_path, max_samples=8)
    labels = [int(part[i][1]) for i in range(len(part))]
    assert len(part) == 8 and sorted(labels) == [0] * 6 + [1] * 2   # 1 each + the rest pro rata: 3:1
    assert part.note == "8 of 40 samples, stratified over 2 classes, seed 0" and part.describe() == part.note
    for k, i in enumerate(part.indices):                           # each item is the full split's item
        assert torch.equal(part[k][0], full[i][0]) and int(part[k][1]) == int(full[i][1])
    assert part.indices == sorted(part.indices)                    # the dataset's own order
    assert part.targets.tolist() == labels                          # declared labels of the items kept


def test_the_draw_is_a_function_of_the_seed(tmp_path):
    write_imdb(tmp_path / "aclImdb", "train", neg=30, pos=30)
    draws = {seed: build_dataset("imdb_bytes", "train", root=tmp_path, max_samples=10, sample_seed=seed).indices
             for seed in (0, 1)}
    assert build_dataset("imdb_bytes", "train", root=tmp_path, max_samples=10, sample_seed=1).indices == draws[1]
    assert draws[0] != draws[1]
    assert "seed 1" in build_dataset("imdb_bytes", "train", root=tmp_path, max_samples=10, sample_seed=1).note
    with pytest.raises(TypeError, match=r"sample_seed must be an int >= 0.*got -1"):
        build_dataset("imdb_bytes", "train", root=tmp_path, max_samples=10, sample_seed=-1)


def test_in_memory_labels_are_stratified_too(tmp_path):
    data = write_mnist(tmp_path, n=40, balanced=True)               # labels i % 10
    part = build_dataset("mnist", "train", root=tmp_path, max_samples=10)
    assert sorted(int(part[i][1]) for i in range(10)) == list(range(10))   # one of each digit
    images = data["train"][0]
    for k, i in enumerate(part.indices):
        assert torch.equal((part[k][0][0, 2:30, 2:30] * 255).round().to(torch.uint8), torch.from_numpy(images[i]))


class Unlabelled(Dataset):
    def __init__(self, split, size=10):
        self.size = size

    def targets(self, x):          # a method named targets (fuzzy_boolean has one) is no declaration
        return x

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return torch.tensor([float(i)]), torch.tensor(i % 2)


try:
    get_task("unlabelled_test")
except KeyError:
    register_task(TaskInfo("unlabelled_test", "generator", "test task without declared labels", 2,
                           InputSpec.vectors(1, 1), params={"size": 10}), Unlabelled)


def test_without_declared_labels_the_first_n_and_the_note_says_so():
    part = build_dataset("unlabelled_test", "train", max_samples=4)
    assert isinstance(part, FirstN) and [part[i][0].item() for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert part.note == "the first 4 of 10 samples (the dataset declares no class labels: not stratified)"
    again = pickle.loads(pickle.dumps(part))
    assert again.note == part.note and again[3][0].item() == 3.0


@pytest.mark.parametrize("labels,n,counts", [
    ([0] * 90 + [1] * 10, 10, {0: 9, 1: 1}),
    ([0] * 90 + [1] * 10, 2, {0: 1, 1: 1}),            # every class gets one first
    ([0] * 5 + [1] * 5 + [2] * 5, 2, None),             # fewer than the classes: 2 classes, one each
    ([2, 2, 0, 0, 1, 1], 6, {0: 2, 1: 2, 2: 2}),        # all
])
def test_stratified_indices_counts(labels, n, counts):
    got = stratified_indices(labels, n, seed=3)
    assert len(got) == n == len(set(got)) and got == sorted(got)
    drawn = np.asarray(labels)[got]
    if counts is None:
        assert sorted(np.unique(drawn, return_counts=True)[1].tolist()) == [1, 1]
    else:
        assert {int(c): int((drawn == c).sum()) for c in np.unique(labels)} == counts
    assert stratified_indices(labels, n, seed=3) == got


def test_class_targets_reads_declared_labels_only():
    class D(Dataset):
        def __init__(self, **attrs):
            self.__dict__.update(attrs)

        def __len__(self):
            return 3

    assert class_targets(D(targets=[2, 0, 1])).tolist() == [2, 0, 1]
    assert class_targets(D(targets=torch.tensor([1, 1, 0]))).tolist() == [1, 1, 0]
    assert class_targets(D(labels=torch.tensor([1, 1, 0]))) is None             # only `targets` declares
    assert class_targets(D(targets=torch.tensor([0.5, 1.0, 0.0]))) is None      # not class labels
    assert class_targets(D(targets=[0, 1])) is None                               # not one per item
    assert class_targets(D()) is None
    sub = subsample(D(targets=[0, 1, 0]), 2, seed=0)
    assert isinstance(sub, Subsample) and sorted(sub.targets.tolist()) == [0, 1]
