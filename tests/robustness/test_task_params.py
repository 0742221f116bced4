"""Task parameters a user replaced by hand: a ``size`` mapping without the split asked for
names the split and the mapping given, not a bare KeyError('val')."""
import pytest

from modwire.tasks import build_dataset


def test_a_size_mapping_without_the_split_names_it():
    with pytest.raises(ValueError, match=r"size has no count for split 'val'.*got \{'train': 8\}"):
        build_dataset("triangle", "val", size={"train": 8})


def test_a_size_mapping_with_the_split_still_builds():
    assert len(build_dataset("triangle", "train", size={"train": 8})) == 8
