import pytest
import torch

import modwire
from modwire.nn import ConvTokenizer, EmbeddingTokenizer, LinearTokenizer, NormLinearNorm, PatchEmbedding


def test_conv_tokenizer_app_c_shapes_and_concatenated_positions():
    tok = ConvTokenizer(image_size=64, in_channels=3, channels=320, pos_dim=64)
    out = tok(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 64, 384) and tok.out_dim == 384  # 64×64 → 8×8 tokens
    for b in range(2):  # learned 64-d positions are concatenated, the same for every sample
        torch.testing.assert_close(out[b, :, 320:], tok.pos)
    assert [m.stride for m in (tok.stem[0], tok.down[0])] == [(4, 4), (2, 2)]
    assert tok.block.dwconv.kernel_size == (7, 7)
    assert ConvTokenizer(image_size=224, channels=448).num_tokens == 28 * 28  # ImageNet (App. C)


def test_conv_tokenizer_is_local_a_pixel_change_moves_only_nearby_tokens():
    tok = ConvTokenizer(image_size=64, channels=16, pos_dim=4)
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
