"""Conditional NAC (NAC §2.2 "Conditional Circuit Generator", App. G): per-sample circuit
designs, executed batched."""
import pytest
import torch

import modwire
from modwire.models.nac import ConditionalGenerator, NACConfig


def _model(**overrides):
    torch.manual_seed(0)
    return modwire.create_model("nac_conditional_micro", **overrides)


def _inputs(b=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 5, 8, generator=g), torch.randint(0, 7, (b, 3), generator=g)


def test_generator_follows_app_g_step_by_step():
    """queries → cross-attention to the condition + FFN → self-attention → two parallel FFNs
    (signatures, codes) → initial states = MLP(code), recomputed here from the parts."""
    m = _model().eval()
    gen: ConditionalGenerator = m.generator
    _, c = _inputs()
    circuit = gen(c)
    tokens = gen.tokenizer(c)
    h = gen.queries + gen.cross.attn.fn(gen.cross.attn.norm(gen.queries), gen.cross.attn.norm_context(tokens))[0]
    h = h + gen.cross.ffn.fn(gen.cross.ffn.norm(h))
    h = h + gen.mix.fn(gen.mix.norm(h))[0]
    sig, code = gen.to_signature.fn(gen.to_signature.norm(h)), gen.to_code.fn(gen.to_code.norm(h))
    u = m.config.num_processor_modules
    torch.testing.assert_close(circuit.processors.signatures, sig[:, :u])
    torch.testing.assert_close(circuit.outputs.codes, code[:, u:])
    torch.testing.assert_close(circuit.processors.states, gen.processor_state(code[:, :u]))
    assert circuit.processors.codes.shape == (4, u, m.config.d_code)


def test_each_sample_gets_its_own_link_probabilities():
    m = _model().eval()
    _, c = _inputs()
    c[1] = c[0]
    p = m.link_probs(c)                                         # [B, U, U]
    assert p.shape == (4, 12, 12)
    torch.testing.assert_close(p[0], p[1])                      # same condition, same circuit
    assert (p[0] - p[2]).abs().max() > 1e-4                     # another condition, another circuit
    torch.testing.assert_close(p.diagonal(dim1=1, dim2=2), torch.ones(4, 12))  # d(s, s) = 0


def test_batched_execution_equals_one_sample_at_a_time():
    m = _model().eval()
    x, c = _inputs()
    batched = m(x, condition=c)
    single = torch.cat([m(x[i:i + 1], condition=c[i:i + 1]) for i in range(len(x))])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)


def test_the_condition_changes_the_output_and_gradients_reach_the_generator():
    m = _model()
    x, c = _inputs()
    loss = m(x, condition=c).square().mean()
    loss.backward()
    for name in ("generator.queries", "generator.to_signature.fn.0.weight", "generator.to_code.fn.2.weight",
                 "generator.tokenizer.embed.weight", "generator.cross.attn.fn.k.weight"):
        grad = m.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    m.double().eval()                          # small at initialisation (~1e-5), far above float64 rounding
    c2 = c.clone()
    c2[:, 0] = (c2[:, 0] + 1) % 7
    x = x.double()
    assert (m(x, condition=c) - m(x, condition=c2)).abs().max() > 1e-9


def test_intermediates_are_per_sample():
    m = _model().eval()
    x, c = _inputs()
    inter = m.forward_record(x, condition=c)
    assert inter.link_probs.shape == (4, 12, 12) and inter.readout_link_probs.shape == (4, 3, 12)
    torch.testing.assert_close(inter.link_probs, m.link_probs(c))
    torch.testing.assert_close(inter.logits, m(x, condition=c))


def test_condition_is_required_exactly_when_the_generator_is_conditional():
    x, c = _inputs()
    with pytest.raises(ValueError, match="condition=c"):
        _model()(x)
    with pytest.raises(ValueError, match="unconditional"):
        modwire.create_model("nac_micro")(x, condition=c)


def test_conditional_config_validates_its_generator_and_round_trips():
    cfg = NACConfig().replace(generator={"kind": "conditional", "tokenizer": {"kind": "embedding", "vocab_size": 9}})
    assert NACConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="generator.tokenizer.vocab_size"):
        NACConfig().replace(generator={"kind": "conditional", "tokenizer": {"kind": "embedding", "vocab_size": 0}})
    with pytest.raises(ValueError, match="generator.kind"):
        NACConfig().replace(generator={"kind": "sometimes"})
    with pytest.raises(ValueError, match="frozen_graph"):
        NACConfig().replace(generator={"kind": "conditional", "tokenizer": {"vocab_size": 9}},
                            frozen_graph={"name": "scale_free"})
    # an unconditional NAC does not validate the (unused) condition tokenizer
    assert NACConfig().generator.tokenizer.vocab_size == 0


def test_padding_in_the_condition_is_hidden_from_the_generator():
    """Embedding ids equal to pad_id are masked keys of the cross-attention: appending padding
    does not change the circuit."""
    m = _model(generator={"tokenizer": {"pad_id": 0}}).eval()
    _, c = _inputs()
    c = c.clamp_min(1)
    padded = torch.cat([c, torch.zeros(len(c), 1, dtype=c.dtype)], dim=1)
    torch.testing.assert_close(m.link_probs(c), m.link_probs(padded), atol=1e-6, rtol=1e-6)


def test_a_graph_prior_on_a_conditional_nac_is_a_clear_error():
    from modwire.training import build_model_for_task, load_config

    cfg = load_config(None, ["model.name=nac_conditional_micro", "data.task=sort_of_clevr_conditional",
                             "model.overrides.graph_prior=scale_free"])
    with pytest.raises(ValueError, match="graph_prior.name.*per sample"):
        build_model_for_task(cfg)
    with pytest.raises(ValueError, match="graph_prior.name.*per sample"):
        _model(graph_prior="scale_free")


def test_condition_and_input_of_different_batch_sizes_is_a_clear_error():
    x, c = _inputs()
    with pytest.raises(ValueError, match="same samples"):
        _model()(x, condition=c[:2])
