"""NFM Table 7's held-out colour-shape combinations: ``holdout = N`` removes the first N pairs of
HOLDOUT_ORDER from the train split only, deterministically, and leaves every other split unchanged."""
import numpy as np
import pytest

from modwire.tasks import build_dataset
from modwire.tasks.synthetic import sort_of_clevr as soc


def _pairs(ds, images):
    """The set of (colour, shape) pairs shown in the first ``images`` scenes of a dataset."""
    return {(c, int(s)) for i in range(images) for c, s in enumerate(ds.scene(i).shapes)}


def test_held_out_pairs_never_appear_in_train_and_all_appear_in_test():
    train = build_dataset("sort_of_clevr_image", "train", size=200, holdout=3)
    test = build_dataset("sort_of_clevr_image", "test", size=200, holdout=3)
    held = set(soc.HOLDOUT_ORDER[:3])
    assert held == {(0, 1), (1, 0), (2, 1)}
    assert soc.held_out_pairs(3) == (("red", "circle"), ("green", "rectangle"), ("blue", "circle"))
    seen = _pairs(train, 200)
    assert seen.isdisjoint(held)
    assert seen == {(c, s) for c in range(6) for s in range(2)} - held       # the 9 others all occur
    assert _pairs(test, 200) == {(c, s) for c in range(6) for s in range(2)}  # the original 12


def test_holdout_changes_only_the_held_out_objects_and_only_in_train():
    for split in ("train", "val", "test"):
        plain = build_dataset("sort_of_clevr", split, size=30)
        held = build_dataset("sort_of_clevr", split, size=30, holdout=2)
        changed = 0
        for i in range(30):
            a, b = plain.scene(i), held.scene(i)
            if split != "train":
                assert np.array_equal(a.centers, b.centers) and np.array_equal(a.shapes, b.shapes)
                continue
            if not np.array_equal(a.centers, b.centers):
                continue      # the flipped shapes made the first draw ambiguous: the scene was redrawn
            diff = np.flatnonzero(a.shapes != b.shapes).tolist()
            assert set(diff) <= {0, 1}                             # only red (circle) / green (rectangle)
            assert all(a.shapes[c] == s for c, s in soc.HOLDOUT_ORDER[:2] if c in diff)
            changed += bool(diff)
        if split == "train":
            assert changed >= 10                          # ~3/4 of scenes have red circle or green square


def test_answers_follow_the_changed_scene():
    ds = build_dataset("sort_of_clevr_image", "train", size=40, holdout=6)
    for i in range(0, 800, 37):
        _, (color, rel, sub), y = ds.question(i)
        if (rel, sub) == (0, 0):                        # "shape of the <colour> object?": never the held-out one
            assert int(y) == soc.RECTANGLE + 1 - dict(soc.HOLDOUT_ORDER)[color]


@pytest.mark.parametrize("bad", [-1, 7, 1.5, True, "2"])
def test_bad_holdout_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=rf"parameter 'holdout': got {bad!r}[ ,].*expected an "
                                         rf"int(eger in \[0, 6\]| like its default 0)"):
        build_dataset("sort_of_clevr", "train", size=2, holdout=bad)


def test_cached_images_are_not_shared_with_the_items():
    ds = build_dataset("sort_of_clevr_image", "train", size=2)
    x, _ = ds[3]
    x["x"].zero_()                                  # a caller writing into its item
    again, _ = ds[3]
    assert again["x"].min() >= 0 and again["x"].max() == 1.0   # still the rendered image (white background)
    assert len(ds._cache) == 1 and not np.array_equal(again["x"].numpy(), x["x"].numpy())
