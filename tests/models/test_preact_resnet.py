"""PreActResNet (He et al. 2016b, as in Verma et al.'s Manifold Mixup code) and its NFM version
(NFM §4.4, Table 2)."""
import json

import pytest
import torch
import torch.nn.functional as F

import modwire
from modwire.cli import main
from modwire.models.inputs import InputSpec
from modwire.models.resnet import PreActBlock, PreActBottleneck, PreActResNetConfig
from modwire.training import load_config, train


def _bn(x, bn):
    return F.batch_norm(x, bn.running_mean.double(), bn.running_var.double(), bn.weight.double(), bn.bias.double(),
                        False, 0.0, bn.eps)


def _randomise_bn(module, g):
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g))
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=g))
            m.bias.data.copy_(torch.randn(m.num_features, generator=g))


@pytest.mark.parametrize("c_in, planes, stride", [(8, 8, 1), (8, 16, 2), (6, 8, 1)])
def test_basic_block_is_the_full_preactivation_unit(c_in, planes, stride):
    g = torch.Generator().manual_seed(0)
    block = PreActBlock(c_in, planes, stride).double().eval()
    _randomise_bn(block, g)
    x = torch.randn(2, c_in, 8, 8, generator=g, dtype=torch.float64)
    a = F.relu(_bn(x, block.bn1))
    # He et al. 2016b Fig. 4(e); the projection shortcut reads the pre-activated input (Verma et al.'s code)
    skip = x if (stride, c_in) == (1, planes) else F.conv2d(a, block.shortcut.weight, stride=stride)
    mid = F.relu(_bn(F.conv2d(a, block.conv1.weight, stride=stride, padding=1), block.bn2))
    expected = F.conv2d(mid, block.conv2.weight, padding=1) + skip
    torch.testing.assert_close(block(x), expected)
    assert (block.shortcut is None) == ((stride, c_in) == (1, planes))


def test_bottleneck_block_is_1x1_3x3_1x1_with_expansion_4():
    g = torch.Generator().manual_seed(1)
    block = PreActBottleneck(16, 8, 2).double().eval()
    _randomise_bn(block, g)
    x = torch.randn(2, 16, 8, 8, generator=g, dtype=torch.float64)
    a = F.relu(_bn(x, block.bn1))
    out = F.relu(_bn(F.conv2d(a, block.conv1.weight), block.bn2))
    out = F.relu(_bn(F.conv2d(out, block.conv2.weight, stride=2, padding=1), block.bn3))
    expected = F.conv2d(out, block.conv3.weight) + F.conv2d(a, block.shortcut.weight, stride=2)
    torch.testing.assert_close(block(x), expected)
    assert block(x).shape == (2, 32, 4, 4)


@pytest.mark.parametrize("name, params, blocks, final", [
    ("preact_resnet18_cifar10", 11_171_146, 8, (512, 4, 4)),      # the well-known PreActResNet-18 count
    ("preact_resnet34_cifar100", 21_325_476, 16, (512, 4, 4)),
    ("preact_resnet50_cifar10", 23_509_066, 16, (2048, 4, 4)),
    ("preact_resnet18_tiny_imagenet", 11_268_616, 8, (512, 4, 4)),   # stem stride 2 on 64×64
    ("preact_resnet18_multi_digit", 11_169_994, 8, (512, 4, 4)),
])
def test_paper_sized_networks(name, params, blocks, final):
    with torch.device("meta"):
        model = modwire.create_model(name)
        c = model.config
        h = model.body(model.stem(torch.empty(2, c.in_channels, c.image_size, c.image_size)))
    assert model.num_parameters() == params and len(model.body.blocks) == 4            # the stages
    assert sum(len(stage) for stage in model.body.blocks) == blocks                    # residual blocks
    assert tuple(h.shape[1:]) == final


def test_nfm_presets_are_the_base_network_plus_two_pass_nfm():
    base, nfm = modwire.get_config("preact_resnet18_cifar10"), modwire.get_config("nfm_preact_resnet18_cifar10")
    assert nfm.replace(nfm={"enabled": False, "output_bias": True}) == base
    assert nfm.nfm.output_bias is False                         # every path from a read starts with a BatchNorm
    n = nfm.nfm
    assert (n.enabled, n.passes, n.k, n.d_k, n.d_v, n.num_heads, n.share_blocks) == (True, 2, 5, 16, 16, 4, False)
    with torch.device("meta"):
        model = modwire.create_model("nfm_preact_resnet18_cifar10")
    assert len(model.body.readers) == 8                       # one reader before each of 4 stages, 2 passes (§4.2)


def test_stage_modules_give_the_same_network_with_one_reader_per_stage():
    torch.manual_seed(0)
    by_block = modwire.create_model("preact_resnet18_cifar10", initial_channels=8, nfm_modules="block").eval()
    by_stage = modwire.create_model("preact_resnet18_cifar10", initial_channels=8, nfm_modules="stage").eval()
    assert by_stage.num_parameters() == by_block.num_parameters()
    blocks = [b for stage in by_stage.body.blocks for b in stage]
    for mine, theirs in zip(blocks, by_block.body.blocks, strict=True):
        mine.load_state_dict(theirs.state_dict())
    by_stage.stem.load_state_dict(by_block.stem.state_dict())
    by_stage.head.load_state_dict(by_block.head.state_dict())
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(by_stage(x), by_block(x), atol=0, rtol=0)
    with torch.device("meta"):
        nfm = modwire.create_model("nfm_preact_resnet18_cifar10", nfm_modules="stage")
    assert len(nfm.body.readers) == 8 and nfm.body.channels == [64, 64, 128, 256, 512]   # 4 stages × 2 passes


def _nfm_micro_and_base():
    torch.manual_seed(0)
    nfm = modwire.create_model("nfm_preact_resnet_micro").eval()
    base = modwire.create_model("preact_resnet_micro").eval()
    own = base.state_dict()
    base.load_state_dict({k: v for k, v in nfm.state_dict().items() if k in own})
    return nfm, base


def test_nfm_at_initialisation_computes_the_base_network():
    nfm, base = _nfm_micro_and_base()
    _randomise_bn(nfm, torch.Generator().manual_seed(2))      # pass 2's blocks keep their own copy
    own = base.state_dict()
    base.load_state_dict({k: v for k, v in nfm.state_dict().items() if k in own})
    for copy, first in zip(nfm.body.pass_blocks[0], nfm.body.blocks):
        copy.load_state_dict(first.state_dict())
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(nfm(x), base(x), atol=0, rtol=0)    # γ = 0: the readers add exactly nothing
    for g in nfm.body.gammas:
        g.data.fill_(1.0)
    assert not torch.allclose(nfm(x), base(x))


def test_intermediates_carry_one_record_per_reader():
    nfm, _ = _nfm_micro_and_base()
    out = nfm.forward_record(torch.rand(2, 1, 8, 8))
    assert out.logits.shape == (2, 5) and out.states.shape == (2, 16)
    assert [(r.pass_index, r.layer_index, len(r.sources)) for r in out.nfm] == [(0, 0, 0), (0, 1, 1), (1, 0, 2),
                                                                               (1, 1, 3)]
    last = out.nfm[-1]
    torch.testing.assert_close(last.mass.sum(-1) + last.null, torch.ones(2))


def test_random_attention_eval_option_changes_nfm_outputs_only():
    nfm, base = _nfm_micro_and_base()
    for g in nfm.body.gammas:
        g.data.fill_(1.0)
    x = torch.rand(2, 1, 8, 8)
    before = nfm(x)
    nfm.set_eval_options(random_attention=True)
    assert nfm.config.nfm.random_attention and nfm.body.random_attention
    assert not torch.allclose(nfm(x), before)
    nfm.set_eval_options(random_attention=False)
    torch.testing.assert_close(nfm(x), before, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"nfm.random_attention.*needs NFM readers, and this model has none"):
        base.set_eval_options(random_attention=True)


def test_eval_cli_takes_random_attention_for_an_nfm_run(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config(None, [f"out_dir={run}", "model.name=nfm_preact_resnet_micro", "data.task=triangle",
                             "data.params.size={train: 8, val: 4, test: 4}", "data.batch_size=4", "max_steps=1",
                             "progress=false"]))
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run), "--set", "model.overrides.random_attention=true"]) == 0
    ablated = json.loads(capsys.readouterr().out)
    assert ablated["samples"] == plain["samples"] == 4 and ablated["loss"] != plain["loss"]


def test_config_and_input_errors_name_what_is_expected():
    with pytest.raises(ValueError, match=r"'block': got 'wide', expected one of \['basic', 'bottleneck'\]"):
        PreActResNetConfig(block="wide")
    with pytest.raises(ValueError, match=r"'num_blocks': got \[2, 0\], expected a non-empty list of integers >= 1"):
        PreActResNetConfig(num_blocks=[2, 0])
    with pytest.raises(ValueError, match=r"'nfm_modules': got 'layer', expected one of \['block', 'stage'\]"):
        PreActResNetConfig(nfm_modules="layer")
    with pytest.raises(ValueError, match=r"'stem_stride': got 3"):
        PreActResNetConfig(stem_stride=3)
    model = modwire.create_model("preact_resnet_micro")
    with pytest.raises(ValueError, match=r"expects float images \[B, 1, H, W\], got \(2, 3, 8, 8\)"):
        model(torch.rand(2, 3, 8, 8))
    cfg = PreActResNetConfig()
    assert cfg.input_overrides(InputSpec.image(1, 28, 28), 10) == {"in_channels": 1, "image_size": 28,
                                                                    "num_classes": 10}
    with pytest.raises(ValueError, match="reads one square image input"):
        cfg.input_overrides(InputSpec.image(3, 32, 48), 10)
    with pytest.raises(ValueError, match="reads one square image input"):
        cfg.input_overrides(InputSpec.tokens(5, 10), 10)


def test_final_norm_adds_he_et_al_s_last_bn_relu_before_the_pooling():
    torch.manual_seed(0)
    plain = modwire.create_model("preact_resnet_micro").eval()
    normed = modwire.create_model("preact_resnet_micro", final_norm=True).eval()
    assert plain.norm is None and normed.num_parameters() == plain.num_parameters() + 2 * 16
    normed.load_state_dict({**plain.state_dict(), **{f"norm.{k}": v for k, v in normed.norm.state_dict().items()}})
    _randomise_bn(normed.norm, torch.Generator().manual_seed(3))
    x = torch.rand(2, 1, 8, 8)
    h = normed.body(normed.stem(x))
    expected = normed.head(F.relu(normed.norm(h)).mean(dim=(-2, -1)))
    torch.testing.assert_close(normed(x), expected)
    torch.testing.assert_close(plain(x), plain.head(h.mean(dim=(-2, -1))))


@pytest.mark.parametrize("modules", ["stage", "block"])
def test_nfm_built_on_a_trained_base_is_the_base_network(modules):
    """Issue 23 item 10: loading a trained base network's weights into its NFM version fills every
    pass (pass 2's own blocks included), so with γ = 0 the NFM model is the base network exactly."""
    from modwire.models.nfm import load_base_weights

    torch.manual_seed(7)
    base = modwire.create_model("preact_resnet_micro", nfm_modules=modules)
    with torch.no_grad():                                          # "trained": far from the init
        for prm in base.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    x = torch.randn(4, 1, 8, 8)
    base(x)                                                        # BN running statistics
    base.eval()
    nfm = modwire.create_model("nfm_preact_resnet_micro", nfm_modules=modules)
    left = load_base_weights(nfm, base.state_dict())
    assert left and all(k.startswith("body.readers.") for k in left)
    assert torch.equal(nfm.eval()(x), base(x))


def test_the_table9_conflict_is_stated_next_to_the_preset():
    """Issue 23 item 13: the nfm_preact_resnet34_cifar100 preset (k 5, 4 heads, d_k = d_v = 16) is not one
    of NFM Table 9's PreActResNet34 / CIFAR-100 settings; its description says so."""
    from modwire.models.registry import get_config, model_source

    c = get_config("nfm_preact_resnet34_cifar100").nfm
    assert (c.k, c.num_heads, c.d_k, c.d_v) == (5, 4, 16, 16)
    assert "conflicts with Table 9" in model_source("nfm_preact_resnet34_cifar100")
    assert "Table 9" not in model_source("nfm_preact_resnet18_cifar100")
