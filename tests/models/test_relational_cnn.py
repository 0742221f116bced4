"""CNN_MLP (Santoro et al. 2017's Sort-of-CLEVR baseline, NFM §4.3) and NFM(CNN): the architecture's
arithmetic against a hand-written forward, γ = 0 recovers the base network, NFM records, the
random-attention evaluation option (NFM §4.4), task fitting and input errors."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import modwire
from modwire.models import InputSpec
from modwire.models.nfm import load_base_weights
from modwire.models.relational_cnn import AUTHORS_NFM_CNN, CNNMLP, CNNMLPConfig, conv_size
from modwire.training import build_model_for_task, load_config
from reference.authors_nfm import authors_forward, authors_shapes


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


@pytest.mark.parametrize("order", ["conv_relu_bn", "conv_bn_relu"])
def test_forward_is_conv_blocks_then_the_mlp_on_flatten_and_question(order):
    """Default ``conv_relu_bn`` (the authors' code: Conv → ReLU → BN); ``conv_bn_relu`` the option."""
    torch.manual_seed(0)
    model = modwire.create_model("cnn_mlp_micro", **({} if order == "conv_relu_bn" else {"block_order": order})).eval()
    assert model.config.block_order == order
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in norms:                                    # non-trivial running statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x, q = _inputs(model.config)
    h = x
    for conv, bn in zip(convs, norms, strict=True):
        h = F.conv2d(h, conv.weight, conv.bias, stride=2, padding=1)
        h = torch.relu(h) if order == "conv_relu_bn" else h
        h = (h - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
        h = h * bn.weight[:, None, None] + bn.bias[:, None, None]
        h = torch.relu(h) if order == "conv_bn_relu" else h
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
    out = model.forward_record(x, question=q)
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


def test_widths_per_block_and_the_authors_head():
    torch.manual_seed(4)
    model = modwire.create_model("cnn_mlp_micro", channels=[4, 6, 10], head_pool=2, head_channels=3).eval()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [m.out_channels for m in convs] == [4, 6, 10, 3]
    x, q = _inputs(model.config)
    h = model.body(model.stem(x))                                     # [3, 10, 2, 2]
    pooled = F.avg_pool2d(h, 2).expand(-1, -1, 2, 2)                  # 2×2 → 1×1, resized back (nearest)
    z = torch.cat([model.project(pooled).flatten(1), q[:, 0]], 1)
    torch.testing.assert_close(model(x, q), model.mlp(z))
    assert model.mlp[0].in_features == 3 * 2 * 2 + 11
    with pytest.raises(ValueError, match=r"'channels': got \[4, 6\], expected an integer >= 1 .* list of num_layers=3"):
        CNNMLPConfig(num_layers=3, channels=[4, 6])
    with pytest.raises(ValueError, match=r"'head_pool': got 6, expected at most the final grid side 5"):
        CNNMLPConfig(head_pool=6)
    with pytest.raises(ValueError, match=r"config field 'block_order': got 'bn_relu'"):
        CNNMLPConfig(block_order="bn_relu")


def _authors_parameter_count() -> tuple[int, int]:
    """The authors' CNN_MLP_NFL (ConvInputModel_NFL2 + AttentiveDensenet(key 16, value 16, 4 heads) over the
    eight states [48, 96, 192, 384] × 2 passes + conv1 1×1 384 → 64 + fc1 (5·5·64 + 11 → 256) + FCOutputModel),
    layer by layer: (all their parameters, those their forward never uses: pass 1 does not read, so its
    query convs, output convs + BN and γ stay unused)."""
    widths, conv = [3, 48, 96, 192, 384], lambda i, o, k: i * o * k * k + o
    blocks = sum(conv(a, b, 3) + 2 * b for a, b in zip(widths[:-1], widths[1:]))          # conv + BatchNorm2d
    def reader(ch: int) -> tuple[int, int]:
        query, key_value = conv(ch, 64, 1), 2 * conv(ch, 64, 1)
        out = conv(64, ch, 3) + 2 * ch + conv(ch, ch, 3)                                 # out_layers, + γ
        return query + key_value + out + 1, query + out + 1
    readers = [reader(ch) for ch in widths[1:]]
    head = conv(384, 64, 1) + (5 * 5 * 64 + 11) * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    total = 2 * blocks + 2 * sum(r[0] for r in readers) + head
    return total, sum(r[1] for r in readers)


def test_the_authors_nfm_network_can_be_built():
    """Issue 23 item 12: with AUTHORS_NFM_CNN, modwire builds the authors' Sort-of-CLEVR NFM(CNN)
    (6.89 M parameters in their code, 2.23 M of them never used and not built here)."""
    total, unused = _authors_parameter_count()
    assert (total, unused) == (6_892_754, 2_226_500)
    model = modwire.create_model("nfm_cnn_mlp_sort_of_clevr", **AUTHORS_NFM_CNN)
    dead = 48 + 96 + 192 + 384                       # their W_o1 biases before a BatchNorm: not built here
    assert model.num_parameters() == total - unused - dead == 4_665_534
    c, body = model.config, model.body
    assert c.widths() == [48, 96, 192, 384] and c.block_order == "conv_relu_bn"
    assert body.read_at == "after_last_pass" and [r.gamma is not None for r in body.readers] == [False] * 4 + [True] * 4
    assert all(isinstance(r.w_o1, nn.Conv2d) and r.topk_softmax == "subtract" for r in body.readers[4:])
    assert isinstance(body.blocks[0][1], nn.ReLU) and isinstance(body.blocks[0][2], nn.BatchNorm2d)
    x, kw = model.example_inputs(2)
    out = model.eval().forward_record(*x, **kw)
    assert out.logits.shape == (2, 10) and [(r.pass_index, len(r.sources)) for r in out.nfm] == [(1, 5), (1, 6),
                                                                                                 (1, 7), (1, 8)]


def _in_the_authors_layout(model: CNNMLP, grid: int) -> tuple[dict, set]:
    """modwire's weights copied into the authors' ``CNN_MLP_NFL`` state-dict layout
    (:func:`reference.authors_nfm.authors_shapes`; their 1×1 convs from modwire's linears); the entries their
    forward never uses (pass 1's query and output layers, γ) are random. Also the modwire entries copied."""
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    g = torch.Generator().manual_seed(7)
    p = {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in authors_shapes(grid).items()}
    copied = {}

    def put(theirs: str, ours: str, conv1x1: bool = False) -> None:
        for part in ("weight", "bias", "running_mean", "running_var"):
            if f"{ours}.{part}" in sd:
                v = sd[f"{ours}.{part}"]
                v = v[:, :, None, None] if conv1x1 and part == "weight" else v
                assert p[f"{theirs}.{part}"].shape == v.shape, (theirs, ours, part)
                p[f"{theirs}.{part}"] = copied[f"{ours}.{part}"] = v
    for suffix, blocks in (("", "body.blocks"), ("b", "body.pass_blocks.0")):
        for i in range(4):
            put(f"conv.conv{i + 1}{suffix}", f"{blocks}.{i}.0")
            put(f"conv.batchNorm{i + 1}{suffix}", f"{blocks}.{i}.2")
    for slot in range(8):
        r = f"body.readers.{slot}"
        put(f"conv.ad.key_layers.{slot}", f"{r}.key", conv1x1=True)
        put(f"conv.ad.val_layers.{slot}", f"{r}.value", conv1x1=True)
        if slot >= 4:
            put(f"conv.ad.query_layers.{slot}", f"{r}.query", conv1x1=True)
            for theirs, ours in ((".0", ".w_o1"), (".1", ".norm"), (".3", ".w_o2")):
                put(f"conv.ad.out_layers.{slot}{theirs}", f"{r}{ours}")
            # their W_o1 has a bias before the BatchNorm (modwire's has none: training cancels it); in
            # evaluation it is the same network with the bias folded into the running mean
            bias = p[f"conv.ad.out_layers.{slot}.0.bias"]
            p[f"conv.ad.out_layers.{slot}.1.running_mean"] = sd[f"{r}.norm.running_mean"] + bias
            p[f"conv.ad.gammas.{slot}"] = copied[f"{r}.gamma"] = sd[f"{r}.gamma"]
    for theirs, ours in (("conv1", "project"), ("fc1", "mlp.0"), ("fcout.fc2", "mlp.2"), ("fcout.fc3", "mlp.5")):
        put(theirs, ours)
    assert set(copied) == set(sd)                                   # every modwire entry has its place in theirs
    return p, set(copied)


def test_the_authors_nfm_network_equals_their_forward():
    """Issue 35 item 4: ``AUTHORS_NFM_CNN`` (k = 3) is the network the authors' code runs, equal in float64 to a
    re-statement of their whole ``CNN_MLP_NFL`` forward (``tests/reference/authors_nfm.py``) with modwire's
    weights copied into their layout; evaluation mode, BatchNorm with non-trivial running statistics, γ ≠ 0.
    75×75 images, their size: grids 38, 19, 10, 5, so most reads resize by a non-integer ratio."""
    torch.manual_seed(11)
    model = modwire.create_model("nfm_cnn_mlp_sort_of_clevr", **AUTHORS_NFM_CNN).double().eval()
    assert model.config.nfm.k == 3 and modwire.create_model("nfm_cnn_mlp_sort_of_clevr").config.nfm.k == 5
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5), m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
        for r in model.body.readers[4:]:
            r.gamma.fill_(1.0)
        for prm in model.mlp.parameters():                             # logits spread out (not near-uniform)
            prm.mul_(4.0)
    theirs, _ = _in_the_authors_layout(model, grid=5)
    assert sum(v.numel() for k, v in theirs.items() if "running" not in k) == _authors_parameter_count()[0]
    x, q = _inputs(model.config, batch=2, seed=3)
    x, q = x.double(), q.double()
    with torch.no_grad():
        ours = model(x, q).log_softmax(-1)
        expected = authors_forward(theirs, x, q[:, 0], top_k=3)
        assert (ours - expected).abs().max() <= 1e-10
        # the check can fail: the paper's k = 5, or γ = 0 in their forward, gives other outputs
        assert (authors_forward(theirs, x, q[:, 0], top_k=5) - expected).abs().max() > 1e-6
        zero = {**theirs, **{f"conv.ad.gammas.{s}": torch.zeros((), dtype=torch.float64) for s in range(4, 8)}}
        assert (authors_forward(zero, x, q[:, 0]) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("authors", [False, True])
@pytest.mark.parametrize("passes", [2, 3])
def test_an_nfm_built_on_a_trained_base_is_the_base_network(authors, passes):
    """Issue 23 item 10: every pass starts from the loaded base (γ = 0 → the base's logits, exactly);
    also for the authors' network (64×64 images here, to stay small)."""
    torch.manual_seed(5)
    if authors:
        plain = {k: v for k, v in AUTHORS_NFM_CNN.items() if k != "nfm"}
        base = modwire.create_model("cnn_mlp_sort_of_clevr", image_size=64, **plain)
        nfm = modwire.create_model("nfm_cnn_mlp_sort_of_clevr", image_size=64,
                                   **{**AUTHORS_NFM_CNN, "nfm": {**AUTHORS_NFM_CNN["nfm"], "passes": passes}})
    else:
        base = modwire.create_model("cnn_mlp_micro")
        nfm = modwire.create_model("nfm_cnn_mlp_micro", nfm={"passes": passes})
    with torch.no_grad():                                          # "trained": far from the init
        for prm in base.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
    x, q = _inputs(base.config, batch=4)
    base(x, q)                                                     # BN running statistics
    base.eval()
    left = load_base_weights(nfm, base.state_dict())
    assert left and all(k.startswith("body.readers.") for k in left)
    assert torch.equal(nfm.eval()(x, q), base(x, q))


def test_base_weights_of_another_layout_are_a_clear_error():
    base = modwire.create_model("cnn_mlp_micro")
    with pytest.raises(ValueError, match=r"missing \(not NFM readers\) \['stem.0.0.bias'"):   # another stem split
        load_base_weights(modwire.create_model("nfm_cnn_mlp_micro", stem_layers=1), base.state_dict())
