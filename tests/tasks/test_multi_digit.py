"""NFM §4.2 multi-digit task: non-overlapping digits, multi-label targets, counts per split,
determinism per (seed, index), the MNIST source, the bce loss and the multi-label metrics."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from task_fixtures import write_idx
from modwire.tasks import InputSpec, build_dataset, compute_metrics, describe_task, get_task
from modwire.tasks.synthetic import multi_digit as md
from modwire.training.runtime import check_labels, compute_loss


def small(split="train", **kw):
    return build_dataset("multi_digit", split, **{"size": 20, **kw})


def test_registered_as_a_multilabel_image_task():
    info = get_task("multi_digit")
    assert info.kind == "generator" and info.loss == "bce" and info.num_classes == 10
    assert info.metrics == ("exact_match", "label_accuracy") and info.inputs == InputSpec.image(1, 64, 64)
    assert describe_task("multi_digit", {"image_size": 32}).inputs == InputSpec.image(1, 32, 32)


@pytest.mark.parametrize("counts", [[1, 5], [4]])
def test_digits_do_not_overlap_and_the_target_is_the_classes_present(counts):
    ds = small(counts=counts)
    for i in range(len(ds)):
        x, y = ds[i]
        layout, glyphs = ds.layout(i)
        assert x.shape == (1, 64, 64) and x.dtype == torch.float32 and y.shape == (10,)
        n = counts[i % len(counts)]
        assert len(layout.classes) == n and len(set(layout.classes.tolist())) == n   # distinct classes
        assert y.tolist() == [float(c in layout.classes) for c in range(10)] and y.sum() == n
        boxes = layout.boxes
        assert (boxes[:, :2] >= 0).all() and (boxes[:, :2] + boxes[:, 2:] <= 64).all()
        for a in range(n):                       # pairwise disjoint boxes
            for b in range(a + 1, n):
                (ta, la, ha, wa), (tb, lb, hb, wb) = boxes[a], boxes[b]
                assert ta + ha <= tb or tb + hb <= ta or la + wa <= lb or lb + wb <= la, (i, boxes)
        expected = np.zeros((64, 64), np.float32)
        for (t, l, h, w), g in zip(boxes, glyphs):
            assert g.shape == (h, w) and max(h, w) <= 20 and g[0].any() and g[:, 0].any()  # ink touches the box
            expected[t:t + h, l:l + w] += g      # a sum: any overlap would show as a mismatch
        assert torch.equal(x[0], torch.from_numpy(expected))


def test_counts_per_split_balance_and_errors():
    counts = {"train": [1, 3], "val": [2], "test": [5]}
    for split, want in counts.items():
        ds = small(split, counts=counts, size=6)
        assert [int(ds[i][1].sum()) for i in range(6)] == [want[i % len(want)] for i in range(6)]
    assert [int(small("test", size=5)[i][1].sum()) for i in range(5)] == [1, 2, 3, 4, 5]   # default test counts
    with pytest.raises(ValueError, match="only 10 classes"):
        small(counts=[11])
    with pytest.raises(ValueError, match="do not fit at random without overlap in a 64x64 image; at most 6"):
        small(counts=[7], distinct=False)
    with pytest.raises(ValueError, match="for split 'val'"):
        small("val", counts={"train": [1]})
    with pytest.raises(ValueError, match="non-empty list of positive ints"):
        small(counts=[0, 2])
    with pytest.raises(ValueError, match="digit_size 40 exceeds image_size 32"):
        small(image_size=32, digit_size=40)


def test_repeats_allowed_when_not_distinct():
    ds = small(counts=[6], distinct=False, size=10)
    layouts = [ds.layout(i)[0] for i in range(10)]
    assert all(len(l.classes) == 6 for l in layouts)
    assert any(len(set(l.classes.tolist())) < 6 for l in layouts)     # P(6 draws of 10 repeat) = 0.85
    assert all(int(ds[i][1].sum()) == len(set(layouts[i].classes.tolist())) for i in range(10))


def test_each_item_is_a_function_of_seed_split_and_index():
    a, b = small(seed=3), small(seed=3, size=40)
    for i in (7, 0, 19, 3):                                        # any order, any split length
        assert torch.equal(a[i][0], b[i][0]) and torch.equal(a[i][1], b[i][1])
    other_seed, val = small(seed=4), small("val", seed=3)
    assert not torch.equal(a[7][0], other_seed[7][0]) and not torch.equal(a[7][0], val[7][0])


def test_place_samples_free_corners_and_reports_dead_ends():
    rng = np.random.default_rng(0)
    outcomes = [md.place([(60, 30), (60, 30)], 60, rng) for _ in range(200)]   # only the two halves fit
    placed = [sorted(map(tuple, c.tolist())) for c in outcomes if c is not None]
    assert 0 < len(placed) < 50 and all(p == [(0, 0), (0, 30)] for p in placed)  # first corner 0 or 30 of 31
    assert md.place([(40, 40), (40, 40)], 64, rng) is None
    first = np.array([md.place([(10, 10)], 12, np.random.default_rng(s))[0] for s in range(900)])
    assert set(map(tuple, first.tolist())) == {(r, c) for r in range(3) for c in range(3)}  # all 9 corners
    assert np.bincount(first[:, 0] * 3 + first[:, 1]).min() > 60                            # ~100 each


def _write_mnist_pool(root, n=120):
    """idx files whose image i is a block of grey level 10 + i (rows 2..(5 + i % 7), cols 4..20)."""
    images = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        images[i, 2:6 + i % 7, 4:21] = 10 + i
    labels = (np.arange(n) % 10).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    for prefix in ("train", "t10k"):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return images


def test_mnist_digits_from_idx_files_at_native_scale(tmp_path):
    images = _write_mnist_pool(tmp_path / "mnist")
    train, val = small(root=tmp_path / "mnist", counts=[3]), small("val", root=tmp_path / "mnist", counts=[3])
    for ds, offset in ((train, 0), (val, 110)):     # val: the last 120 // 12 = 10 training images
        for i in range(5):
            x, y = ds[i]
            layout, _ = ds.layout(i)
            for c, k, (t, l, h, w) in zip(layout.classes, layout.glyphs, layout.boxes):
                j = offset + int(k)                  # the glyph's row in the idx file
                assert j % 10 == c and (h, w) == (4 + j % 7, 17)            # its label, its ink box
                assert torch.all(x[0, t:t + h, l:l + w] == torch.tensor((10 + j) / 255.0))
            assert x.sum() == pytest.approx(sum((10 + offset + int(k)) / 255.0 * h * w for k, (_, _, h, w)
                                                in zip(layout.glyphs, layout.boxes)), rel=1e-5)
    assert all(int(k) < 10 for i in range(5) for k in val.layout(i)[0].glyphs)
    _write_mnist_pool(tmp_path / "few", n=24)                              # val = 2 images: classes 2, 3
    with pytest.raises(ValueError, match=r"MNIST val .* no image of class\(es\) \[0, 1, 4"):
        small("val", root=tmp_path / "few")


def test_bce_loss_and_multilabel_metrics_values():
    info = get_task("multi_digit")
    logits = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 1.0, -0.2], [1.0, 1.0, 1.0]])
    target = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    p = torch.sigmoid(logits)
    by_hand = -(target * p.log() + (1 - target) * (1 - p).log()).mean()
    assert compute_loss(info, logits, target).item() == pytest.approx(by_hand.item(), rel=1e-6)
    m = compute_metrics(("exact_match", "label_accuracy"), logits, target)
    assert m == {"exact_match": pytest.approx(1 / 3), "label_accuracy": pytest.approx(5 / 9)}
    with pytest.raises(ValueError, match="label_smoothing"):
        compute_loss(info, logits, target, label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"same shape \[N, C\]"):
        compute_metrics(("exact_match",), logits, target[:, :2])


def test_multilabel_targets_are_checked():
    info = get_task("multi_digit")
    check_labels(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), info, 2)
    with pytest.raises(ValueError, match=r"targets must be \[B, 10\].*got \(2, 2\)"):
        check_labels(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), info, 10)
    with pytest.raises(ValueError, match="must be 0 or 1"):
        check_labels(torch.tensor([[0.0, 0.5]]), info, 2)
    with pytest.raises(ValueError, match=r"\[B, 10\]"):
        check_labels(torch.tensor([3, 1]), info, 10)                          # class indices, not multi-hot
