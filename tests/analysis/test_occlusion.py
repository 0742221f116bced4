"""NFM §4.4's occlusion test: one Cutout box (DeVries & Taylor 2017) per test image."""
import json

import pytest
import torch

from modwire.analysis.occlusion import OccludedDataset, cutout_box, occlude
from modwire.cli import main
from modwire.seeding import torch_generator
from modwire.training import load_config, train


def _reference_box(h, w, size, g):
    """Cutout, loop by loop: centre uniform over the pixels, side ``size``, clipped at the border."""
    cy, cx = int(torch.randint(0, h, (), generator=g)), int(torch.randint(0, w, (), generator=g))
    rows = [r for r in range(cy - size // 2, cy - size // 2 + size) if 0 <= r < h]
    cols = [c for c in range(cx - size // 2, cx - size // 2 + size) if 0 <= c < w]
    return rows, cols


@pytest.mark.parametrize("seed", range(12))
def test_box_is_the_clipped_cutout_square(seed):
    box = cutout_box(32, 32, 16, torch_generator(seed))
    rows, cols = _reference_box(32, 32, 16, torch_generator(seed))
    x = torch.rand(3, 32, 32) + 1.0                         # no pixel is 0 before occlusion
    x0 = x.clone()
    out = occlude(x, box)
    expected = x.clone()
    for r in rows:
        for c in cols:
            expected[:, r, c] = 0.0
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    assert (out == 0).sum() == 3 * len(rows) * len(cols) and len(rows) * len(cols) <= 256
    assert torch.equal(x, x0) and (x > 0).all()              # the input is not modified


def test_boxes_cover_the_whole_image_and_clip_at_edges():
    areas = [(b[1] - b[0]) * (b[3] - b[2]) for b in (cutout_box(32, 32, 16, torch_generator(s)) for s in range(300))]
    assert max(areas) == 256 and min(areas) < 128            # interior boxes are full, corner boxes clipped
    assert cutout_box(8, 8, 100, torch_generator(0)) == (0, 8, 0, 8)


class _Images(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.full((1, 32, 32), float(i + 1)), i % 3


def test_dataset_boxes_depend_on_seed_and_index_only():
    a, b = OccludedDataset(_Images(), 16, seed=5), OccludedDataset(_Images(), 16, seed=5)
    assert torch.equal(a[7][0], b[7][0]) and a[7][1] == 7 % 3
    box = cutout_box(32, 32, 16, torch_generator(5, 0, 7))    # AugmentedDataset's (seed, epoch 0, index)
    torch.testing.assert_close(a[7][0], occlude(torch.full((1, 32, 32), 8.0), box), atol=0, rtol=0)
    masks = {tuple((a[i][0] == 0).flatten().tolist()) for i in range(10)}
    assert len(masks) > 5                                     # boxes differ between images
    assert torch.equal(a[-3][0], a[7][0])                    # a negative index is the same item
    other = OccludedDataset(_Images(), 16, seed=6)
    assert any(not torch.equal(a[i][0], other[i][0]) for i in range(10))


def test_bad_sizes_and_inputs_are_clear_errors():
    with pytest.raises(ValueError, match=r"occlusion box size: got 0, expected an integer >= 1"):
        OccludedDataset(_Images(), 0)

    class Ids(_Images):
        def __getitem__(self, i):
            return torch.arange(5), 0

    with pytest.raises(ValueError, match=r"occlusion needs float images \[C, H, W\].*got \(5,\) torch.int64"):
        OccludedDataset(Ids(), 4)[0]


def test_eval_cli_scores_the_occluded_split(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config(None, [f"out_dir={run}", "model.name=preact_resnet_micro", "data.task=triangle",
                             "data.params.size={train: 8, val: 6, test: 6}", "data.batch_size=4", "max_steps=1",
                             "progress=false"]))
    capsys.readouterr()
    assert main(["eval", str(run), "--occlusion", "16", "--occlusion-seed", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["occlusion"] == {"size": 16, "seed": 3} and out["samples"] == 6

    from modwire.analysis.runs import load_run
    from modwire.training import evaluate, make_loader

    cfg, model, info, dataset = load_run(run)
    loader = make_loader(OccludedDataset(dataset, 16, seed=3), 4, None, info, 0, drop_last=False)
    expected = evaluate(model, loader, info, torch.device("cpu"), "fp32")
    assert {k: out[k] for k in expected} == pytest.approx(expected) and "loss" in expected
    plain = evaluate(model, make_loader(dataset, 4, None, info, 0, drop_last=False), info, torch.device("cpu"))
    assert plain["loss"] != pytest.approx(expected["loss"])   # the boxes changed what the model saw
