"""Probe: malformed SVHN .mat, K-MNIST .npz and MNIST-M label lists name the file and the layout."""
import numpy as np
import pytest
from scipy.io import savemat

from modwire.tasks import build_dataset


def _mat(path, **arrays):
    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(path, arrays)


@pytest.mark.parametrize("write, match", [
    (lambda p: p.write_text("<html><body>Not found</body></html>"), r"a text file, not a MATLAB v5 .mat file.*HTML"),
    (lambda p: p.write_bytes(b""), r"the file is empty"),
    (lambda p: p.write_bytes(b"MATLAB 7.3 MAT-file, Platform: GLNXA64" + bytes(200)), r"MATLAB v7.3 \(HDF5\) file"),
    (lambda p: p.write_bytes(b"MATLAB 5.0 MAT-file" + bytes(40)), r"not a readable MATLAB file"),
    (lambda p: _mat(p, X=np.zeros((32, 32, 3, 2), np.uint8)), r"no variable\(s\) \['y'\]"),
    (lambda p: _mat(p, X=np.zeros((3, 32, 32, 2), np.uint8), y=np.ones((2, 1))), r"X must be uint8 \[32, 32, 3, N\], "
                                                                                  r"got uint8 \[3, 32, 32, 2\]"),
    (lambda p: _mat(p, X=np.zeros((32, 32, 3, 2), np.uint8), y=np.ones((3, 1))), r"3 labels in y for 2 images"),
    (lambda p: _mat(p, X=np.zeros((32, 32, 3, 2), np.uint8), y=np.array([[1], [11]])), r"labels 1-10.*\[1, 11\]"),
])
def test_malformed_svhn_mat(tmp_path, write, match):
    path = tmp_path / "train_32x32.mat"
    write(path)
    with pytest.raises(ValueError, match=match) as e:
        build_dataset("svhn", "train", root=tmp_path)
    assert f"malformed file {path}" in str(e.value) and "y [N, 1] labels 1-10 (10 = digit 0)" in str(e.value)


@pytest.mark.parametrize("images, labels, match, bad", [
    ("two", np.arange(2), r"expected one array \(images \[N, 28, 28\]\), found \['arr_0', 'arr_1'\]", "imgs"),
    ("object", np.arange(2), r"unreadable array .*allow_pickle", "imgs"),
    ("zip", np.arange(2), r"a text file, not a .npz \(zip\) archive", "imgs"),
    (np.zeros((2, 28, 28), np.float32), np.arange(2), r"images must be uint8 \[N, H, W\], got float32", "imgs"),
    (np.zeros((2, 28, 28), np.uint8), np.arange(3), r"3 labels for 2 images", "labels"),
    (np.zeros((2, 28, 28), np.uint8), np.array([0, 10]), r"labels must be 0-9, found 0..10", "labels"),
])
def test_malformed_kmnist_npz(tmp_path, images, labels, match, bad):
    imgs = tmp_path / "kmnist-train-imgs.npz"
    if isinstance(images, str):
        {"two": lambda: np.savez(imgs, np.zeros((2, 28, 28), np.uint8), np.zeros(2)),
         "object": lambda: np.savez(imgs, np.array([object(), object()])),
         "zip": lambda: imgs.write_text("not a zip")}[images]()
    else:
        np.savez(imgs, images)
    np.savez(tmp_path / "kmnist-train-labels.npz", labels)
    with pytest.raises(ValueError, match=match) as e:
        build_dataset("kmnist", "train", root=tmp_path)
    assert f"kmnist-train-{bad}" in str(e.value) and "kmnist-train-imgs.npz" in str(e.value)  # file, then layout


def test_kmnist_missing_and_mnist_m_bad_lines(tmp_path):
    np.savez(tmp_path / "kmnist-train-imgs.npz", np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(FileNotFoundError, match=r"no complete K-MNIST 'train' split") as e:
        build_dataset("kmnist", "train", root=tmp_path)
    assert "kmnist-train-imgs.npz" in str(e.value)
    (tmp_path / "mnist_m_train").mkdir()
    (tmp_path / "mnist_m_train_labels.txt").write_text("00000000.png 5\n00000001.png\n")
    with pytest.raises(ValueError, match=r"mnist_m_train_labels.txt: line 2: expected '<file name> <label 0-9>', "
                                         r"got '00000001.png'"):
        build_dataset("mnist_m", "train", root=tmp_path)
    (tmp_path / "mnist_m_train_labels.txt").write_text("00000000.png 5\n")
    with pytest.raises(FileNotFoundError, match=r"image .*mnist_m_train/00000000.png is listed in the labels file"):
        build_dataset("mnist_m", "train", root=tmp_path)[0]
    with pytest.raises(ValueError, match=r"parameter 'sources\[1\]': got 'mnistm', expected one of "
                                         r"\['svhn', 'mnist_m', 'mnist'\]"):
        build_dataset("digits_multitask", "train", sources=["svhn", "mnistm"])
