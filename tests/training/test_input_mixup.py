"""Input Mixup as NFM Table 2 trains with it (Zhang et al. 2018 in Verma et al. 2019's procedure):
``data.mixup: input``, λ ~ Beta(α, α) with α = ``data.mixup_alpha`` (1.0), every batch mixed with a
random permutation of itself, never CutMix; ``data.mixup: true`` stays DeiT's Mixup/CutMix."""
import json

import pytest
import torch

from modwire.tasks.augment import MixupCutmix
from modwire.training import load_config, train
from modwire.training.mixup import make_mixer


def _mixer(*overrides):
    return make_mixer(load_config(None, list(overrides)), 4)


def test_input_mixup_mixes_with_a_permutation_and_never_cuts():
    mixer = _mixer("data.mixup=input")
    assert (mixer.mixup_alpha, mixer.cutmix_alpha, mixer.prob, mixer.pairing) == (1.0, 0.0, 1.0, "permutation")
    x = torch.arange(6 * 2 * 2, dtype=torch.float32).reshape(6, 1, 2, 2)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    g = torch.Generator().manual_seed(3)
    xm, ym = mixer(x, y, g)
    p = mixer.last_params
    assert p.mode == "mixup" and p.order is not None and sorted(p.order.tolist()) == list(range(6))
    assert not torch.equal(p.order, torch.arange(6).flip(0))        # not the DeiT flip pairing
    torch.testing.assert_close(xm, p.lam * x + (1 - p.lam) * x[p.order])
    expected = p.lam * torch.eye(4)[y] + (1 - p.lam) * torch.eye(4)[y[p.order]]
    torch.testing.assert_close(ym, expected)
    again = mixer(x, y, torch.Generator().manual_seed(3))           # a function of the generator
    torch.testing.assert_close(again[0], xm, atol=0, rtol=0)


def test_input_mixup_lambda_follows_beta_alpha_alpha():
    mixer = _mixer("data.mixup=input")                  # the draws depend only on the generator
    lams = [mixer.sample_params(8, 8, torch.Generator().manual_seed(s)) for s in range(400)]
    assert {p.mode for p in lams} == {"mixup"}
    values = torch.tensor([p.lam for p in lams])
    assert abs(values.mean().item() - 0.5) < 0.05 and abs(values.var().item() - 1 / 12) < 0.02   # Beta(1, 1)
    mixer = _mixer("data.mixup=input", "data.mixup_alpha=0.2")
    small = torch.tensor([mixer.sample_params(8, 8, torch.Generator().manual_seed(s)).lam for s in range(400)])
    assert ((small < 0.1) | (small > 0.9)).float().mean() > 0.5      # Beta(0.2, 0.2) piles up at 0 and 1


def test_true_is_still_deit_mixup_cutmix_with_the_flip_pairing():
    mixer = _mixer("data.mixup=true", "optim.label_smoothing=0.1")
    assert (mixer.mixup_alpha, mixer.cutmix_alpha, mixer.pairing, mixer.label_smoothing) == (0.8, 1.0, "flip", 0.1)
    assert _mixer("data.mixup=false") is None


@pytest.mark.parametrize("override, match", [
    ("data.mixup=manifold", r"'data.mixup': got 'manifold', expected one of \[False, True, 'deit', 'input'\]"),
    ("data.mixup_alpha=0", r"'data.mixup_alpha': got 0.0, expected a finite number > 0"),
])
def test_bad_mixup_settings_are_clear_errors(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])
    with pytest.raises(ValueError, match="pairing: got 'shuffle'"):
        MixupCutmix(num_classes=3, pairing="shuffle")


def test_two_training_steps_of_a_micro_preact_resnet_with_input_mixup(tmp_path):
    cfg = load_config(None, [f"out_dir={tmp_path / 'run'}", "model.name=preact_resnet_micro", "data.task=triangle",
                             "data.params.size={train: 8, val: 4, test: 4}", "data.batch_size=4", "data.mixup=input",
                             "optim.name=sgd", "optim.lr=0.1", "max_steps=2", "progress=false"])
    result = train(cfg)
    saved = json.loads((tmp_path / "run" / "checkpoints" / "last" / "config.json").read_text())
    assert result["step"] == 2 and (saved["num_classes"], saved["in_channels"], saved["image_size"]) == (2, 1, 64)
