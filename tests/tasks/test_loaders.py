"""Loaders of official on-disk formats, each on a tiny fixture written in that format."""
import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from modwire.nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer
from modwire.tasks import InputSpec, build_dataset, get_task, list_tasks
from modwire.tasks.loaders import images, text

LOADERS = ["cifar10", "cifar100", "fashion_mnist", "imdb_bytes", "kmnist", "lra_listops", "mnist", "mnist_m",
           "modelnet40", "oxford_pet", "pgm", "svhn", "tiny_imagenet", "tiny_imagenet_r", "wikitext2"]


def test_all_loaders_registered_and_need_a_root(tmp_path):
    assert set(LOADERS) <= set(list_tasks(kind="loader"))
    for name in LOADERS:
        info = get_task(name)
        assert info.kind == "loader" and "root" in info.params and info.params["root"] is None
        with pytest.raises(ValueError, match="root=... is required") as e:
            build_dataset(name, info.splits[0])
        assert "Expected layout" in str(e.value) and "nothing is downloaded" in str(e.value)
        with pytest.raises(FileNotFoundError, match="Expected layout") as e:
            build_dataset(name, info.splits[0], root=tmp_path / "nowhere")
        assert "does not exist" in str(e.value)


# ---------------------------------------------------------------- Tiny-ImageNet
def _jpeg(path: Path, color, mode="RGB", size=(64, 64)):
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path, quality=100)


def _decoded(path: Path) -> torch.Tensor:
    from PIL import Image
    with Image.open(path) as im:
        return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).float() / 255


@pytest.fixture
def tiny_root(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "TINY_CLASSES", 2)  # a two-class copy (the real check: test_real_files.py)
    root = tmp_path / "tiny-imagenet-200"
    root.mkdir()
    (root / "wnids.txt").write_text("n02000002\nn01000001\n")  # file order, not sorted order, gives the index
    colors = {"n02000002": [(200, 30, 40), 90], "n01000001": [(10, 220, 120), (60, 60, 250)]}
    for w, cs in colors.items():
        for i, c in enumerate(cs):
            _jpeg(root / "train" / w / "images" / f"{w}_{i}.JPEG", c, mode="L" if isinstance(c, int) else "RGB")
        (root / "train" / w / f"{w}_boxes.txt").write_text("")
    _jpeg(root / "val" / "images" / "val_0.JPEG", (5, 5, 250))
    _jpeg(root / "val" / "images" / "val_1.JPEG", 200, mode="L")
    (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01000001\t0\t0\t63\t63\n"
                                                       "val_1.JPEG\tn02000002\t1\t2\t30\t40\n")
    return root


def test_tiny_imagenet_pixels_labels_and_grayscale(tiny_root):
    train = build_dataset("tiny_imagenet", "train", root=tiny_root.parent)  # the parent is accepted too
    assert len(train) == 4 and [int(train[i][1]) for i in range(4)] == [0, 0, 1, 1]
    for i, (path, _) in enumerate(train.samples):
        x, _ = train[i]
        assert x.shape == (3, 64, 64) and x.dtype == torch.float32
        torch.testing.assert_close(x, _decoded(path), rtol=0, atol=0)
    torch.testing.assert_close(train[0][0][:, 10, 10], torch.tensor([200, 30, 40]) / 255, rtol=0, atol=3 / 255)
    gray = train[1][0]  # a grayscale JPEG becomes three equal channels
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[0], gray[2])
    assert abs(gray[0, 5, 5].item() - 90 / 255) < 2 / 255
    val = build_dataset("tiny_imagenet", "val", root=tiny_root)
    assert len(val) == 2 and [int(val[i][1]) for i in range(2)] == [1, 0]
    torch.testing.assert_close(val[0][0][:, 3, 3], torch.tensor([5, 5, 250]) / 255, rtol=0, atol=3 / 255)
    assert get_task("tiny_imagenet").inputs == InputSpec.image(3, 64, 64)
    assert ConvTokenizer(64, 3, channels=8, pos_dim=4, stem_channels=8)(val[0][0][None]).shape == (1, 64, 12)
    flipped = build_dataset("tiny_imagenet", "val", root=tiny_root, transform=lambda t: t.flip(-1))
    torch.testing.assert_close(flipped[0][0], val[0][0].flip(-1))


def test_tiny_imagenet_errors_show_the_layout(tiny_root):
    (tiny_root / "val" / "val_annotations.txt").rename(tiny_root / "val" / "annotations.txt")
    with pytest.raises(FileNotFoundError, match="val_annotations.txt") as e:
        build_dataset("tiny_imagenet", "val", root=tiny_root)
    assert "train/<wnid>/images/*.JPEG" in str(e.value) and "annotations.txt" in str(e.value).split("Found:")[1]
    (tiny_root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn09999999\t0\t0\t1\t1\n")
    with pytest.raises(ValueError, match="n09999999"):
        build_dataset("tiny_imagenet", "val", root=tiny_root)
    (tiny_root / "wnids.txt").write_text("n02000002\nn01000001\nn03000003\n")
    (tiny_root / "train" / "n03000003").mkdir()
    with pytest.raises(ValueError, match="3 WordNet ids with a train/<wnid>/ folder, expected 2"):
        build_dataset("tiny_imagenet", "train", root=tiny_root)
    images.TINY_CLASSES = 3
    with pytest.raises(FileNotFoundError, match="train/n03000003/images"):
        build_dataset("tiny_imagenet", "train", root=tiny_root)


def test_tiny_imagenet_r_maps_wnids_and_resizes(tiny_root, tmp_path):
    r = tmp_path / "imagenet-r"
    _jpeg(r / "n01000001" / "art_0.jpg", (250, 0, 0), size=(100, 80))
    from PIL import Image
    Image.new("RGB", (30, 30), (0, 0, 255)).save(r / "n01000001" / "cartoon_1.png")
    _jpeg(r / "n05555555" / "art_0.jpg", (0, 250, 0))  # not a Tiny-ImageNet class: skipped
    ds = build_dataset("tiny_imagenet_r", "test", root=r, wnids=tiny_root / "wnids.txt")
    assert len(ds) == 2 and {int(ds[i][1]) for i in range(2)} == {1}  # n01000001 is line 1 of wnids.txt
    for i in range(2):
        assert ds[i][0].shape == (3, 64, 64)
    torch.testing.assert_close(ds[0][0][:, 32, 32], torch.tensor([250, 0, 0]) / 255, rtol=0, atol=4 / 255)
    torch.testing.assert_close(ds[1][0], torch.tensor([0.0, 0, 1])[:, None, None].expand(3, 64, 64))
    own = build_dataset("tiny_imagenet_r", "test", root=r, image_size=32, resize="stretch")
    assert len(own) == 3 and [int(own[i][1]) for i in range(3)] == [0, 0, 1] and own[0][0].shape == (3, 32, 32)
    with pytest.raises(FileNotFoundError, match="no class folder") as e:
        build_dataset("tiny_imagenet_r", "test", root=r, wnids=["n07777777"])
    assert "<wnid>/*.jpg" in str(e.value) and "n05555555/" in str(e.value)


# ---------------------------------------------------------------- CIFAR
def _cifar_batch(n, seed, label_key, bytes_keys=True):
    rng = np.random.default_rng(seed)
    d = {"batch_label": "batch", label_key: rng.integers(0, 10, n).tolist(),
         "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "filenames": [f"f{i}.png" for i in range(n)]}
    return {(k.encode() if bytes_keys else k): v for k, v in d.items()}


def test_cifar10_batches_pixels_and_labels(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    batches = {f"data_batch_{i}": _cifar_batch(2, i, "labels") for i in range(1, 6)}
    batches["test_batch"] = _cifar_batch(3, 9, "labels")
    for name, d in batches.items():
        (root / name).write_bytes(pickle.dumps(d, protocol=2))  # Python-2 era protocol, bytes keys
    train = build_dataset("cifar10", "train", root=tmp_path)
    assert len(train) == 10
    x, y = train[7]  # batch 4, row 1
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.long
    raw = batches["data_batch_4"][b"data"][1]
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(raw.reshape(3, 32, 32)))
    assert round(x[0, 0, 1].item() * 255) == raw[1] and round(x[1, 0, 0].item() * 255) == raw[1024]  # planes R, G, B
    assert int(y) == batches["data_batch_4"][b"labels"][1]
    test = build_dataset("cifar10", "test", root=root)
    assert len(test) == 3 and [int(test[i][1]) for i in range(3)] == batches["test_batch"][b"labels"]


def test_cifar100_fine_labels_str_keys_and_protocol5(tmp_path):
    for split, seed in (("train", 0), ("test", 1)):
        d = _cifar_batch(4, seed, "fine_labels", bytes_keys=False)
        d["coarse_labels"] = [0] * 4
        (tmp_path / split).write_bytes(pickle.dumps(d, protocol=5))
    ds = build_dataset("cifar100", "test", root=tmp_path)
    ref = _cifar_batch(4, 1, "fine_labels", bytes_keys=False)
    assert [int(ds[i][1]) for i in range(4)] == ref["fine_labels"]
    assert torch.equal((ds[3][0] * 255).round().to(torch.uint8).flatten(), torch.from_numpy(ref["data"][3]))
    assert get_task("cifar100").metrics == ("top1", "top5")
    assert ds.classes == [str(k) for k in range(100)]                 # no meta file: the labels as names
    names = [f"class {k}".encode() for k in range(100)]
    (tmp_path / "meta").write_bytes(pickle.dumps({b"fine_label_names": names, b"coarse_label_names": []}, protocol=2))
    assert build_dataset("cifar100", "test", root=tmp_path).classes[:2] == ["class 0", "class 1"]


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_cifar_pickle_with_forbidden_global_is_refused_and_not_run(tmp_path):
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    marker = tmp_path / "pwned"
    d = _cifar_batch(2, 0, "fine_labels")
    d[b"filenames"] = _Evil(marker)
    (root / "train").write_bytes(pickle.dumps(d, protocol=2))
    with pytest.raises(ValueError, match=r"refused to load global (posix|os)\.system") as e:
        build_dataset("cifar100", "train", root=tmp_path)
    assert "fine_labels" in str(e.value)  # the expected format is shown
    assert not marker.exists()
    # hand-written protocol-0 pickle naming os.system directly
    (root / "test").write_bytes(b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR.")
    with pytest.raises(ValueError, match=r"os\.system"):
        build_dataset("cifar100", "test", root=root)
    assert not marker.exists()
    for name, payload in (("builtins", b"eval"), ("builtins", b"getattr"), ("numpy", b"load")):
        (root / "test").write_bytes(b"c" + name.encode() + b"\n" + payload + b"\n(V1\ntR.")
        with pytest.raises(ValueError, match=f"{name}.{payload.decode()}"):
            build_dataset("cifar100", "test", root=root)


def test_cifar_missing_and_truncated_batches(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    (root / "test_batch").write_bytes(pickle.dumps(_cifar_batch(2, 0, "labels"), protocol=2)[:-40])
    with pytest.raises(ValueError, match="malformed file .*test_batch") as e:
        build_dataset("cifar10", "test", root=root)
    assert "data_batch_1 ... data_batch_5" in str(e.value)
    with pytest.raises(FileNotFoundError, match="no batch file data_batch_1; tried:") as e:
        build_dataset("cifar10", "train", root=root)
    assert "test_batch" in str(e.value).split("Found:")[1]
    d = _cifar_batch(2, 0, "labels")
    d[b"data"] = d[b"data"][:, :100]
    (root / "test_batch").write_bytes(pickle.dumps(d, protocol=2))
    with pytest.raises(ValueError, match=r"uint8 \[N, 3072\]"):
        build_dataset("cifar10", "test", root=root)


# ---------------------------------------------------------------- MNIST family
def _idx(path: Path, arr: np.ndarray, gz: bool, magic: int | None = None):
    magic = magic if magic is not None else (0x0800 | arr.ndim)
    data = struct.pack(">I", magic) + b"".join(struct.pack(">I", s) for s in arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def _mnist_root(root: Path, n=3, gz_train=True):
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for prefix, n_, gz in (("train", n, gz_train), ("t10k", 2, False)):
        images, labels = rng.integers(0, 256, (n_, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_, dtype=np.uint8)
        _idx(root / f"{prefix}-images-idx3-ubyte{'.gz' if gz else ''}", images, gz)
        _idx(root / f"{prefix}-labels-idx1-ubyte{'.gz' if gz else ''}", labels, gz)
        arrays[prefix] = images, labels
    return arrays


@pytest.mark.parametrize("task", ["mnist", "fashion_mnist"])
def test_mnist_idx_gz_and_plain_padding_to_32(tmp_path, task):
    arrays = _mnist_root(tmp_path)
    train, test = build_dataset(task, "train", root=tmp_path), build_dataset(task, "test", root=tmp_path)
    assert len(train) == 3 and len(test) == 2
    for ds, (images, labels) in ((train, arrays["train"]), (test, arrays["t10k"])):
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.shape == (1, 32, 32) and int(y) == labels[i]
            assert torch.equal((x[0, 2:30, 2:30] * 255).round().to(torch.uint8), torch.from_numpy(images[i]))
            assert x[:, :2].abs().sum() == 0 and x[:, 30:].abs().sum() == 0 and x[:, :, :2].abs().sum() == 0
    x28 = build_dataset(task, "train", root=tmp_path, pad_to=28)[1][0]
    assert x28.shape == (1, 28, 28) and torch.equal(x28, train[1][0][:, 2:30, 2:30])
    assert get_task(task).inputs == InputSpec.image(1, 32, 32)
    xb, yb = next(iter(DataLoader(train, batch_size=3)))
    assert ConvTokenizer(32, 1, channels=8, pos_dim=4, stem_channels=8)(xb).shape == (3, 16, 12)
    assert yb.dtype == torch.long


def test_mnist_malformed_idx_files(tmp_path):
    _mnist_root(tmp_path)
    images = np.zeros((2, 28, 28), np.uint8)
    _idx(tmp_path / "t10k-images-idx3-ubyte", images, gz=False, magic=0x0801)
    with pytest.raises(ValueError, match="idx magic 0x00000801, expected 0x00000803") as e:
        build_dataset("mnist", "test", root=tmp_path)
    assert "t10k-images-idx3-ubyte" in str(e.value) and "Expected layout" in str(e.value)
    _idx(tmp_path / "t10k-images-idx3-ubyte", images, gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match=r"truncated: header says \[2, 28, 28\] = 1568 bytes of data, found 1563"):
        build_dataset("mnist", "test", root=tmp_path)
    gz = tmp_path / "train-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-6])
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz"):
        build_dataset("mnist", "train", root=tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="no train-labels-idx1-ubyte") as e:
        build_dataset("mnist", "train", root=tmp_path)
    assert "train-images-idx3-ubyte.gz" in str(e.value).split("Found:")[1]


def test_fashion_mnist_root_defaults_to_the_debian_path(tmp_path, monkeypatch):
    # Debian's install path (tests/test_hermetic.py) moved by $MODWIRE_SYSTEM_DATASETS; a fixture in the
    # package's layout (train-images-idx3-ubyte.gz, ...)
    monkeypatch.setenv("MODWIRE_SYSTEM_DATASETS", str(tmp_path))
    arrays = _mnist_root(tmp_path / "fashion-mnist")
    ds = build_dataset("fashion_mnist", "train")
    assert len(ds) == 3 and int(ds[2][1]) == arrays["train"][1][2]
    assert torch.equal(ds[1][0], build_dataset("fashion_mnist", "train", root=tmp_path / "fashion-mnist")[1][0])
    with pytest.raises(ValueError, match="root=... is required"):
        build_dataset("mnist", "train")  # only Fashion-MNIST has a default


# ---------------------------------------------------------------- LRA text
def test_imdb_bytes_round_trip_truncation_and_collate(tmp_path):
    reviews = {("train", "pos", "0_9"): "Great film<br />!".encode(),
               ("train", "pos", "10_8"): "Très bien ✓".encode(), ("train", "pos", "2_7"): b"ok", ("train", "neg", "3_1"): b"\x00\xffbad",
               ("test", "pos", "0_10"): b"x", ("test", "neg", "0_2"): b"no"}
    for (split, lab, name), data in reviews.items():
        (tmp_path / "aclImdb" / split / lab).mkdir(parents=True, exist_ok=True)
        (tmp_path / "aclImdb" / split / lab / f"{name}.txt").write_bytes(data)
    (tmp_path / "aclImdb" / "train" / "unsup").mkdir()
    (tmp_path / "aclImdb" / "train" / "unsup" / "0_0.txt").write_bytes(b"ignored")
    ds = build_dataset("imdb_bytes", "train", root=tmp_path)
    order = [("neg", "3_1"), ("pos", "0_9"), ("pos", "2_7"), ("pos", "10_8")]  # neg then pos, by numeric id
    assert len(ds) == 4 and [int(ds[i][1]) for i in range(4)] == [0, 1, 1, 1]
    for i, (lab, name) in enumerate(order):
        ids, _ = ds[i]
        assert ids.dtype == torch.long and bytes((ids - 1).tolist()) == reviews[("train", lab, name)]
    assert ds[0][0].tolist() == [1, 256, ord("b") + 1, ord("a") + 1, ord("d") + 1]  # byte + 1, 0 is padding
    short = build_dataset("imdb_bytes", "train", root=tmp_path / "aclImdb", max_len=4)
    assert [len(short[i][0]) for i in range(4)] == [4, 4, 2, 4]
    info = get_task("imdb_bytes")
    assert info.inputs == InputSpec.tokens(4096, 257, pad_id=0, padded=True)
    ids, y = next(iter(DataLoader(ds, batch_size=4, collate_fn=info.collate)))
    assert ids.shape == (4, len("Great film<br />!")) and y.tolist() == [0, 1, 1, 1]
    assert ids[2, 2:].eq(0).all() and ids[2, :2].tolist() == [ord("o") + 1, ord("k") + 1]
    assert EmbeddingTokenizer(257, 8, max_len=4096)(ids).shape == (4, ids.shape[1], 8)
    with pytest.raises(FileNotFoundError, match="no folder test/neg/") as e:
        (tmp_path / "aclImdb" / "test" / "neg" / "0_2.txt").unlink()
        (tmp_path / "aclImdb" / "test" / "neg").rmdir()
        build_dataset("imdb_bytes", "test", root=tmp_path)
    assert "train/pos/<id>_<rating>.txt" in str(e.value)


def test_lra_listops_vocabulary_tsv_and_errors(tmp_path):
    rows = ["( ( [MAX 2 9 ( [MIN 4 7 ] ) 0 ] ) )\t9", "[SM 3 ( [MED 1 2 8 ] ) ]\t5", "7\t7"]
    (tmp_path / "basic_train.tsv").write_text("Source\tTarget\n" + "\n".join(rows) + "\n")
    ds = build_dataset("lra_listops", "train", root=tmp_path)
    v = text.LISTOPS_VOCAB
    assert v == {"<pad>": 0, "0": 1, "1": 2, "2": 3, "3": 4, "4": 5, "5": 6, "6": 7, "7": 8, "8": 9, "9": 10,
                 "[MIN": 11, "[MAX": 12, "[MED": 13, "[SM": 14, "]": 15}
    from modwire.tasks.synthetic.listops import TOKEN_NAMES  # the generator's vocabulary: the same ids
    assert v == {name: i for i, name in enumerate(TOKEN_NAMES)}
    assert len(ds) == 3 and [int(ds[i][1]) for i in range(3)] == [9, 5, 7]
    assert ds[0][0].tolist() == [12, 3, 10, 11, 5, 8, 15, 1, 15] and ds[0][0].dtype == torch.long
    assert ds[1][0].tolist() == [14, 4, 13, 2, 3, 9, 15, 15] and ds[-1][0].tolist() == [8]
    assert build_dataset("lra_listops", "train", root=tmp_path, max_len=3)[0][0].tolist() == [12, 3, 10]
    info = get_task("lra_listops")
    assert info.inputs.vocab_size == 16 and info.splits == ("train", "val", "test")
    ids, y = info.collate([ds[0], ds[2]])
    assert ids.tolist() == [[12, 3, 10, 11, 5, 8, 15, 1, 15], [8] + [0] * 8] and y.tolist() == [9, 7]
    (tmp_path / "basic_val.tsv").write_text("Input\tLabel\n7\t7\n")
    with pytest.raises(ValueError, match="header naming the TAB-separated columns Source and Target") as e:
        build_dataset("lra_listops", "val", root=tmp_path)
    assert "basic_test.tsv" in str(e.value)
    (tmp_path / "basic_val.tsv").write_text("Source\tTarget\n( [MAX 1 [FOO 2 ] )\t1\n")
    with pytest.raises(ValueError, match="line 2: unknown ListOps token '\\[FOO'"):
        build_dataset("lra_listops", "val", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="no basic_test.tsv; tried:") as e:
        build_dataset("lra_listops", "test", root=tmp_path)
    assert "basic_train.tsv" in str(e.value).split("Found:")[1]


# ---------------------------------------------------------------- ModelNet40
CUBE_V = [(x - 0.5, y - 0.5, z - 0.5) for x in (0, 1) for y in (0, 1) for z in (0, 1)]
CUBE_F = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]  # quads


def _off(vertices, faces, counts_on_off_line=False, comment=False):
    head = f"OFF{len(vertices)} {len(faces)} 0\n" if counts_on_off_line else f"OFF\n{len(vertices)} {len(faces)} 0\n"
    if comment:
        head = head.replace("OFF\n", "OFF\n# a comment\n\n")
    return (head + "".join(f"{x} {y} {z}\n" for x, y, z in vertices)
            + "".join(f"{len(f)} {' '.join(map(str, f))}\n" for f in faces))


@pytest.fixture
def off_root(tmp_path):
    root = tmp_path / "ModelNet40"
    tri = _off([(0, 0, 0), (2, 0, 0), (0, 1, 0)], [(0, 1, 2)], comment=True)
    files = {"airplane/train/airplane_0001.off": _off(CUBE_V, CUBE_F, counts_on_off_line=True),
             "airplane/test/airplane_0627.off": tri,
             "chair/train/chair_0001.off": tri,
             "chair/train/chair_0002.off": _off(CUBE_V, CUBE_F)}
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    return root


def test_modelnet40_off_points_on_the_surface_uniform_and_deterministic(off_root):
    raw = build_dataset("modelnet40", "train", root=off_root.parent, normalize=False, num_points=3000)
    assert len(raw) == 3 and [int(raw[i][1]) for i in range(3)] == [0, 8, 8]  # airplane, chair of the 40 classes
    cube, _ = raw[0]  # counts on the OFF line, quad faces
    assert cube.shape == (3000, 3) and cube.dtype == torch.float32
    torch.testing.assert_close(cube.abs().amax(1), torch.full((3000,), 0.5))  # every point on a face
    face = torch.stack([(cube[:, k] - s * 0.5).abs() < 1e-6 for k in range(3) for s in (-1, 1)], 1)
    counts = face.sum(0)  # area-weighted: about 500 per face (quads fan-triangulated into 2 triangles)
    assert counts.sum() == 3000 and counts.min() > 400 and counts.max() < 600
    tri, _ = raw[1]  # triangle (0,0,0), (2,0,0), (0,1,0), with a comment line
    assert tri[:, 2].abs().max() == 0 and (tri[:, :2] >= 0).all() and (tri[:, 0] / 2 + tri[:, 1] <= 1 + 1e-6).all()
    assert (tri[:, 0] < 1).float().mean().item() == pytest.approx(0.75, abs=0.04)  # uniform in area
    torch.testing.assert_close(cube, raw[0][0], rtol=0, atol=0)  # same (seed, index), same points
    assert not torch.equal(raw[2][0], cube)  # the same cube at another index: other points
    other = build_dataset("modelnet40", "train", root=off_root, normalize=False, num_points=3000, seed=1)
    assert not torch.equal(other[0][0], cube)
    norm = build_dataset("modelnet40", "train", root=off_root, format="off")
    pts, _ = norm[0]
    assert pts.shape == (1024, 3)
    torch.testing.assert_close(pts.mean(0), torch.zeros(3), rtol=0, atol=1e-5)
    assert pts.norm(dim=1).max().item() == pytest.approx(1.0, abs=1e-6)
    raw1024 = build_dataset("modelnet40", "train", root=off_root, normalize=False)[0][0].double()
    centred = raw1024 - raw1024.mean(0)
    torch.testing.assert_close(pts.double(), centred / centred.norm(dim=1).max(), rtol=0, atol=1e-6)
    test = build_dataset("modelnet40", "test", root=off_root)
    assert len(test) == 1 and int(test[0][1]) == 0
    assert get_task("modelnet40").inputs == InputSpec.vectors(1024, 3)
    xb, _ = next(iter(DataLoader(norm, batch_size=3)))
    assert LinearTokenizer(3, 8)(xb).shape == (3, 1024, 8)


def test_modelnet40_malformed_off_and_layout_errors(off_root):
    bad = off_root / "chair" / "train" / "chair_0001.off"
    bad.write_text(_off(CUBE_V, CUBE_F)[:-12])  # last face line cut
    with pytest.raises(ValueError, match="truncated: header says 8 vertices \\+ 6 faces, found 13 lines") as e:
        build_dataset("modelnet40", "train", root=off_root)[1]
    assert "chair_0001.off" in str(e.value) and "OFF490 518 0" in str(e.value)
    bad.write_text(_off(CUBE_V, [(0, 1, 8)]))
    with pytest.raises(ValueError, match=r"face vertex index out of range \[0, 8\)"):
        build_dataset("modelnet40", "train", root=off_root)[1]
    bad.write_text("PLY\n3 1 0\n")
    with pytest.raises(ValueError, match="must start with 'OFF'"):
        build_dataset("modelnet40", "train", root=off_root)[1]
    (off_root / "spaceship" / "train").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"\['spaceship'\] are not ModelNet40 classes"):
        build_dataset("modelnet40", "train", root=off_root)
    with pytest.raises(FileNotFoundError, match="format 'resampled'") as e:
        build_dataset("modelnet40", "train", root=off_root, format="resampled")
    assert "modelnet40_shape_names.txt" in str(e.value) and "airplane/" in str(e.value)


def test_modelnet40_resampled_text_format(tmp_path):
    root = tmp_path / "modelnet40_normal_resampled"
    root.mkdir()
    (root / "modelnet40_shape_names.txt").write_text("airplane\nnight_stand\n")
    (root / "modelnet40_train.txt").write_text("night_stand_0001\nairplane_0001\n")
    (root / "modelnet40_test.txt").write_text("airplane_0002\n")
    rng = np.random.default_rng(0)
    clouds = {}
    for sid, n in (("night_stand_0001", 50), ("airplane_0001", 40), ("airplane_0002", 8)):
        pts = rng.normal(size=(n, 6)).round(6)
        clouds[sid] = pts
        (root / sid.rsplit("_", 1)[0]).mkdir(exist_ok=True)
        (root / sid.rsplit("_", 1)[0] / f"{sid}.txt").write_text(
            "".join(",".join(f"{v:.6f}" for v in row) + "\n" for row in pts))
    ds = build_dataset("modelnet40", "train", root=tmp_path, num_points=16, normalize=False)
    assert len(ds) == 2 and [int(ds[i][1]) for i in range(2)] == [1, 0]
    torch.testing.assert_close(ds[0][0], torch.tensor(clouds["night_stand_0001"][:16, :3], dtype=torch.float32))
    rnd = build_dataset("modelnet40", "train", root=root, num_points=16, normalize=False, pick="random")
    rows = {tuple(r) for r in np.float32(clouds["night_stand_0001"][:, :3]).tolist()}
    got = rnd[0][0]
    assert {tuple(r) for r in got.tolist()} <= rows and len({tuple(r) for r in got.tolist()}) == 16
    assert torch.equal(got, rnd[0][0]) and not torch.equal(got, ds[0][0])
    few = build_dataset("modelnet40", "test", root=root, num_points=16, normalize=False)[0][0]  # 8 rows → filled
    assert few.shape == (16, 3) and torch.equal(few[:8], torch.tensor(clouds["airplane_0002"][:, :3],
                                                                        dtype=torch.float32))
    normed = build_dataset("modelnet40", "train", root=root, num_points=16)[1][0]
    assert normed.norm(dim=1).max().item() == pytest.approx(1.0, abs=1e-6)
    (root / "modelnet40_test.txt").write_text("airplane_0003\n")
    with pytest.raises(FileNotFoundError, match="airplane/airplane_0003.txt") as e:
        build_dataset("modelnet40", "test", root=root)
    assert "x,y,z,nx,ny,nz" in str(e.value)


# ---------------------------------------------------------------- PGM
def _pgm(path: Path, seed: int, target: int, image_shape=(16, 160, 160)):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, image_shape, dtype=np.uint8)
    np.savez(path, image=image, target=np.int64(target), meta_target=np.eye(12, dtype=np.int64)[seed % 12])
    return image


def test_pgm_npz_panels_targets_and_order(tmp_path):
    folder = tmp_path / "neutral"
    folder.mkdir()
    images = {i: _pgm(folder / f"PGM_neutral_train_{i}.npz", i, i % 8) for i in (0, 1, 10, 2)}
    _pgm(folder / "PGM_neutral_val_0.npz", 5, 3)
    _pgm(folder / "PGM_interpolation_train_0.npz", 6, 4)
    ds = build_dataset("pgm", "train", root=tmp_path, panel_size=160)  # root/<regime>/ is found; the files' size
    assert len(ds) == 4 and [int(ds[i][1]) for i in range(4)] == [0, 1, 2, 2]  # ordered by i: 0, 1, 2, 10
    x, y = ds[3]
    assert x.shape == (16, 160, 160) and x.dtype == torch.float32 and y.dtype == torch.long
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(images[10]))
    assert ds.meta_target(3).tolist() == np.eye(12, dtype=np.int64)[10].tolist()
    assert len(build_dataset("pgm", "val", root=folder)) == 1
    flat = build_dataset("pgm", "train", root=folder, flatten=True, panel_size=160)[3][0]
    assert flat.shape == (16, 25600) and torch.equal(flat[9], x[9].flatten())
    assert get_task("pgm").resolve({"panel_size": 160}).inputs == InputSpec.image(16, 160, 160)
    assert get_task("pgm").resolve({"flatten": True, "panel_size": 160}).inputs == InputSpec.vectors(
        16, 25600, ordered=True)
    assert ConvTokenizer(160, 16, channels=4, pos_dim=2, stem_channels=4)(x[None]).shape == (1, 400, 6)
    assert LinearTokenizer(25600, 4, max_len=16)(flat[None]).shape == (1, 16, 4)
    with pytest.raises(FileNotFoundError, match="no files PGM_extrapolation_train_<i>.npz") as e:
        build_dataset("pgm", "train", root=tmp_path, regime="extrapolation")
    assert "meta_target" in str(e.value) and "neutral/" in str(e.value)


def test_pgm_malformed_files(tmp_path):
    _pgm(tmp_path / "PGM_neutral_test_0.npz", 0, 9)
    _pgm(tmp_path / "PGM_neutral_test_1.npz", 1, 1, image_shape=(16, 100))
    np.savez(tmp_path / "PGM_neutral_test_2.npz", image=np.array([object()]), target=np.int64(1))
    (tmp_path / "PGM_neutral_test_3.npz").write_bytes(b"not a zip")
    ds = build_dataset("pgm", "test", root=tmp_path)
    with pytest.raises(ValueError, match="'target' must be one integer 0-7, got \\[9\\]"):
        ds[0]
    with pytest.raises(ValueError, match="'image' has 1600 values, expected 16\\*160\\*160") as e:
        ds[1]
    assert "PGM_<regime>_<split>_<i>.npz" in str(e.value)
    with pytest.raises(ValueError, match="PGM_neutral_test_2.npz"):
        ds[2]  # object arrays are never unpickled
    with pytest.raises(ValueError, match=r"a text file, not a .npz \(zip\) archive"):
        ds[3]


def test_imagenet_class_folders(tmp_path):
    from PIL import Image
    import numpy as np
    import modwire.tasks as T

    for split, wnids in (("train", ["n02", "n01"]), ("val", ["n01"])):
        for w in wnids:
            (tmp_path / split / w).mkdir(parents=True)
            Image.fromarray(np.full((40, 60, 3), 200 if w == "n01" else 10, np.uint8)).save(tmp_path / split / w / "a.JPEG")
    train = T.build_dataset("imagenet", "train", root=str(tmp_path), image_size=32)
    val = T.build_dataset("imagenet", "val", root=str(tmp_path), image_size=32)
    assert len(train) == 2 and len(val) == 1
    x, y = val[0]
    assert x.shape == (3, 32, 32) and int(y) == 0  # classes = sorted train folders: n01 → 0
    assert abs(float(x.mean()) - 200 / 255) < 0.02
    with pytest.raises(FileNotFoundError, match="train/<wnid>"):
        T.build_dataset("imagenet", "train", root=str(tmp_path / "nowhere"))


def test_pgm_panel_size_area_downsamples(tmp_path):
    from task_fixtures import write_pgm

    written = write_pgm(tmp_path, "test", 2)
    full = build_dataset("pgm", "test", root=tmp_path, panel_size=160)[1][0]
    x, y = build_dataset("pgm", "test", root=tmp_path)[1]              # NI: 80×80 panels (the default)
    assert x.shape == (16, 80, 80) and int(y) == written[1][1] == 1
    want = full.reshape(16, 80, 2, 80, 2).mean((2, 4))                  # each pixel: the mean of its 2×2 block
    assert torch.allclose(x, want, atol=1e-6) and float(x[9, 3, 5]) == pytest.approx(
        written[1][0][9, 6:8, 10:12].mean() / 255, abs=1e-6)
    assert build_dataset("pgm", "test", root=tmp_path, panel_size=40, flatten=True)[0][0].shape == (16, 1600)
    assert get_task("pgm").inputs == InputSpec.image(16, 80, 80)
    assert get_task("pgm").resolve({"panel_size": 160, "flatten": True}).inputs == InputSpec.vectors(
        16, 25600, ordered=True)
    for bad in (0, 161, 80.0, True):
        with pytest.raises(ValueError, match=rf"parameter 'panel_size': got {bad!r}[ ,].*expected an "
                                             rf"int(eger in \[1, 160\]| like its default 80)"):
            build_dataset("pgm", "test", root=tmp_path, panel_size=bad)
    with pytest.raises(ValueError, match=r"^task 'pgm': parameter 'panel_size': got 200, expected an integer in "
                                         r"\[1, 160\]"):
        get_task("pgm").resolve({"panel_size": 200})
