"""CNN_MLP (Santoro et al. 2017's Sort-of-CLEVR baseline, NFM §4.3) and NFM(CNN): the architecture's
arithmetic against a hand-written forward, γ = 0 recovers the base network, NFM records, the
random-attention evaluation option (NFM §4.4), task fitting and input errors."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import modwire
from modwire.models import InputSpec
from modwire.models.relational_cnn import CNNMLP, CNNMLPConfig, conv_size
from modwire.training import build_model_for_task, load_config


def _inputs(cfg, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g)
    q = F.one_hot(torch.randint(0, cfg.question_dim, (batch,), generator=g), cfg.question_dim).float()[:, None]
    return x, q


def test_paper_preset_sizes_and_parameter_count():
    model = modwire.create_model("cnn_mlp_sort_of_clevr")
    c = model.config
    assert (c.image_size, c.in_channels, c.channels, c.num_layers, c.question_dim, c.num_classes) == (75, 3, 24, 4, 11, 10)
    assert [conv_size(75, n) for n in range(5)] == [75, 38, 19, 10, 5]
    convs = (3 * 24 * 9 + 24) + 3 * (24 * 24 * 9 + 24) + 4 * 2 * 24          # conv weights + biases, BN affine
    mlp = (24 * 25 + 11) * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert model.num_parameters() == convs + mlp == 241_522
    nfm = modwire.create_model("nfm_cnn_mlp_sort_of_clevr")
    assert nfm.config.nfm.enabled and nfm.config.nfm.passes == 2 and nfm.config.nfm.k == 5
    assert nfm.body.passes == 2 and nfm.body.num_blocks == 4


def test_forward_is_conv_bn_relu_blocks_then_the_mlp_on_flatten_and_question():
    torch.manual_seed(0)
    model = modwire.create_model("cnn_mlp_micro").eval()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in norms:                                    # non-trivial running statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x, q = _inputs(model.config)
    h = x
    for conv, bn in zip(convs, norms, strict=True):
        h = F.conv2d(h, conv.weight, conv.bias, stride=2, padding=1)
        h = (h - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
        h = torch.relu(h * bn.weight[:, None, None] + bn.bias[:, None, None])
    lin = [m for m in model.mlp if isinstance(m, nn.Linear)]
    z = torch.cat([h.flatten(1), q[:, 0]], 1)
    z = torch.relu(lin[1](torch.relu(lin[0](z))))
    torch.testing.assert_close(model(x, q), lin[2](z))
    assert h.shape[1:] == (8, 2, 2)                      # 16 → 8 → 4 → 2


@pytest.mark.parametrize("stem", [0, 1])
def test_nfm_with_gamma_zero_computes_the_base_network(stem):
    torch.manual_seed(1)
    model = modwire.create_model("nfm_cnn_mlp_micro", stem_layers=stem).eval()
    x, q = _inputs(model.config)
    h = model.stem(x)
    for block in model.body.blocks:                     # the first pass's blocks; later passes are copies
        h = block(h)
    expected = model.mlp(torch.cat([h.flatten(1), q[:, 0]], 1))
    torch.testing.assert_close(model(x, q), expected)
    assert len(model.stem) == stem and model.body.num_blocks == 3 - stem


def test_records_one_per_reader_and_the_readers_change_the_output_once_gamma_moves():
    torch.manual_seed(2)
    model = modwire.create_model("nfm_cnn_mlp_micro").eval()
    x, q = _inputs(model.config)
    base = model(x, q)
    out = model.forward_intermediates(x, q)
    assert [(r.pass_index, r.layer_index) for r in out.nfm] == [(p, i) for p in range(2) for i in range(3)]
    assert out.nfm[-1].sources == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert out.states.shape == (3, 8, 2, 2)
    torch.testing.assert_close(out.logits, base)
    for p in model.parameters():                        # γ of every reader away from 0
        if p.dim() == 0:
            p.data.fill_(0.5)
    assert not torch.allclose(model(x, q), base)


def test_random_attention_is_an_eval_option_of_nfm_models_only():
    torch.manual_seed(3)
    model = modwire.create_model("nfm_cnn_mlp_micro").eval()
    for p in model.parameters():
        if p.dim() == 0:
            p.data.fill_(1.0)
    x, q = _inputs(model.config)
    learned = model(x, q)
    assert CNNMLP.eval_options == ("random_attention",)
    model.set_eval_options(random_attention=True)
    assert model.config.random_attention and model.body.random_attention
    assert not torch.allclose(model(x, q), learned)
    model.set_eval_options(random_attention=False)
    torch.testing.assert_close(model(x, q), learned)
    with pytest.raises(ValueError, match="random_attention.*needs nfm.enabled=true"):
        modwire.create_model("cnn_mlp_micro", random_attention=True)


def test_fits_the_sort_of_clevr_image_task():
    cfg = load_config(None, ["model.name=nfm_cnn_mlp_micro", "data.task=sort_of_clevr_image",
                             "data.params.size={train: 2, val: 1, test: 1}"])
    model = build_model_for_task(cfg)
    c = model.config
    assert (c.image_size, c.in_channels, c.question_dim, c.num_classes) == (75, 3, 11, 10)
    assert c.input_names() == ("x", "question")
    with pytest.raises(ValueError, match="reads a square image 'x'"):
        c.for_inputs({"x": InputSpec.vectors(5, 3)}, 10)


def test_bad_inputs_and_configs_are_clear_errors():
    model = modwire.create_model("cnn_mlp_micro")
    x, q = _inputs(model.config)
    with pytest.raises(ValueError, match=r"x: expected images \[B, 3, 16, 16\] float, got torch.float32 \[3, 3, 15, 15\]"):
        model(x[..., :15, :15], q)
    with pytest.raises(ValueError, match=r"question: expected one question vector per sample \[B=3, 1, 11\].*got none"):
        model(x)
    with pytest.raises(ValueError, match=r"question: .* got torch.float32 \[3, 1, 12\]"):
        model(x, torch.zeros(3, 1, 12))
    with pytest.raises(ValueError, match="takes no 'question' input"):
        modwire.create_model("cnn_mlp_micro", question_dim=0)(x, q)
    with pytest.raises(ValueError, match=r"'stem_layers': got 3, expected an integer in \[0, num_layers=3\)"):
        CNNMLPConfig(num_layers=3, stem_layers=3, nfm={"enabled": True})
    CNNMLPConfig(num_layers=3, stem_layers=3)           # unused without NFM


def test_example_inputs_fit_the_model():
    model = modwire.create_model("nfm_cnn_mlp_micro")
    args, kwargs = model.example_inputs(4)
    assert args[0].shape == (4, 3, 16, 16) and kwargs["question"].shape == (4, 1, 11)
    assert kwargs["question"].sum(-1).eq(1).all()                 # one-hot
    assert model(*args, **kwargs).shape == (4, 10)
    assert modwire.create_model("cnn_mlp_micro", question_dim=0).example_inputs(2)[1] == {}


def test_empty_float64_and_nan_images_are_clear_errors():
    model = modwire.create_model("nfm_cnn_mlp_micro")
    c = model.config
    q = torch.zeros(2, 1, c.question_dim)
    x = torch.rand(2, c.in_channels, c.image_size, c.image_size)
    with pytest.raises(ValueError, match=r"B, N >= 1, got an empty batch"):
        model(x[:0], q[:0])
    with pytest.raises(TypeError, match=r"expected torch.float32 \(the model's weights\)"):
        model(x.double(), q)
    x[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model(x, q)
