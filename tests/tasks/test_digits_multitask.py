"""NI's digits multi-task (NI §4.2, App. C.1): SVHN / K-MNIST / MNIST-M loaders on fixtures the
tests write, the multi-task loader, its offline stand-in, and RandAugment on dict inputs."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from modwire.models.inputs import InputSpec
from modwire.tasks import build_dataset, describe_task, get_task
from modwire.tasks.augment import AugmentedDataset, RandAugment, RandomHorizontalFlip, rand_augment_transform
from modwire.tasks.synthetic import digits_offline as off
from modwire.training import apply_augmentation, load_config
from task_fixtures import write_mnist, write_mnist_m, write_svhn


def test_svhn_mat_pixels_labels_and_layout(tmp_path):
    x, y = write_svhn(tmp_path / "svhn", n=12)
    ds = build_dataset("svhn", "train", root=tmp_path)               # root/svhn/ is found
    assert len(ds) == 12 and get_task("svhn").inputs == InputSpec.image(3, 32, 32)
    img, label = ds[9]
    assert img.shape == (3, 32, 32) and img.dtype == torch.float32 and label.dtype == torch.long
    assert int(label) == 0 and [int(ds[i][1]) for i in range(3)] == [1, 2, 3]   # label 10 is the digit 0
    assert torch.equal((img * 255).round().to(torch.uint8), torch.from_numpy(x[..., 9]).permute(2, 0, 1))
    assert float(img[1, 4, 7]) == pytest.approx(x[4, 7, 1, 9] / 255)   # channel 1, row 4, column 7
    with pytest.raises(FileNotFoundError, match="no SVHN file test_32x32.mat") as e:
        build_dataset("svhn", "test", root=tmp_path)
    assert "X uint8 [32, 32, 3, N]" in str(e.value)


def test_kmnist_npz_and_idx_formats(tmp_path):
    rng = np.random.default_rng(3)
    images, labels = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8), np.arange(5, dtype=np.uint8) * 2
    np.savez(tmp_path / "kmnist-train-imgs.npz", images)
    np.savez(tmp_path / "kmnist-train-labels.npz", labels)
    ds = build_dataset("kmnist", "train", root=tmp_path)
    x, y = ds[2]
    assert x.shape == (1, 32, 32) and int(y) == 4
    assert torch.equal((x[0, 2:30, 2:30] * 255).round().to(torch.uint8), torch.from_numpy(images[2]))
    rgb = build_dataset("kmnist", "train", root=tmp_path, upsample_to=32, channels=3)[2][0]
    want = F.interpolate(torch.from_numpy(images[2]).float()[None, None] / 255, size=(32, 32), mode="bilinear",
                         align_corners=False, antialias=True)[0, 0]
    assert rgb.shape == (3, 32, 32) and torch.allclose(rgb[0], want) and torch.equal(rgb[0], rgb[2])
    assert describe_task("kmnist", {"upsample_to": 32, "channels": 3}).inputs == InputSpec.image(3, 32, 32)
    idx = write_mnist(tmp_path / "idx")                                # the MNIST-style files
    x, y = build_dataset("kmnist", "test", root=tmp_path / "idx")[1]
    assert int(y) == int(idx["t10k"][1][1])
    assert torch.equal((x[0, 2:30, 2:30] * 255).round().to(torch.uint8), torch.from_numpy(idx["t10k"][0][1]))


def test_mnist_m_folders(tmp_path):
    images = write_mnist_m(tmp_path / "mnist_m")
    ds = build_dataset("mnist_m", "test", root=tmp_path)
    x, y = ds[1]
    want = F.interpolate(torch.from_numpy(images["test"][1]).permute(2, 0, 1).float()[None] / 255, size=(32, 32),
                         mode="bilinear", align_corners=False, antialias=True)[0]
    assert len(ds) == 3 and int(y) == 4 and x.shape == (3, 32, 32) and torch.allclose(x, want, atol=1e-6)


def test_fashion_mnist_as_32x32_rgb(tmp_path):
    arrays = write_mnist(tmp_path)
    x, y = build_dataset("fashion_mnist", "train", root=tmp_path, upsample_to=32, channels=3)[0]
    assert x.shape == (3, 32, 32) and int(y) == int(arrays["train"][1][0]) and torch.equal(x[0], x[1])
    assert build_dataset("mnist", "train", root=tmp_path)[0][0].shape == (1, 32, 32)     # defaults unchanged


def test_digits_multitask_from_the_three_sources(tmp_path):
    write_svhn(tmp_path / "svhn", "train", n=5)
    write_svhn(tmp_path / "svhn", "test", n=2, seed=5)
    write_mnist_m(tmp_path / "mnist_m")
    mnist = write_mnist(tmp_path / "mnist")
    roots = {"svhn_root": tmp_path / "svhn", "mnist_m_root": tmp_path / "mnist_m", "mnist_root": tmp_path / "mnist"}
    info = get_task("digits_multitask")
    assert (info.heads, info.num_classes) == (3, 10)
    assert info.inputs == {"x": InputSpec.image(3, 32, 32), "task": InputSpec.index(3)}
    ds = build_dataset("digits_multitask", "train", **roots)
    assert len(ds) == 5 + 3 + 4
    tasks = [int(ds[i][0]["task"]) for i in range(len(ds))]
    assert tasks == [0] * 5 + [1] * 3 + [2] * 4 and [ds.task_of(i) for i in range(len(ds))] == tasks
    inp, y = ds[9]                                                    # MNIST item 1: upsampled to 32x32 RGB
    assert inp["x"].shape == (3, 32, 32) and inp["task"].dtype == torch.long and inp["task"].shape == ()
    assert int(y) == int(mnist["train"][1][1]) and torch.equal(inp["x"][0], inp["x"][2])
    assert torch.equal(ds[0][0]["x"], build_dataset("svhn", "train", root=tmp_path / "svhn")[0][0])
    assert len(build_dataset("digits_multitask", "val", **roots)) == 2 + 3 + 4   # val = test
    batch = {"x": torch.zeros(4, 3, 32, 32), "task": torch.tensor([2, 0, 1, 0])}
    assert {k: f(batch).tolist() for k, f in info.subsets.items()} == {
        "svhn": [False, True, False, True], "mnist_m": [False, False, True, False], "mnist": [True, False, False, False]}
    only = build_dataset("digits_multitask", "train", mnist_root=tmp_path / "mnist", sources=["mnist"])
    assert len(only) == 4 and int(only[0][0]["task"]) == 2            # ids stay those of (svhn, mnist_m, mnist)


def test_offline_digits_multitask_is_deterministic_with_disjoint_splits():
    info = get_task("digits_multitask_offline")
    assert info.kind == "generator" and (info.heads, info.num_classes) == (3, 10)
    assert info.inputs == {"x": InputSpec.image(3, 32, 32), "task": InputSpec.index(3)}
    ds = build_dataset("digits_multitask_offline", "train", size=30)
    again = build_dataset("digits_multitask_offline", "train", size=30)
    other = build_dataset("digits_multitask_offline", "train", size=30, seed=1)
    for i in (0, 1, 2, 13):
        (a, ya), (b, yb) = ds[i], again[i]
        assert torch.equal(a["x"], b["x"]) and int(ya) == int(yb) and int(a["task"]) == i % 3
        assert a["x"].dtype == torch.float32 and a["x"].shape == (3, 32, 32) and 0 <= a["x"].min() <= a["x"].max() <= 1
        assert not torch.equal(a["x"], other[i][0]["x"])
    x = torch.stack([ds[i][0]["x"] for i in range(30)])
    grey = (x[:, 0] == x[:, 1]).flatten(1).all(1) & (x[:, 1] == x[:, 2]).flatten(1).all(1)
    assert grey.tolist() == [i % 3 == 2 for i in range(30)]           # only the MNIST-like images are grey
    assert float(x[2::3].amin((1, 2, 3)).max()) == 0.0                 # ... on black
    pools = {s: off.base_images(s)[0].reshape(-1, 64) for s in ("train", "val", "test")}
    assert [len(p) for p in pools.values()] == [1197, 300, 300]
    rows = {s: {r.tobytes() for r in p} for s, p in pools.items()}
    assert not (rows["train"] & rows["val"]) and not (rows["train"] & rows["test"]) and not (rows["val"] & rows["test"])
    # an item is its base digit rendered: the label is that digit's, the MNIST-like image the digit upsampled
    from modwire.tasks.synthetic._common import sample_rng
    glyphs, labels = off.base_images("train")
    rng = sample_rng(0, "train", 2)
    k = int(rng.integers(len(labels)))
    side = int(rng.integers(22, 27))
    top, left = (32 - side) // 2 + rng.integers(-2, 3, size=2)
    want = torch.zeros(32, 32)
    want[top:top + side, left:left + side] = F.interpolate(torch.from_numpy(glyphs[k])[None, None], size=(side, side),
                                                           mode="bilinear", align_corners=False)[0, 0]
    x2, y2 = ds[2]
    assert int(y2) == int(labels[k]) and torch.allclose(x2["x"][0], want, atol=1e-6)


def test_randaugment_only_on_dict_inputs_and_in_training_configs():
    t = rand_augment_transform()
    assert not any(isinstance(s, RandomHorizontalFlip) for s in t.transforms)   # no flip, no crop: digits
    assert [type(s).__name__ for s in t.transforms] == ["ToFloat", "RandAugment"]
    base = build_dataset("digits_multitask_offline", "train", size=6)
    aug = AugmentedDataset(base, t, seed=3)
    (a, ya), (b, _) = aug[4], base[4]
    assert torch.equal(a["task"], b["task"]) and int(ya) == int(base[4][1]) and a["x"].shape == (3, 32, 32)
    assert torch.equal(a["x"], aug[4][0]["x"])                        # a function of (seed, epoch, index)
    changed = [not torch.equal(AugmentedDataset(base, t, seed=s)[4][0]["x"], b["x"]) for s in range(4)]
    assert any(changed)
    cfg = load_config(None, ["data.task=digits_multitask_offline", "data.augment=randaugment",
                             "data.params={size: {train: 6, val: 3, test: 3}}"])
    train, val, mixer = apply_augmentation(cfg, get_task("digits_multitask_offline"), base, base)
    assert isinstance(train, AugmentedDataset) and val is base and mixer is None
    assert isinstance(train.transform.transforms[1], RandAugment)
