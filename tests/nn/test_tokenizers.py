import pytest
import torch

import modwire
from modwire.nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer, NormLinearNorm, PatchEmbedding
from reference.nac import app_c_preprocessor


def test_conv_tokenizer_app_c_shapes_and_concatenated_positions():
    tok = ConvTokenizer(image_size=64, in_channels=3)                      # the authors' widths at d = 384
    out = tok(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 64, 256) and tok.out_dim == 256  # 64×64 → 8×8 tokens of 192 + 64
    for b in range(2):  # learned 64-d positions are concatenated, the same for every sample
        torch.testing.assert_close(out[b, :, 192:], tok.pos)
    assert [m.stride for m in (tok.stem[0], tok.down[0])] == [(4, 4), (2, 2)]
    assert (tok.stem[0].out_channels, tok.down[0].in_channels, tok.down[0].out_channels) == (96, 96, 192)
    assert tok.block.dwconv.kernel_size == (7, 7) and tok.block.dwconv.groups == 96
    assert ConvTokenizer(image_size=224, stem_channels=128, channels=256).num_tokens == 28 * 28  # ImageNet (App. C)


CONV_FORMS = {  # ConvTokenizer keywords: the default (App. C's LayerNorms, the authors' details), the authors'
    "default": {},  # LayerNorms, modwire's tokenizer before issue 35 (the CPU presets')
    "authors": {"down_norm": "before", "block_norms": 1},
    "before_issue_35": {"stem_channels": 6, "layer_scale": 0.0, "eps": 1e-5, "init": "torch", "pos_std": 0.02}}


@pytest.mark.parametrize("form", CONV_FORMS)
def test_conv_tokenizer_equals_the_literal_app_c_preprocessor(form):
    """Every form against ``tests/reference/nac.py``'s pixel-by-pixel App. C preprocessor in float64,
    with random LayerNorm affines, biases and layer scales (so each one counts)."""
    kw = {"stem_channels": 4, **CONV_FORMS[form]}
    torch.manual_seed(0)
    tok = ConvTokenizer(image_size=16, in_channels=2, channels=6, pos_dim=3, **kw).double()
    with torch.no_grad():
        for m in tok.modules():
            for name, v in m.named_parameters(recurse=False):     # LayerNorm weights around 1
                v.copy_(0.4 * torch.randn_like(v) + float(isinstance(m, torch.nn.LayerNorm) and name == "weight"))
    x = torch.randn(2, 2, 16, 16, dtype=torch.float64)
    expected = app_c_preprocessor(dict(tok.named_parameters()), x, eps=kw.get("eps", 1e-6),
                                  down_norm=kw.get("down_norm", "after"), block_norms=kw.get("block_norms", 2))
    torch.testing.assert_close(tok(x), expected, rtol=0, atol=1e-12)
    assert ("block.layer_scale" in dict(tok.named_parameters())) == (form != "before_issue_35")
    assert ("block.norm2.weight" in dict(tok.named_parameters())) == (form != "authors")


def test_conv_tokenizer_initialisation_convnext_or_torch():
    """``init="convnext"`` (default): the authors' ``ConvNeXt._init_weights``, conv and linear weights
    ``N(0, 0.02²)`` (timm's absolute ±2 bounds cut nothing at that scale), zero biases; layer scale
    1e-6; positions ``N(0, 1)`` (their grid). ``"torch"``: PyTorch's layer defaults (nonzero biases)."""
    torch.manual_seed(0)
    tok = ConvTokenizer(image_size=64, channels=192, stem_channels=96)
    layers = [m for m in tok.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    weights = torch.cat([m.weight.flatten() for m in layers])
    assert abs(weights.std().item() - 0.02) < 5e-4 and abs(weights.mean().item()) < 2e-4
    assert all(not m.bias.any() for m in layers)
    assert torch.equal(tok.block.layer_scale, torch.full((96,), 1e-6))
    assert abs(tok.pos.std().item() - 1.0) < 0.05
    assert all(m.eps == 1e-6 for m in tok.modules() if isinstance(m, torch.nn.LayerNorm))
    legacy = ConvTokenizer(image_size=64, channels=192, stem_channels=96, init="torch")
    assert legacy.stem[0].bias.abs().min() > 0 and legacy.stem[0].weight.abs().max() <= (1 / 48) ** 0.5


def test_conv_tokenizer_before_issue_35_draws_the_same_network():
    """The CPU presets' form (one width, ``CONV_BEFORE_ISSUE_35``) is the network modwire built before
    the two widths existed: the same layers in the same order, drawn from the same random stream."""
    from modwire.models.tokenizer_config import CONV_BEFORE_ISSUE_35, TokenizerConfig, build_tokenizer

    cfg = TokenizerConfig(kind="conv", image_size=32, stem_channels=8, conv_channels=8, pos_dim=4,
                          **CONV_BEFORE_ISSUE_35)
    torch.manual_seed(3)
    tok = build_tokenizer(cfg)
    torch.manual_seed(3)                       # the layers of the former ConvTokenizer, in its order
    nn = torch.nn
    layers = [nn.Conv2d(3, 8, 4, stride=4), nn.LayerNorm(8), nn.Conv2d(8, 8, 7, padding=3, groups=8),
              nn.LayerNorm(8), nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 8), nn.Conv2d(8, 8, 2, stride=2),
              nn.LayerNorm(8)]
    former = [0.02 * torch.randn(16, 4)] + [t for layer in layers for t in layer.parameters()]  # positions drawn last
    ours = list(tok.parameters())                                                       # (listed first)
    assert len(ours) == len(former) and all(torch.equal(a, b) for a, b in zip(ours, former))
    assert all(m.eps == 1e-5 for m in tok.modules() if isinstance(m, nn.LayerNorm))


def test_conv_tokenizer_is_local_a_pixel_change_moves_only_nearby_tokens():
    tok = ConvTokenizer(image_size=64, stem_channels=8, channels=16, pos_dim=4)
    x = torch.randn(1, 3, 64, 64)
    y = x.clone()
    y[0, :, 0, 0] += 1.0  # top-left pixel: token (0,0), and its 7×7 neighbourhood at stride 4
    diff = (tok(x) - tok(y)).abs().sum(-1).view(8, 8)
    assert diff[0, 0] > 0 and diff[4:, :].sum() == 0 and diff[:, 4:].sum() == 0


def test_linear_tokenizer_with_and_without_positions():
    tok = LinearTokenizer(5, 7, max_len=10)
    x = torch.randn(2, 4, 5)
    torch.testing.assert_close(tok(x), tok.proj(x) + tok.pos.weight[:4])
    with pytest.raises(ValueError, match="sequence length 11 exceeds max_len 10"):
        tok(torch.randn(1, 11, 5))
    assert LinearTokenizer(5, 7).pos is None


def test_patch_embedding_linear_map_or_the_ait_authors_layernorm_linear_layernorm():
    """The conv is a linear map of each patch; ``norm=True`` (``embed.patch_norm``) flattens each patch
    row by row, channels innermost (the AiT authors' ``(p1 p2 c)``), then LayerNorm → Linear →
    LayerNorm: :class:`NormLinearNorm`, the module of AiT §5.8's question embedding too."""
    from modwire.models.set_model import QuestionEmbedding

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 6, generator=g, dtype=torch.float64)
    conv = PatchEmbedding(6, 3, 2, 5, absolute_positions=False).double()
    w = conv.proj.weight                                                  # [5, C, p, p]
    patch = x[1, :, 2:4, 4:6]                                             # row 1, column 2: token 1·3 + 2
    torch.testing.assert_close(conv(x)[1, 5], (w * patch).sum(dim=(1, 2, 3)) + conv.proj.bias)
    tok = PatchEmbedding(6, 3, 2, 5, absolute_positions=False, norm=True).double()
    with torch.no_grad():
        for norm in (tok.proj.norm_in, tok.proj.norm_out):
            norm.weight.add_(torch.randn(norm.weight.shape, generator=g, dtype=torch.float64))
    flat = torch.stack([patch[:, i, j] for i in range(2) for j in range(2)]).flatten()    # (p1 p2 c)
    ln = torch.nn.functional.layer_norm
    want = ln(tok.proj.proj(ln(flat, (12,), tok.proj.norm_in.weight, tok.proj.norm_in.bias)), (5,),
              tok.proj.norm_out.weight, tok.proj.norm_out.bias)
    torch.testing.assert_close(tok(x)[1, 5], want)
    assert isinstance(tok.proj, NormLinearNorm) and issubclass(QuestionEmbedding, NormLinearNorm)
    assert tok.pos is None and PatchEmbedding(6, 3, 2, 5, norm=True).pos.shape == (9, 5)
    with pytest.raises(ValueError, match=r"expects images \[B, 3, 6, 6\]"):
        tok(torch.randn(2, 3, 8, 8, dtype=torch.float64))


def test_embedding_tokenizer_for_bytes():
    tok = EmbeddingTokenizer(256, 8, max_len=32)
    ids = torch.tensor([list(b"hello world")])
    torch.testing.assert_close(tok(ids), tok.embed.weight[ids] + tok.pos.weight[:11])
    with pytest.raises(TypeError, match=r"integer token ids \[B, N\].*got torch.float32"):
        tok(torch.randn(1, 5))


def test_nac_on_byte_sequences():
    model = modwire.create_model("nac_micro", tokenizer={"kind": "embedding", "vocab_size": 256, "max_len": 64}).eval()
    logits = model(torch.randint(0, 256, (3, 40)))
    assert logits.shape == (3, 5) and torch.isfinite(logits).all()


def test_tokenizer_config_errors_name_the_field():
    with pytest.raises(ValueError, match="'tokenizer.kind'.*'patch'.*conv"):
        modwire.create_model("nac_micro", tokenizer="patch")
    with pytest.raises(ValueError, match="'tokenizer.vocab_size'"):
        modwire.create_model("nac_micro", tokenizer="embedding")
    with pytest.raises(ValueError, match="'tokenizer.image_size'.*multiple of 8"):
        modwire.create_model("nac_small", tokenizer={"image_size": 30})


@pytest.mark.parametrize("name", ["nac_micro", "perceiver_io_micro"])
def test_padding_is_hidden_from_the_read_in(name):
    torch.manual_seed(0)
    kw = dict(kind="embedding", vocab_size=16, max_len=32)
    model = modwire.create_model(name, tokenizer={**kw, "pad_id": 0}).double().eval()
    seq = torch.randint(1, 16, (1, 9))
    padded = torch.cat([seq, torch.zeros(1, 7, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), model(seq), atol=1e-12, rtol=1e-12)
    # a batch of different lengths gives each sequence its own output
    batch = torch.cat([padded, torch.randint(1, 16, (1, 16))])
    torch.testing.assert_close(model(batch)[:1], model(seq), atol=1e-12, rtol=1e-12)
    unmasked = modwire.create_model(name, tokenizer=kw).double().eval()
    unmasked.load_state_dict(model.state_dict())
    assert (unmasked(padded) - unmasked(seq)).abs().max() > 1e-8  # without pad_id, pads are read


def test_pad_id_is_validated():
    with pytest.raises(ValueError, match="'tokenizer.pad_id'.*vocab_size=16"):
        modwire.create_model("nac_micro", tokenizer={"kind": "embedding", "vocab_size": 16, "pad_id": 16})


def test_patch_layernorm_maps_every_constant_patch_to_one_token():
    """The AiT authors' patch LayerNorm removes a patch's mean and scale, so a one-colour patch carries
    nothing: digits upsampled 4× (nearest) in 4×4 patches become one token per image whatever the digit
    (why ``experiments/ait_memory_collapse.py`` cuts them into 8×8 patches); the strided conv keeps them."""
    torch.manual_seed(0)
    pixels = torch.rand(2, 1, 8, 8)
    x = pixels.repeat_interleave(4, dim=2).repeat_interleave(4, dim=3)           # [2, 1, 32, 32], 4×4 blocks
    norm = PatchEmbedding(32, 1, 4, 16, absolute_positions=False, norm=True)
    tokens = norm(x)                                                              # [2, 64, 16]
    torch.testing.assert_close(tokens, tokens[:1, :1].expand_as(tokens))
    def spread(t):                                                                # how far tokens differ
        return (t - t[:1, :1]).abs().amax()
    assert spread(norm(torch.rand(2, 1, 32, 32))) > 0.1                         # varied patches: varied tokens
    assert spread(PatchEmbedding(32, 1, 4, 16, absolute_positions=False)(x)) > 1e-3   # the strided conv
    assert spread(PatchEmbedding(32, 1, 8, 16, absolute_positions=False, norm=True)(x)) > 0.1   # 2×2 pixels
