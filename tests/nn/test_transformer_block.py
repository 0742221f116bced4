"""Issue 37, item 3: the one :class:`~modwire.nn.blocks.TransformerBlock` computes exactly what the three
blocks it replaced computed (tests/reference/blocks_before.py keeps them with their literal forwards):

* NAC's / Perceiver IO's ``ProcessorLayer`` and the ViT's block (modulation codes, a kernel bias
  ``log K̂``, a relative-position bias, head_dim, qv_bias, returned attention weights);
* the AiT's Figure 1b block, with and without its workspace and under each Table 2 ablation;
* the LM's ``CausalBlock`` (causal mask, dropout off and on);

all in float64 after copying the old block's weights into the new one. Their state-dict keys are the old
ones, except the LM's, whose old keys (``norm1``, ``attn.q``, ``norm2``, ``ffn.fc1``, …) load through every
loading path (``load_state_dict``, ``from_pretrained``, the trainer's ``load_weights``, NFM's
``load_base_weights``) into the same model.
"""
import copy

import pytest
import torch
from safetensors.torch import load_file, save_file

import modwire
from modwire.models import AiT
from modwire.models.lm import CausalBlock, TransformerLM
from modwire.models.nfm import load_base_weights
from modwire.nn import ModulationSpec, TransformerBlock
from reference import blocks_before as old

f64 = torch.float64
TIGHT = dict(atol=1e-12, rtol=0)


def _same_keys_copy(before, after):
    """The old block's weights into the new one: same state-dict keys, so one load_state_dict."""
    assert list(before.state_dict()) == list(after.state_dict())
    after.load_state_dict(before.state_dict())


def _randomise(module, seed=0):
    """Non-trivial LayerNorm affines and α (their inits are 1 / 0 / 0.1): every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("case", ["nac", "nac_head_dim", "ni_mod", "perceiver_io", "vit"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_processor_layer_configuration_equals_the_old_block(case, return_weights):
    d, u, b, heads = 16, 5, 3, 2
    kw = {"nac": dict(mod=ModulationSpec("nac", 6)),
          "nac_head_dim": dict(mod=ModulationSpec("nac", 6), head_dim=12, qv_bias=False),
          "ni_mod": dict(mod=ModulationSpec("ni", 6), activation="gelu"),
          "perceiver_io": dict(),
          "vit": dict(activation="gelu", qv_bias=False)}[case]
    torch.manual_seed(0)
    before = old.ProcessorLayer(d, heads, 24, **kw).to(f64)
    _randomise(before)
    after = TransformerBlock(d, heads, 24, **kw).to(f64)
    _same_keys_copy(before, after)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, u, d, generator=g, dtype=f64)
    codes = torch.randn(u, 6, generator=g, dtype=f64) if "mod" in kw else None
    # a kernel bias log K̂ per sample (NAC Eq. 3) or a relative bias per head (ViT), and a key mask
    bias = torch.randn(b, 1, u, u, generator=g, dtype=f64) if case != "vit" else \
        torch.randn(heads, u, u, generator=g, dtype=f64)
    key_mask = torch.rand(b, 1, 1, u, generator=g) > 0.3
    for extra in (dict(), dict(bias=bias), dict(bias=bias, key_mask=key_mask)):
        y0, w0 = before(x, codes, return_weights=return_weights, **extra)
        y1, w1 = after(x, codes, return_weights=return_weights, **extra)
        torch.testing.assert_close(y1, y0, **TIGHT)
        assert (w1 is None) == (w0 is None) == (not return_weights)
        if return_weights:
            torch.testing.assert_close(w1, w0, **TIGHT)
    assert (after(x, codes, bias=bias)[0] - after(x, codes)[0]).abs().max() > 1e-3     # the bias matters


AIT_CASES = {"ait": {}, "without_memory": {"workspace": False}, "without_self_attention": {"self_attention": False},
             "without_ffn": {"ffn": False}, "dense_networks": {"self_attention": False, "workspace": False},
             "without_hopfield": {"retrieval": "attention"}}


@pytest.mark.parametrize("case", list(AIT_CASES))
def test_ait_block_equals_the_old_block(case):
    c = modwire.create_model("ait_micro").config.replace(write_dropout=0.0, **AIT_CASES[case])
    torch.manual_seed(0)
    before = old.AiTBlock(c).to(f64)
    _randomise(before)
    after = modwire.models.ait.AiTBlock(c).to(f64)
    _same_keys_copy(before, after)
    g = torch.Generator().manual_seed(2)
    bias = torch.randn(c.num_heads, 16, 16, generator=g, dtype=f64)
    for mode in ("train", "eval", "train"):                     # training forwards write the memory
        before.train(mode == "train"), after.train(mode == "train")
        x = torch.randn(3, 16, c.d_model, generator=g, dtype=f64)
        for record in (False, True):
            y0, w0, r0 = before(x, bias=bias, record=record)
            y1, w1, r1 = after(x, bias=bias, record=record)
            torch.testing.assert_close(y1, y0, **TIGHT)
            for a, e in ((w1, w0), (None if r1 is None else r1.memory, None if r0 is None else r0.memory)):
                assert (a is None) == (e is None)
                if a is not None:
                    torch.testing.assert_close(a, e, **TIGHT)
        for (n, a), (_, e) in zip(after.state_dict().items(), before.state_dict().items()):
            torch.testing.assert_close(a, e, **TIGHT, msg=n)       # the memory buffers too


def _old_causal_into_new(before, after):
    """The old block's weights by module path (its own names), not through the library's key map."""
    with torch.no_grad():
        for new, was in ((after.attn.norm, before.norm1), (after.attn.fn, before.attn),
                         (after.ffn.norm, before.norm2), (after.ffn.fn, before.ffn)):
            for (n, p), (m, q) in zip(new.named_parameters(), was.named_parameters()):
                assert n == m
                p.copy_(q)


@pytest.mark.parametrize("max_len", [0, 12])
def test_causal_block_equals_the_old_block_dropout_off_and_on(max_len):
    torch.manual_seed(0)
    before = old.CausalBlock(16, 2, 24, dropout=0.3, max_len=max_len).to(f64)
    _randomise(before)
    after = CausalBlock(16, 2, 24, dropout=0.3, max_len=max_len).to(f64)
    _old_causal_into_new(before, after)
    x = torch.randn(3, 9, 16, dtype=f64)
    before.eval(), after.eval()
    y = after(x)
    torch.testing.assert_close(y, before(x), **TIGHT)
    before.train(), after.train()                               # dropout on: the same draws in the same order
    torch.manual_seed(5)
    y0 = before(x)
    torch.manual_seed(5)
    y1 = after(x)
    torch.testing.assert_close(y1, y0, **TIGHT)
    assert (y1 - y).abs().max() > 1e-3
    # the attention weights the block returns are the causal ones the old block computed
    _, w = TransformerBlock.forward(after.eval(), x, return_weights=True)
    _, w0 = before.attn(before.norm1(x), key_mask=torch.ones(9, 9, dtype=torch.bool).tril(), return_weights=True)
    torch.testing.assert_close(w, w0, **TIGHT)
    assert (w.triu(1) == 0).all()


def _old_lm_state(model):
    """``model``'s state dict as the LM wrote it before issue 37: each block's weights under the old
    block's own names (``norm1``, ``attn.q``, …), copied through a reference old block."""
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, CausalBlock):
            was = old.CausalBlock(module.attn.norm.normalized_shape[0], module.attn.fn.num_heads,
                                  module.ffn.fn.fc2.in_features, 0.0)
            with torch.no_grad():
                for new, w in ((module.attn.norm, was.norm1), (module.attn.fn, was.attn),
                               (module.ffn.norm, was.norm2), (module.ffn.fn, was.ffn)):
                    w.load_state_dict(new.state_dict())
            state.update({f"{name}.{k}": v for k, v in was.state_dict().items()})
    rest = {k: v for k, v in model.state_dict().items() if ".blocks." not in k}
    return {**rest, **state}


@pytest.mark.parametrize("name,nfm", [("transformer_lm_micro", {}),
                                      ("nfm_transformer_lm_micro", {"share_blocks": False})])
def test_an_old_key_lm_checkpoint_loads_into_the_same_model(name, nfm, tmp_path):
    torch.manual_seed(0)
    cfg = modwire.create_model(name).config
    model = TransformerLM(cfg.replace(nfm=nfm) if nfm else cfg).eval()
    _randomise(model)
    state = _old_lm_state(model)
    assert "body.blocks.0.norm1.weight" in state and "body.blocks.0.attn.q.weight" in state
    assert set(state) != set(model.state_dict())
    x = torch.randint(0, cfg.vocab_size, (2, 7))
    expected = model(x)
    fresh = TransformerLM(model.config).eval()                  # load_state_dict (the blocks' pre-hook)
    fresh.load_state_dict(copy.copy(state))
    torch.testing.assert_close(fresh(x), expected, atol=0, rtol=0)
    model.save_pretrained(tmp_path)                             # from_pretrained
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "manifest.json").unlink()
    torch.testing.assert_close(modwire.from_pretrained(tmp_path).eval()(x), expected, atol=0, rtol=0)
    from modwire.training.checkpoint import load_weights        # the trainer's resume
    fresh = TransformerLM(model.config).eval()
    load_weights(fresh, tmp_path / "model.safetensors")
    torch.testing.assert_close(fresh(x), expected, atol=0, rtol=0)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(state)


def test_an_old_key_base_lm_loads_into_its_nfm_version():
    torch.manual_seed(0)
    base = modwire.create_model("transformer_lm_micro").eval()
    _randomise(base)
    nfm = TransformerLM(modwire.create_model("nfm_transformer_lm_micro").config.replace(
        nfm={"share_blocks": False})).eval()
    missing = load_base_weights(nfm, _old_lm_state(base))
    assert missing and all(".readers." in k for k in missing)
    x = torch.randint(0, 50, (2, 7))
    torch.testing.assert_close(nfm(x), base(x), atol=1e-6, rtol=1e-6)     # γ = 0: the base network


def test_ait_without_memory_loads_vit_weights_and_equals_it():
    """The ViT's and the AiT's blocks are one configuration: same names, same numbers."""
    torch.manual_seed(0)
    ait = AiT(modwire.create_model("ait_micro").config.replace(workspace=False)).eval()
    vit = modwire.models.ViT(modwire.models.ViTConfig(**{k: getattr(ait.config, k) for k in (
        "num_classes", "d_model", "num_layers", "num_heads", "ffn_hidden", "num_cls_tokens", "qv_bias", "tokenizer")}))
    vit.load_state_dict(ait.state_dict())
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(vit.eval()(x), ait(x), atol=0, rtol=0)
