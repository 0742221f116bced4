"""The causal transformer LM and its NFM integration (models/lm.py, NFM §4.6 / Table 8): values.

* a CausalBlock is torch's ``TransformerEncoderLayer(norm_first=True, gelu)`` with a causal mask;
* causality with NFM on (γ ≠ 0; one pass, two passes shared or not): logits at ``t`` ignore tokens ``> t``;
* a module's read equals a loop-by-loop re-statement (query: the reading block's LN₁ + W_q; keys and
  values: each WRITER block's LN₁ + W_k / W_v; the reading block's W_o; null slot, top-k);
* NFM adds exactly one parameter (γ) per reader, and with γ = 0 the output is the base model's;
* the §4.4 random-attention evaluation option; clear errors for bad input.
"""
import copy

import pytest
import torch
from torch import nn

import modwire
from modwire.models.lm import CausalBlock, SharedProjectionLayer, TransformerLM, TransformerLMConfig
from modwire.nn.nfm import NFMLayer

SMALL = dict(vocab_size=23, max_len=12, d_model=16, num_layers=3, num_heads=2, ffn_hidden=24, dropout=0.0)


def _lm(nfm=None, seed=0, **kw):
    torch.manual_seed(seed)
    return TransformerLM(TransformerLMConfig(**{**SMALL, **kw}, nfm=nfm or {}))


def _set_gammas(model, value=0.8):
    with torch.no_grad():
        for i, g in enumerate(model.body.gammas):
            g.fill_(value * (1 + 0.1 * i))


def test_causal_block_equals_torch_encoder_layer_with_causal_mask():
    torch.manual_seed(1)
    block = CausalBlock(16, 2, 24, dropout=0.0).eval()
    peer = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.0, activation="gelu", norm_first=True,
                                      batch_first=True).eval()
    a, f = block.attn.fn, block.ffn.fn
    with torch.no_grad():
        peer.self_attn.in_proj_weight.copy_(torch.cat([a.q.weight, a.k.weight, a.v.weight]))
        peer.self_attn.in_proj_bias.copy_(torch.cat([a.q.bias, torch.zeros_like(a.q.bias), a.v.bias]))  # no key bias (the softmax cancels it)
        peer.self_attn.out_proj.weight.copy_(a.o.weight)
        peer.self_attn.out_proj.bias.copy_(a.o.bias)
        peer.linear1.weight.copy_(f.fc1.weight), peer.linear1.bias.copy_(f.fc1.bias)
        peer.linear2.weight.copy_(f.fc2.weight), peer.linear2.bias.copy_(f.fc2.bias)
        peer.norm1.load_state_dict(block.attn.norm.state_dict()), peer.norm2.load_state_dict(block.ffn.norm.state_dict())
    x = torch.randn(3, 7, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(7)
    torch.testing.assert_close(block(x), peer(x, src_mask=mask, is_causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("nfm", [
    None,
    {"enabled": True, "passes": 1, "k": 2, "score_scale": "sqrt_d_k"},
    {"enabled": True, "passes": 2, "k": 3, "share_blocks": True},
    {"enabled": True, "passes": 2, "k": 5, "share_blocks": False},
])
def test_position_t_logits_do_not_depend_on_later_tokens(nfm):
    model = _lm(nfm).eval()
    if nfm:
        _set_gammas(model)            # the readers contribute
    x = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(0))
    base = model(x)
    for t in (0, 4, 10):
        y = x.clone()
        y[:, t + 1:] = (y[:, t + 1:] + 7) % 23                      # change every token after t
        out = model(y)
        torch.testing.assert_close(out[:, :t + 1], base[:, :t + 1], atol=1e-6, rtol=0)
        assert (out[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-3   # later positions do see them


def test_gradient_of_position_t_reaches_no_later_embedding():
    model = _lm({"enabled": True, "passes": 2, "share_blocks": True}).eval()
    _set_gammas(model)
    x = torch.randint(0, 23, (1, 9), generator=torch.Generator().manual_seed(2))
    h = model.embed(x).detach().requires_grad_(True)
    model.embed = _Fixed(h)
    w = torch.randn(16, generator=torch.Generator().manual_seed(3))   # (a plain sum of a LayerNorm output is constant)
    (model.forward_record(x).states[0, 4] @ w).backward()     # the final state at t = 4
    g = h.grad[0].abs().sum(-1)
    assert (g[5:] == 0).all() and (g[:5] > 0).all()


class _Fixed(nn.Module):
    """An embedding that returns a fixed (leaf) tensor, so its gradient per position can be read."""

    def __init__(self, h):
        super().__init__()
        self.h = h
        self.weight = nn.Parameter(torch.zeros(23, h.shape[-1]))

    def forward(self, x):
        return self.h


def _reference_read(block, writers, gamma, h, sources, k, scale, topk_softmax="kept"):
    """NFM §3.2.1 at each position, loop by loop (float64): query W_q LN₁(h_t) of the reading block;
    source j's key/value W_k/W_v LN₁(m_j,t) of the block that WROTE it (``writers[j]``), after a zero
    null key/value; the top-k scores kept, softmax over them (``"subtract"``, the authors' rule: the
    softmax over all keys minus its (k+1)-th largest weight + 1e-7, clipped at 0, renormalised); the
    reading block's W_o; γ."""
    heads, dh = block.attn.fn.num_heads, block.attn.fn.head_dim
    out = h.clone()
    b_, d, t_ = h.shape
    for b in range(b_):
        for t in range(t_):
            q = block.attn.fn.q(block.attn.norm(h[b, :, t]))          # W_q LN₁
            ks = [torch.zeros(d, dtype=h.dtype)] + [w.attn.fn.k(w.attn.norm(m[b, :, t])) for w, m in zip(writers, sources)]
            vs = [torch.zeros(d, dtype=h.dtype)] + [w.attn.fn.v(w.attn.norm(m[b, :, t])) for w, m in zip(writers, sources)]
            read = []
            for hd in range(heads):
                sl = slice(hd * dh, (hd + 1) * dh)
                scores = torch.stack([q[sl] @ kk[sl] * scale for kk in ks])
                if topk_softmax == "kept":
                    keep = scores.topk(min(k, len(ks))).indices
                    w = torch.softmax(scores[keep], 0)
                else:
                    keep = torch.arange(len(ks))
                    w = torch.softmax(scores, 0)
                    if len(ks) > k + 1:
                        w = (w - sorted(w.tolist(), reverse=True)[k] - 1e-7).clamp(min=0)
                        w = w / (w.sum() + 1e-7)
                read.append(sum(wi * vs[j][sl] for wi, j in zip(w, keep.tolist())))
            out[b, :, t] = h[b, :, t] + gamma * block.attn.fn.o(torch.cat(read))
    return out


def _bound(block, k, score_scale, **kw):
    layer = SharedProjectionLayer(8, 2, k=k, rescale="space_to_depth", score_scale=score_scale, **kw).double()
    layer.bind(block)
    return layer


@pytest.mark.parametrize("score_scale,k,topk_softmax", [("sqrt_d_k", 2, "kept"), ("d_k", 5, "kept"),
                                                        ("sqrt_d_k", 2, "subtract")])
def test_module_reuses_the_block_projections_literally_keys_by_their_writer(score_scale, k, topk_softmax):
    torch.manual_seed(3)
    block, *writers = [CausalBlock(8, 2, 12, dropout=0.0).double() for _ in range(4)]
    with torch.no_grad():                           # LN₁ affine parameters that differ per block
        for blk in (block, *writers):
            blk.attn.norm.weight.uniform_(0.5, 1.5), blk.attn.norm.bias.normal_()
    layer = _bound(block, k, score_scale, topk_softmax=topk_softmax)
    with torch.no_grad():
        layer.gamma.fill_(0.6)
    h = torch.randn(2, 8, 5, dtype=torch.float64)
    sources = [torch.randn(2, 8, 5, dtype=torch.float64) for _ in range(3)]
    memory = [_bound(w, k, score_scale).write(m) for w, m in zip(writers, sources)]
    out, _ = layer.read(h, memory)
    scale = 1 / 4 if score_scale == "d_k" else 4 ** -0.5
    with torch.no_grad():
        ref = _reference_read(block, writers, 0.6, h, sources, k, scale, topk_softmax)
        wrong = _reference_read(block, [block] * 3, 0.6, h, sources, k, scale, topk_softmax)  # reader-side keys
        other = _reference_read(block, writers, 0.6, h, sources, k, scale,
                                {"kept": "subtract", "subtract": "kept"}[topk_softmax])
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    assert (out - wrong).abs().max() > 1e-3
    if k + 1 < 4:                                   # 3 sources + the null key: the two top-k rules differ
        assert (out - other).abs().max() > 1e-3
    assert [n for n, _ in layer.named_parameters()] == ["gamma"]     # the block's weights are not the layer's
    assert isinstance(layer, NFMLayer) and layer.w_o1 is None and layer.query is None and layer.key is None


def test_module_errors_unbound_last_writer_and_mismatched_heads():
    layer = SharedProjectionLayer(8, 2, writes=False)
    with pytest.raises(RuntimeError, match="call bind\\(block\\)"):
        layer.project_query(torch.randn(1, 8, 3))
    layer.bind(CausalBlock(8, 2, 12, dropout=0.0))
    with pytest.raises(RuntimeError, match="never read"):
        layer.write(torch.randn(1, 8, 3))
    with pytest.raises(ValueError, match="expected a block with 2 heads of width 4, got 4 of width 2"):
        layer.bind(CausalBlock(8, 4, 12, dropout=0.0))
    with pytest.raises(ValueError, match="num_heads must be a positive int dividing dim=8, got 3"):
        SharedProjectionLayer(8, 3)


@pytest.mark.parametrize("nfm,readers", [({"enabled": True, "passes": 1}, 3),
                                         ({"enabled": True, "passes": 2, "share_blocks": True}, 6)])
def test_nfm_adds_one_gamma_per_reader_and_equals_the_base_model_at_gamma_zero(nfm, readers):
    """One γ per reading module; the first module of the first pass reads only the null slot and has none."""
    base, model = _lm(), _lm(nfm, seed=5)
    assert len(model.body.readers) == readers
    assert model.num_parameters() - base.num_parameters() == readers - 1 == len(model.body.gammas)
    state = model.state_dict()
    assert sorted(k for k in state if k not in base.state_dict()) == \
        [f"body.readers.{i}.gamma" for i in range(1, readers)]
    model.load_state_dict({**base.state_dict(), **{k: v for k, v in state.items() if "gamma" in k}})
    x = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model.eval()(x), base.eval()(x), atol=1e-6, rtol=0)
    _set_gammas(model)
    assert (model(x) - base(x)).abs().max() > 1e-3


def test_second_pass_reads_the_first_and_records_say_so():
    model = _lm({"enabled": True, "passes": 2, "share_blocks": False, "k": 4}).eval()
    _set_gammas(model)
    inter = model.forward_record(torch.randint(0, 23, (2, 12)))
    assert len(inter.nfm) == 6 and inter.nfm[4].sources == [(0, 0), (0, 1), (0, 2), (1, 0)]
    for r in inter.nfm:
        total = r.mass.sum(-1) + r.null
        torch.testing.assert_close(total, torch.ones(2), atol=1e-5, rtol=0)
    # the second pass runs its own copy of the blocks; each reader reads through the block it precedes
    assert model.body.readers[4].block is model.body.block(1, 1) is not model.body.block(0, 1)


def test_random_attention_eval_option_and_save_load(tmp_path):
    model = _lm({"enabled": True, "passes": 1}).eval()
    _set_gammas(model)
    x = torch.randint(0, 23, (2, 12))
    clean = model(x)
    model.set_eval_options(random_attention=True)
    assert model.config.nfm.random_attention and model.body.random_attention
    torch.manual_seed(0)
    noisy = model(x)
    assert (noisy - clean).abs().max() > 1e-4
    with pytest.raises(ValueError, match="evaluation ablation"):
        model.train()(x)
    model.set_eval_options(random_attention=False)
    model.eval().save_pretrained(tmp_path)
    loaded = modwire.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded(x), clean, atol=0, rtol=0)       # γ and the shared weights survive
    assert copy.deepcopy(loaded).body.readers[1].block is not loaded.body.blocks[1]


def test_bad_input_errors():
    model = _lm()
    with pytest.raises(ValueError, match="integer token ids \\[B, T\\], got torch.float32"):
        model(torch.randn(2, 5))
    with pytest.raises(ValueError, match="13 tokens exceeds max_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="must lie in \\[0, 23\\), got \\[0, 23\\]"):
        model(torch.tensor([[0, 23]]))
    with pytest.raises(ValueError, match="'num_heads'.*divides d_model=16"):
        TransformerLMConfig(**{**SMALL, "num_heads": 3})
    with pytest.raises(ValueError, match="'nfm.d_k': got 32.*reuses each block's LN and attention projections"):
        TransformerLMConfig(**SMALL, nfm={"enabled": True, "d_k": 32})
    TransformerLMConfig(**SMALL, nfm={"enabled": False, "d_k": 32})        # the base network ignores nfm
    with pytest.raises(ValueError, match="does not support these options"):
        _lm({"enabled": True, "passes": 1, "reader_output": "conv3x3"})


def test_the_authors_topk_rule_reaches_every_reader():
    model = _lm({"enabled": True, "passes": 2, "k": 1, "topk_softmax": "subtract"})
    assert {r.topk_softmax for r in model.body.readers} == {"subtract"}
    x = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    _set_gammas(model)
    kept = _lm({"enabled": True, "passes": 2, "k": 1})
    kept.load_state_dict(model.state_dict())
    assert (model.eval()(x) - kept.eval()(x)).abs().max() > 1e-4


def test_empty_contexts_and_unscored_batches_are_clear_errors():
    from modwire.tasks.metrics import IGNORE_INDEX, token_metrics, token_sums
    from modwire.training.runtime import check_labels
    from modwire.tasks import get_task

    lm = modwire.create_model("nfm_transformer_lm_micro")
    with pytest.raises(ValueError, match=r"B, T >= 1, got an empty batch \[2, 0\]"):
        lm(torch.zeros(2, 0, dtype=torch.long))
    y = torch.full((2, 4), IGNORE_INDEX)
    with pytest.raises(ValueError, match="no scored target token"):
        check_labels(y, get_task("wikitext2"), 50)
    with pytest.raises(ValueError, match="no target token was scored"):
        token_metrics(("perplexity",), token_sums(torch.randn(2, 4, 50), y))
