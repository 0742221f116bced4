"""The ``digits`` task: scikit-learn's 8x8 digits, offline, upsampled for the conv tokenizer."""
import numpy as np
import sklearn.datasets as sklearn_datasets   # the test extra installs it: a missing one fails, not skips
import torch

from modwire.tasks import build_dataset, get_task


def test_digits_splits_partition_the_data_and_keep_the_pixels():
    data = sklearn_datasets.load_digits()
    train, test = build_dataset("digits", "train"), build_dataset("digits", "test")
    assert (len(train), len(test)) == (1437, 360)
    x, y = test[0]
    assert x.shape == (1, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.long
    assert 0.0 <= x.min() and x.max() <= 1.0
    # nearest-neighbour upsampling: every 4x4 block is one original grey level / 16
    small = x[0, ::4, ::4]
    assert torch.equal(x[0], small.repeat_interleave(4, 0).repeat_interleave(4, 1))
    # each split image is one of sklearn's images with its label, and the splits are disjoint and cover all
    flat = {img.astype(np.float32).tobytes(): int(t) for img, t in zip(data.images / 16.0, data.target)}
    for ds in (train, test):
        for i in range(len(ds)):
            xi, yi = ds[i]
            key = xi[0, ::4, ::4].numpy().astype(np.float32).tobytes()
            assert flat[key] == int(yi)
    assert len(test.labels.unique()) == 10
    assert torch.equal(build_dataset("digits", "val").images, test.images)   # val is test
    assert torch.equal(build_dataset("digits", "test").labels, test.labels)  # deterministic


def test_digits_other_size():
    x, y = build_dataset("digits", "train", size=16)[3]
    x32, y32 = build_dataset("digits", "train")[3]
    assert x.shape == (1, 16, 16) and int(y) == int(y32)
    # the same 8x8 grey levels, each repeated 2x2 instead of 4x4
    assert torch.equal(x, x32[:, ::2, ::2])
    assert torch.equal(x[0], x[0, ::2, ::2].repeat_interleave(2, 0).repeat_interleave(2, 1))


def test_digits_feeds_the_conv_tokenizer_of_nac_small():
    from modwire.training import build_model_for_task, load_config

    info = get_task("digits")
    assert info.kind == "loader" and info.num_classes == 10
    model = build_model_for_task(load_config(None, ["model.name=nac_small", "data.task=digits"])).eval()
    tok = model.config.tokenizer
    assert (tok.kind, tok.in_channels, tok.image_size) == ("conv", 1, 32)
    xb = torch.stack([build_dataset("digits", "test")[i][0] for i in range(2)])
    with torch.no_grad():
        assert model(xb).shape == (2, 10)
