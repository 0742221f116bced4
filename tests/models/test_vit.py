"""ViT and the set-model scaffolding (models/vit.py, models/set_model.py): values, not shapes.

* a ViT block is ``torch.nn.TransformerEncoderLayer(norm_first=True, activation="gelu")`` with the
  same weights (the public peer, value for value);
* CLS tokens come after the elements, per-token heads equal separate linear layers, a ``task``
  id picks its own head, ``num_cls_tokens=0`` reads the mean;
* the relative positional bias covers patch tokens only (0 for pairs with a CLS token);
* PGM panels: candidate ``k``'s set is the context plus candidate ``k``; logits ``[B, K]``;
* ``new_task`` and ``parameter_sets`` (the fine-tuning protocol), save/load after ``new_task``.
"""
import pytest
import torch
from torch import nn

import modwire
from modwire.models import ViT, ViTConfig
from modwire.models.tokenizer_config import TokenizerConfig
from modwire.nn.positions import pad_bias


def _copy_block(block, layer: nn.TransformerEncoderLayer) -> None:
    """Our TransformerBlock's weights into the peer's (in_proj = [q; k; v])."""
    attn = block.attn.fn
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
        layer.self_attn.in_proj_bias.copy_(torch.cat([attn.q.bias, torch.zeros_like(attn.q.bias), attn.v.bias]))  # no key bias (the softmax cancels it)
        layer.self_attn.out_proj.weight.copy_(attn.o.weight)
        layer.self_attn.out_proj.bias.copy_(attn.o.bias)
        layer.norm1.load_state_dict(block.attn.norm.state_dict())
        layer.norm2.load_state_dict(block.ffn.norm.state_dict())
        layer.linear1.load_state_dict({"weight": block.ffn.fn.fc1.weight, "bias": block.ffn.fn.fc1.bias})
        layer.linear2.load_state_dict({"weight": block.ffn.fn.fc2.weight, "bias": block.ffn.fn.fc2.bias})


def test_vit_blocks_equal_torch_transformer_encoder_layers():
    torch.manual_seed(0)
    cfg = ViTConfig(num_classes=3, d_model=24, num_layers=2, num_heads=3, ffn_hidden=40,
                    tokenizer=TokenizerConfig(kind="linear", input_dim=5))
    model = ViT(cfg).double().eval()
    peer = nn.TransformerEncoder(nn.TransformerEncoderLayer(24, 3, 40, dropout=0.0, activation="gelu",
                                                            batch_first=True, norm_first=True),
                                 2, enable_nested_tensor=False).double().eval()
    for block, layer in zip(model.blocks, peer.layers):
        _copy_block(block, layer)
    x = torch.randn(4, 7, 24, dtype=torch.float64)
    ours, _ = model.encode(x, record=False)
    torch.testing.assert_close(ours, peer(x), atol=1e-10, rtol=1e-10)


def _vectors_vit(**kw) -> ViT:
    cfg = dict(num_classes=2, d_model=16, num_layers=1, num_heads=2, ffn_hidden=8,
               tokenizer=TokenizerConfig(kind="linear", input_dim=3, max_len=6))
    return ViT(ViTConfig(**{**cfg, **kw})).double().eval()


def test_cls_tokens_follow_the_elements_and_each_has_its_own_head():
    torch.manual_seed(1)
    model = _vectors_vit(num_cls_tokens=3)
    x = torch.randn(5, 6, 3, dtype=torch.float64)
    inter = model.forward_record(x)
    y = inter.states                                              # [B, 6 + 3, d], normalised
    assert y.shape == (5, 9, 16)
    w, b = model.heads.weight, model.heads.bias
    expected = torch.stack([y[:, 6 + t] @ w[t].T + b[t] for t in range(3)], dim=1)   # [B, T, C]
    torch.testing.assert_close(inter.logits, expected)
    # the elements' tokens are the embedding; the CLS tokens the learned vectors
    tokens = model.embed(x)
    torch.testing.assert_close(tokens, model.embed.proj(x) + model.embed.pos.weight[:6])


def test_task_ids_choose_each_samples_head():
    torch.manual_seed(2)
    model = _vectors_vit(num_cls_tokens=3, task_input=True)
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    task = torch.tensor([2, 0, 1, 2])
    out = model(x, task=task)
    model.config.task_input = False                               # all heads, for comparison
    every = model(x)                                              # [B, T, C]
    torch.testing.assert_close(out, every[torch.arange(4), task])
    model.config.task_input = True
    with pytest.raises(ValueError, match=r"task: ids must lie in \[0, 3\)"):
        model(x, task=torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="needs 'task' ids"):
        model(x)


def test_shared_head_gives_one_regression_per_cls_token():
    torch.manual_seed(3)
    model = _vectors_vit(num_cls_tokens=4, shared_head=True, num_classes=1)
    x = torch.randn(3, 6, 3, dtype=torch.float64)
    inter = model.forward_record(x)
    assert model.heads.weight.shape == (1, 1, 16)
    expected = inter.states[:, -4:] @ model.heads.weight[0, 0] + model.heads.bias[0, 0]
    torch.testing.assert_close(inter.logits, expected)            # [B, T]


def test_no_cls_token_reads_the_mean_of_the_outputs():
    torch.manual_seed(4)
    model = _vectors_vit(num_cls_tokens=0)
    x = torch.randn(3, 6, 3, dtype=torch.float64)
    inter = model.forward_record(x)
    assert inter.states.shape[1] == 6
    expected = inter.states.mean(1) @ model.heads.weight[0].T + model.heads.bias[0]
    torch.testing.assert_close(inter.logits, expected)


def test_relative_bias_covers_patch_tokens_only():
    torch.manual_seed(5)
    model = modwire.create_model("vit_micro").eval()              # 8×8 images, 2×2 patches: 16 tokens + CLS
    bias = pad_bias(model.relative(), 17)
    assert bias.shape == (2, 17, 17)
    assert (bias[:, 16] == 0).all() and (bias[:, :, 16] == 0).all()
    assert bias[:, :16, :16].abs().sum() > 0
    # the same displacement gets the same bias: token (0,0)→(1,1) and (1,1)→(2,2) on the 4×4 grid
    torch.testing.assert_close(bias[:, 0, 5], bias[:, 5, 10])
    # the bias changes the output (it is used), and it is per head
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        before = model(x)
        model.relative.e_row.add_(1.0)
        assert not torch.allclose(model(x), before)


def test_pgm_panels_make_one_set_per_candidate():
    torch.manual_seed(6)
    cfg = ViTConfig(num_classes=1, d_model=16, num_layers=1, num_heads=2, ffn_hidden=8,
                    tokenizer=TokenizerConfig(kind="panels", image_size=16, in_channels=6, num_context=3,
                                      panel_channels=4))
    model = ViT(cfg).eval()
    x = torch.rand(2, 6, 16, 16)
    sets = model.embed(x)                                         # [B·K, 3 + 1, d], K = 3
    assert sets.shape == (6, 4, 16)
    e = model.embed.cnn(x.reshape(12, 1, 16, 16)).view(2, 6, 16)
    torch.testing.assert_close(sets.view(2, 3, 4, 16)[1, 2], torch.cat([e[1, :3], e[1, 5:6]]) + model.embed.slots)
    logits = model(x)
    assert logits.shape == (2, 3)
    # permuting the candidates permutes the scores
    perm = torch.tensor([0, 1, 2, 5, 3, 4])
    torch.testing.assert_close(model(x[:, perm]), logits[:, [2, 0, 1]], atol=1e-5, rtol=1e-5)


def test_new_task_replaces_cls_tokens_and_heads_and_round_trips(tmp_path):
    torch.manual_seed(7)
    model = modwire.create_model("vit_digits")
    before = {n: p.clone() for n, p in model.named_parameters()}
    model.new_task(num_classes=7)
    assert model.config.num_cls_tokens == 1 and not model.config.task_input and model.config.num_classes == 7
    assert model.cls_tokens.shape == (1, 192) and model.heads.weight.shape == (1, 7, 192)
    kept = [n for n, p in model.named_parameters() if n in before and torch.equal(p, before[n])]
    assert len(kept) == len(before) - 3                           # all but cls_tokens, heads.weight, heads.bias
    x = torch.rand(2, 3, 32, 32)
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_parameter_sets_name_existing_parameters():
    model = modwire.create_model("vit_micro")
    names = [n for n, _ in model.named_parameters()]
    sets = model.parameter_sets()
    assert set(sets) >= {"cls", "all"}
    cls = [n for n in names if n.startswith(sets["cls"])]
    assert sorted(cls) == ["cls_tokens", "heads.bias", "heads.weight"]


def test_digits_preset_has_the_table_5_parameter_count():
    n = modwire.create_model("vit_digits").num_parameters()
    assert abs(n - 1.80e6) / 1.80e6 < 0.01, n                     # NI Table 5: 1.80 × 10⁶


# ----------------------------------------------------------------------------- question token (AiT §5.8)

def _question_vit(**kw) -> ViT:
    cfg = dict(num_classes=4, d_model=16, num_layers=1, num_heads=2, ffn_hidden=8, question_dim=5,
               tokenizer=TokenizerConfig(kind="patches", image_size=8, in_channels=3, patch_size=4))
    return ViT(ViTConfig(**{**cfg, **kw})).double().eval()


def test_question_token_is_ln_linear_ln_and_sits_after_the_patches_before_the_cls_tokens():
    torch.manual_seed(8)
    model = _question_vit(num_cls_tokens=2)
    with torch.no_grad():                                         # non-trivial LayerNorm affines
        for p in model.question.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    seen = {}
    encode = model.encode
    model.encode = lambda tokens, **kw: (seen.setdefault("tokens", tokens), encode(tokens, **kw))[1]
    x, q = torch.rand(3, 3, 8, 8, dtype=torch.float64), torch.randn(3, 1, 5, dtype=torch.float64)
    model(x, question=q)
    tokens = seen["tokens"]                                       # [B, 4 patches + question + 2 CLS, d]
    assert tokens.shape == (3, 7, 16)
    e = model.question
    ln = torch.nn.functional.layer_norm
    expected = ln(ln(q, (5,), e.norm_in.weight, e.norm_in.bias) @ e.proj.weight.T + e.proj.bias, (16,),
                  e.norm_out.weight, e.norm_out.bias)             # AiT §5.8: LN -> linear -> LN
    torch.testing.assert_close(tokens[:, 4:5], expected)
    torch.testing.assert_close(tokens[:, :4], model.embed(x))
    torch.testing.assert_close(tokens[:, 5:], model.cls_tokens.expand(3, -1, -1))
    # a [B, Q] question is the same one-vector set
    torch.testing.assert_close(model(x, question=q[:, 0]), model(x, question=q))


def test_the_answer_depends_on_the_question_and_gradients_reach_its_embedding():
    torch.manual_seed(9)
    model = _question_vit(num_cls_tokens=0)                       # pooled output: the mean includes the question
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    q1, q2 = torch.eye(5, dtype=torch.float64)[[0, 0]][:, None], torch.eye(5, dtype=torch.float64)[[3, 3]][:, None]
    a1, a2 = model(x, question=q1), model(x, question=q2)
    assert (a1 - a2).abs().max() > 1e-3
    a1.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.question.parameters())


def test_question_input_errors_name_what_was_expected():
    model = _question_vit()
    x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="needs a 'question' input"):
        model(x)
    with pytest.raises(ValueError, match=r"question: expected \[B=2, 1, 5\]"):
        model(x, question=torch.zeros(2, 1, 6, dtype=torch.float64))
    with pytest.raises(TypeError, match="question: expected torch.float64"):
        model(x, question=torch.zeros(2, 1, 5))
    with pytest.raises(ValueError, match="takes no 'question' input"):
        _question_vit(question_dim=0)(x, question=torch.zeros(2, 1, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="'question_dim'"):
        ViTConfig(question_dim=-1)
    with pytest.raises(ValueError, match="reads no question"):
        ViTConfig(num_classes=1, question_dim=3, tokenizer=TokenizerConfig(kind="panels", image_size=16, in_channels=6,
                                                                    num_context=3))


def test_input_overrides_map_an_image_and_a_question_onto_the_question_token():
    from modwire.models.inputs import InputSpec
    cfg = modwire.get_config("vit_micro")
    inputs = {"x": InputSpec.image(3, 10, 10), "question": InputSpec.vectors(1, 11)}
    mapped = cfg.for_inputs(inputs, 10)
    assert mapped.question_dim == 11 and mapped.input_names() == ("x", "question")
    assert (mapped.tokenizer.image_size, mapped.tokenizer.in_channels, mapped.num_classes) == (10, 3, 10)
    # a task without a question switches the token off, whatever the preset had
    plain = modwire.get_config("vit_small_sort_of_clevr").for_inputs(InputSpec.image(3, 25, 25), 10)
    assert plain.question_dim == 0 and plain.input_names() == ("x",)
    with pytest.raises(ValueError, match=r"'question' input must be one vector per sample"):
        cfg.for_inputs({"x": InputSpec.image(3, 8, 8), "question": InputSpec.vectors(2, 11)}, 10)
    with pytest.raises(ValueError, match=r"the task gives \['audio', 'x'\]"):
        cfg.for_inputs({"x": InputSpec.image(3, 8, 8), "audio": InputSpec.vectors(1, 11)}, 10)


def test_question_model_round_trips_through_save_pretrained(tmp_path):
    torch.manual_seed(10)
    model = _question_vit()
    model.save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path).double().eval()
    x, q = torch.rand(2, 3, 8, 8, dtype=torch.float64), torch.randn(2, 1, 5, dtype=torch.float64)
    assert loaded.config.question_dim == 5
    torch.testing.assert_close(loaded(x, question=q), model(x, question=q), atol=0, rtol=0)


def test_sort_of_clevr_preset_is_table_6_relational_with_a_question_token():
    model = modwire.create_model("vit_small_sort_of_clevr")
    c = model.config
    assert (c.d_model, c.num_heads, c.ffn_hidden, c.num_layers, c.num_cls_tokens) == (768, 12, 3072, 2, 0)
    assert (c.tokenizer.image_size, c.tokenizer.in_channels, c.tokenizer.patch_size, c.question_dim, c.num_classes) == \
        (75, 3, 5, 11, 10)
    d, f, n, pd = 768, 3072, (75 // 5) ** 2, 3 * 5 * 5
    block = 4 * d * d + d + 2 * d * f + f + d + 4 * d            # attention (only W^O has a bias), MLP, two LNs
    flat = (n + 1) * d                                            # the authors' classifier: patches + question
    embed = 2 * pd + pd * d + d + 2 * d                           # LN → Linear → LN, no positions
    expected = embed + 2 * block + (2 * 11 + 11 * d + d + 2 * d) + 2 * flat + (flat * 10 + 10)
    assert model.num_parameters() == expected == 16_324_790


def test_ait_table_1_vit_presets_are_the_authors_vit_and_reach_table_1_counts():
    """AiT Table 1's ViT-Small / Base (14.9 / 85.7 M) are the AiT authors' ViT (their vit_hn.py with
    sparse=False): LayerNorm → Linear → LayerNorm patches without positions, no query/value biases,
    the flattened classifier (LayerNorm over the N·E token features, then Linear) in place of the
    pooled one (exactly that difference). 14,800,234 / 43,142,506 / 85,655,914 parameters: their
    printed totals less the 109,056 they never use (tests/models/test_ait_authors.py)."""
    counts = {}
    for size in ("small", "medium", "base"):
        with torch.device("meta"):
            vit = modwire.create_model(f"vit_{size}_cifar10")
            pooled = modwire.create_model(f"vit_{size}_cifar10", classifier="mean")
        n, e, classes = 64, 768, 10
        c = vit.config
        assert (c.classifier, c.qv_bias, c.tokenizer.patch_norm, c.tokenizer.positions) == ("flatten", False, True, "none")
        assert vit.embed.pos is None and vit.blocks[0].attn.fn.q.bias is None and vit.blocks[0].attn.fn.o.bias is not None
        assert vit.heads.linear.in_features == n * e
        assert vit.num_parameters() - pooled.num_parameters() == \
            (2 * n * e + n * e * classes + classes) - (e * classes + classes + 2 * e)
        counts[size] = vit.num_parameters()
    assert counts == {"small": 14_800_234, "medium": 43_142_506, "base": 85_655_914}
    assert {k: counts[k] / 1e6 for k in ("small", "base")} == pytest.approx({"small": 14.9, "base": 85.7}, rel=0.01)


def test_the_ni_papers_vits_keep_their_embedding_positions_and_biases():
    for name in ("vit_digits", "vit_micro"):
        model = modwire.create_model(name)
        c = model.config
        assert c.qv_bias and not c.tokenizer.patch_norm and isinstance(model.embed.proj, torch.nn.Conv2d)
        assert model.blocks[0].attn.fn.q.bias is not None and model.blocks[0].attn.fn.k.bias is None
    assert modwire.create_model("vit_digits").embed.pos is None            # relative positions (NI App. C.2.3)
    assert modwire.create_model("vit_micro", tokenizer={"positions": "absolute"}).embed.pos is not None


def test_flatten_classifier_needs_patch_tokens_and_one_head():
    with pytest.raises(ValueError, match="'classifier': 'flatten' reads a fixed number of patch tokens"):
        modwire.create_model("vit_digits", classifier="flatten")
    with pytest.raises(ValueError, match="'classifier': got 'cls', expected one of"):
        modwire.create_model("vit_micro", classifier="cls")
