"""What public copies of the datasets look like on day one: extra Tiny-ImageNet ids, either ListOps
column order, explicit split files, a dataset in an unexpected place (every path tried is shown),
and an HTML page saved where binary data was expected (a failed download). Tiny fixtures only."""
import warnings

import pytest
from PIL import Image

from modwire.tasks import build_dataset
from modwire.tasks.loaders._common import text_problem

HTML = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in</body></html>\n"


# ---------------------------------------------------------------- Tiny-ImageNet: exactly 200 classes

def _tiny(root, wnids, with_train):
    """A Tiny-ImageNet copy whose wnids.txt lists ``wnids``; train folders (empty) for ``with_train``;
    two validation images, of the first two ids."""
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in with_train:
        (root / "train" / w).mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (64, 64), (i * 100, 0, 0)).save(root / "val" / "images" / f"val_{i}.JPEG")
    (root / "val" / "val_annotations.txt").write_text(
        "".join(f"val_{i}.JPEG\t{wnids[i]}\t0\t0\t1\t1\n" for i in range(2)))


WNIDS = [f"n{i:08d}" for i in range(203)]


def test_extra_wnids_without_train_folders_are_dropped_with_a_warning(tmp_path):
    extra = [WNIDS[0], WNIDS[7], WNIDS[150]]
    _tiny(tmp_path, WNIDS, [w for w in WNIDS if w not in extra])    # 203 ids, 200 train folders
    (tmp_path / "val" / "val_annotations.txt").write_text(f"val_0.JPEG\t{WNIDS[1]}\t0\t0\t1\t1\n")
    with pytest.warns(UserWarning, match=r"dropped 3 of the 203 ids of .*wnids.txt that have no train/<wnid>/ "
                                         r"folder: n00000000, n00000007, n00000150"):
        val = build_dataset("tiny_imagenet", "val", root=tmp_path)
    assert val.classes == [w for w in WNIDS if w not in extra] and len(val.classes) == 200
    assert int(val[0][1]) == 0  # n00000001 is class 0 once n00000000 is dropped: the kept ids keep their order


@pytest.mark.parametrize("n_ids,n_train,needle", [
    (203, 199, "199 WordNet ids with a train/<wnid>/ folder, expected 200"),
    (150, 150, "150 WordNet ids with a train/<wnid>/ folder, expected 200"),
])
def test_not_200_classes_is_refused(tmp_path, n_ids, n_train, needle):
    _tiny(tmp_path, WNIDS[:n_ids], WNIDS[:n_train])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=needle) as e:
            build_dataset("tiny_imagenet", "val", root=tmp_path)
    assert str(tmp_path / "wnids.txt") in str(e.value)


def test_exactly_200_ids_load_without_a_warning(tmp_path):
    _tiny(tmp_path, WNIDS[:200], WNIDS[:200])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        val = build_dataset("tiny_imagenet", "val", root=tmp_path)
    assert [int(val[i][1]) for i in range(2)] == [0, 1]


def test_an_html_page_saved_as_a_jpeg_is_named(tmp_path):
    _tiny(tmp_path, WNIDS[:200], WNIDS[:200])
    (tmp_path / "val" / "images" / "val_1.JPEG").write_bytes(HTML)
    val = build_dataset("tiny_imagenet", "val", root=tmp_path)
    with pytest.raises(ValueError, match=r"val_1.JPEG: a text file, not an image: it looks like an HTML page "
                                         r"\(starts with '<!DOCTYPE html>'\): a failed download\?"):
        val[1]


# ---------------------------------------------------------------- LRA ListOps TSV

ROWS = [("( [MAX 2 9 ] )", 9), ("[SM 3 4 ]", 7)]


def test_listops_either_column_order_by_the_header(tmp_path):
    (tmp_path / "basic_train.tsv").write_text("Source\tTarget\n" + "".join(f"{s}\t{t}\n" for s, t in ROWS))
    (tmp_path / "basic_val.tsv").write_text("Target\tSource\n" + "".join(f"{t}\t{s}\n" for s, t in ROWS))
    a, b = (build_dataset("lra_listops", split, root=tmp_path) for split in ("train", "val"))
    assert [int(a[i][1]) for i in range(2)] == [9, 7] == [int(b[i][1]) for i in range(2)]
    assert all(a[i][0].tolist() == b[i][0].tolist() for i in range(2)) and a[0][0].tolist() == [12, 3, 10, 15]


@pytest.mark.parametrize("first_line", ["( [MAX 2 9 ] )\t9", "9\t( [MAX 2 9 ] )", "Input\tLabel", "Source"])
def test_listops_without_a_header_is_refused(tmp_path, first_line):
    (tmp_path / "basic_train.tsv").write_text(first_line + "\n[SM 3 4 ]\t7\n")
    with pytest.raises(ValueError, match="first line must be the header naming the TAB-separated columns "
                                         "Source and Target") as e:
        build_dataset("lra_listops", "train", root=tmp_path)
    assert repr(first_line[:60]) in str(e.value)


def test_listops_html_and_non_utf8_files_are_named(tmp_path):
    (tmp_path / "basic_train.tsv").write_bytes(HTML)
    with pytest.raises(ValueError, match="looks like an HTML page .*a failed download"):
        build_dataset("lra_listops", "train", root=tmp_path)
    (tmp_path / "basic_train.tsv").write_bytes(b"Source\tTarget\n[SM 3 4 ]\t7\xff\n")
    with pytest.raises(ValueError, match=r"basic_train.tsv: not UTF-8 text \(invalid start byte at byte 25\)"):
        build_dataset("lra_listops", "train", root=tmp_path)


def test_listops_explicit_split_files(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.tsv").write_text("Source\tTarget\n[SM 3 4 ]\t7\n")
    (tmp_path / "b.tsv").write_text("Target\tSource\n1\t[MIN 1 2 ]\n2\t2\n")
    files = {"train": "sub/a.tsv", "val": str(tmp_path / "b.tsv")}
    train = build_dataset("lra_listops", "train", root=tmp_path, files=files)
    val = build_dataset("lra_listops", "val", root=tmp_path, files=files)
    assert (len(train), int(train[0][1]), len(val), int(val[1][1])) == (1, 7, 2, 2)
    monkeypatch.chdir(tmp_path)   # without root: relative to the working directory
    assert len(build_dataset("lra_listops", "train", files=files)) == 1
    with pytest.raises(ValueError, match=r"files has no entry for split 'test' \(it has \['train', 'val'\]\)"):
        build_dataset("lra_listops", "test", files=files)
    with pytest.raises(FileNotFoundError, match="files.train: no file .*nope.tsv"):
        build_dataset("lra_listops", "train", root=tmp_path, files={"train": "nope.tsv"})
    with pytest.raises(ValueError, match="files must map split names to TSV files"):
        build_dataset("lra_listops", "train", root=tmp_path, files="a.tsv")


def test_listops_is_found_in_the_lra_release_layout(tmp_path):
    folder = tmp_path / "lra_release" / "listops-1000"
    folder.mkdir(parents=True)
    (folder / "basic_test.tsv").write_text("Source\tTarget\n[SM 3 4 ]\t7\n")
    assert len(build_dataset("lra_listops", "test", root=tmp_path)) == 1
    assert len(build_dataset("lra_listops", "test", root=tmp_path / "lra_release")) == 1


# ---------------------------------------------------------------- every path tried

@pytest.mark.parametrize("task,split,expected", [
    ("lra_listops", "val", ["basic_val.tsv", "listops-1000/basic_val.tsv", "lra_release/listops-1000/basic_val.tsv"]),
    ("mnist", "train", [f"{d}train-images{s}idx3-ubyte{g}" for d in ("", "raw/", "MNIST/raw/")
                        for s in ("-", ".") for g in ("", ".gz")]),
    ("cifar10", "test", ["cifar-10-batches-py/test_batch", "test_batch"]),
    ("cifar100", "train", ["cifar-100-python/train", "train"]),
    ("imdb_bytes", "test", ["test", "aclImdb/test"]),
    ("pgm", "val", ["neutral/PGM_neutral_val_<i>.npz", "PGM_neutral_val_<i>.npz"]),
    ("modelnet40", "train", ["/", "modelnet40_normal_resampled/", "ModelNet40/"]),
    ("tiny_imagenet", "train", ["wnids.txt", "tiny-imagenet-200/wnids.txt"]),
])
def test_not_found_lists_every_path_tried(tmp_path, task, split, expected):
    (tmp_path / "unrelated.txt").write_text("x")
    with pytest.raises(FileNotFoundError) as e:
        build_dataset(task, split, root=tmp_path)
    msg = str(e.value)
    assert "tried" in msg, msg
    for rel in expected:
        assert f"  {tmp_path}/{rel}".rstrip("/") in msg, (rel, msg)
    assert "unrelated.txt" in msg.split("Found:")[1]


def test_a_relative_root_that_is_missing_shows_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"relative to the working directory: {tmp_path}/data/mnist"):
        build_dataset("mnist", "train", root="data/mnist")


# ---------------------------------------------------------------- text or HTML where binary was expected

@pytest.mark.parametrize("task,split,rel,what", [
    ("mnist", "train", "train-images-idx3-ubyte.gz", "an idx file (raw or gzipped)"),
    ("cifar10", "test", "test_batch", "a CIFAR pickle batch"),
    ("cifar100", "test", "test", "a CIFAR pickle batch"),
])
def test_an_html_page_where_binary_data_was_expected(tmp_path, task, split, rel, what):
    (tmp_path / rel).write_bytes(HTML)
    if task == "mnist":
        (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x00")
    with pytest.raises(ValueError) as e:
        build_dataset(task, split, root=tmp_path)
    msg = str(e.value)
    assert f"{tmp_path / rel}: a text file, not {what}: it looks like an HTML page (starts with " \
           f"'<!DOCTYPE html>'): a failed download?" in msg, msg


def test_pgm_and_off_files_that_are_html(tmp_path):
    (tmp_path / "PGM_neutral_test_0.npz").write_bytes(HTML)
    ds = build_dataset("pgm", "test", root=tmp_path)
    with pytest.raises(ValueError, match="not a .npz \\(zip\\) archive: it looks like an HTML page"):
        ds[0]
    (tmp_path / "chair" / "train").mkdir(parents=True)
    (tmp_path / "chair" / "train" / "chair_0001.off").write_bytes(HTML)
    ds = build_dataset("modelnet40", "train", root=tmp_path)
    with pytest.raises(ValueError, match="chair_0001.off: the file is a text file, not an OFF mesh: it looks like "
                                         "an HTML page"):
        ds[0]


@pytest.mark.parametrize("head,expected", [
    (b"", "the file is empty, not X"),
    (b"  <html lang='en'>", "a text file, not X: it looks like an HTML page (starts with \"<html lang='en'>\")"),
    (b"hello,world\n1,2\n", "a text file, not X (it starts with 'hello,world')"),
    (b"\x00\x00\x08\x03\x00\x00", None),
    (b"\x80\x02}q\x00(", None),
    (b"\x1f\x8b\x08\x00", None),
])
def test_text_problem(head, expected):
    got = text_problem(head, "X")
    assert got == expected if expected is None else expected in got


def test_tiny_imagenet_r_reads_wnids_as_training_does(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    _tiny(tiny, WNIDS[:201], WNIDS[1:201])            # wnids.txt has one extra id, n00000000
    r = tmp_path / "imagenet-r"
    for w in (WNIDS[0], WNIDS[1]):
        (r / w).mkdir(parents=True)
        Image.new("RGB", (80, 60), (0, 0, 200)).save(r / w / "a.jpg")
    with pytest.warns(UserWarning, match="dropped 1 of the 201 ids"):
        ds = build_dataset("tiny_imagenet_r", "test", root=r, wnids=str(tiny / "wnids.txt"))
    assert len(ds) == 1 and int(ds[0][1]) == 0     # n00000001 is class 0, as in training
