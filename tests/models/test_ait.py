"""The Associative Transformer model (AiT Figure 1b, §5.1, Table 2 switches, Table 6 presets)."""
import pytest
import torch

import modwire
from modwire.models import AiT, AiTConfig, ViT, ViTConfig, create_model
from modwire.models.ait import ABLATIONS, AUTHORS_AIT
from modwire.nn.workspace import init_memory
from reference.ait import workspace_literal


def micro(**overrides):
    torch.manual_seed(0)
    return AiT(create_model("ait_micro").config.replace(**overrides))


def images(b=4, seed=0):
    return torch.rand(b, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_without_memory_is_exactly_the_vit_with_the_same_weights():
    ait = micro(workspace=False).eval()
    c = ait.config
    vit = ViT(ViTConfig(**{k: getattr(c, k) for k in ViTConfig.field_names()})).eval()
    vit.load_state_dict(ait.state_dict())                      # same parameter names
    x = images()
    torch.testing.assert_close(ait(x), vit(x), rtol=0, atol=0)


def test_training_forward_writes_the_memory_and_reports_the_balance_loss_evaluation_does_neither():
    model = micro().train()
    before = [s.memory.clone() for s in model.workspaces]
    model(images())
    aux = model.auxiliary_losses()
    assert set(aux) == {"balance"}
    torch.testing.assert_close(aux["balance"], sum(s.balance for s in model.workspaces))
    assert aux["balance"].requires_grad and aux["balance"] > 0
    after = [s.memory.clone() for s in model.workspaces]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))
    torch.testing.assert_close(after[0].norm(dim=-1), torch.ones(8))  # Eq. 4 normalises each slot
    model.eval()
    model(images(seed=1))
    assert model.auxiliary_losses() == {}
    assert all(torch.equal(a, s.memory) for a, s in zip(after, model.workspaces))


def test_predictions_depend_on_the_batch_exactly_as_documented():
    x, other = images(4), images(4, seed=5)
    mixed = torch.cat([x[:2], other[2:]])
    squashed = micro().eval()                                  # the paper's pool: the batch matters
    assert not torch.allclose(squashed(x)[:2], squashed(mixed)[:2])
    per_sample = micro(pool="sample").eval()
    torch.testing.assert_close(per_sample(x)[:2], per_sample(mixed)[:2], rtol=0, atol=1e-6)
    frozen = per_sample(x)
    per_sample.set_memory_forward(False)                       # per-sample pools without the memory forward
    assert not torch.allclose(per_sample(x), frozen)
    torch.testing.assert_close(per_sample(x)[:2], per_sample(mixed)[:2], rtol=0, atol=1e-6)
    squashed.set_memory_forward(False)                         # Figure 8 (2): frozen memory only
    torch.testing.assert_close(squashed(x)[:2], squashed(mixed)[:2], rtol=0, atol=1e-6)
    assert squashed.config.eval_memory_forward is False


def test_memory_survives_save_and_load_bit_exactly(tmp_path):
    model = micro().train()
    for seed in range(3):
        model(images(seed=seed))
    model.save_pretrained(tmp_path)
    loaded = AiT.from_pretrained(tmp_path)
    for a, b in zip(model.workspaces, loaded.workspaces):
        assert torch.equal(a.memory, b.memory)
    model.eval(), loaded.eval()
    assert torch.equal(model(images(seed=7)), loaded(images(seed=7)))


def test_reset_memory_redraws_from_the_generator_only_when_configured():
    model = micro(memory_reset="epoch")
    model.start_epoch(3, torch.Generator().manual_seed(11))
    g = torch.Generator().manual_seed(11)
    for s in model.workspaces:
        assert torch.equal(s.memory, init_memory("gaussian", 8, 8, g))
    kept = micro()
    before = kept.workspaces[0].memory.clone()
    kept.start_epoch(3, torch.Generator().manual_seed(11))
    assert torch.equal(kept.workspaces[0].memory, before)


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_every_table2_ablation_builds_trains_and_has_what_it_says(name):
    model = micro(**ABLATIONS[name]).train()
    out = model(images())
    out.sum().backward()
    blocks = model.blocks
    c = model.config
    assert all((b.attn is None) == (not c.self_attention) for b in blocks)
    assert all((b.ffn is None) == (not c.ffn) for b in blocks)
    assert all((b.workspace is None) == (not c.workspace) for b in blocks)
    if name == "without_hopfield":
        assert all(b.workspace.retrieve is not None for b in blocks)
    if name == "without_bottleneck":                           # dense: every slot reads every position
        rec = model.forward_record(images()).workspace[0]
        assert (rec.weights > 0).all()
    assert set(model.auxiliary_losses()) == ({"balance"} if c.workspace else set())


def test_intermediates_hold_one_workspace_record_per_layer():
    model = micro().eval()
    it = model.forward_record(images(3))
    assert len(it.workspace) == 2 and len(it.propagator_attention) == 2
    rec = it.workspace[0]
    assert rec.weights.shape == (1, 2, 8, 3 * 16) and rec.num_tokens == 16
    assert ((rec.weights > 0).sum(-1) == 6).all()               # bottleneck_size 6 per slot and head
    assert (rec.energy_after <= rec.energy_before + 1e-5).all()


def test_paper_presets_and_parameter_counts():
    """Table 6 sizes; the Table 1 presets have exactly the parameters the authors' model trains
    (15,673,322 / 45,761,770 / 90,894,442: their printed totals, Table 1's 15.8 / 45.9 / 91.0 M, less
    109,056 never used and the frozen memory; tests/models/test_ait_authors.py): their patch
    embedding, no query/value biases, Eq. 3's workspace (heads of width D, no biases), the flattened
    classifier. The difference to the ViT of the same table is the workspace layers alone."""
    counts = {}
    for size, layers in (("small", 2), ("medium", 6), ("base", 12)):
        with torch.device("meta"):
            ait, vit = create_model(f"ait_{size}"), create_model(f"vit_{size}_cifar10")
        c = ait.config
        assert (c.num_layers, c.d_model, c.num_heads, c.ffn_hidden) == (layers, 768, 12, 3072)
        assert (c.bottleneck_bias, c.bottleneck_head_split, c.classifier, c.qv_bias) == (False, False, "flatten", False)
        assert (c.tokenizer.patch_norm, c.tokenizer.positions) == (True, "none")
        e, d, a = 768, 32, 8
        per_layer = 2 * e * a * d + 2 * a * d * d + (d * e + e) + 2 * e + 2 * d
        assert ait.num_parameters() - vit.num_parameters() == layers * per_layer
        counts[size] = ait.num_parameters()
    assert counts == {"small": 15_673_322, "medium": 45_761_770, "base": 90_894_442}
    assert {k: v / 1e6 for k, v in counts.items()} == pytest.approx({"small": 15.8, "medium": 45.9, "base": 91.0},
                                                                    rel=0.01)   # Table 1
    for name, slots, k, patch in (("ait_small_pet", 128, 512, 16), ("ait_small_triangle", 32, 64, 32),
                                  ("ait_small_cifar100", 32, 512, 4)):
        c = modwire.get_config(name)
        assert (c.num_slots, c.bottleneck_size, c.tokenizer.patch_size, c.slot_dim, c.workspace_heads) == \
            (slots, k, patch, 32, 8)


def test_former_workspace_and_pooled_classifier_are_options():
    """bottleneck_head_split + bottleneck_bias + classifier="mean" (modwire's workspace before issue 23,
    on today's block: 14,376,170); each option changes only what it names."""
    with torch.device("meta"):
        old = create_model("ait_small", bottleneck_head_split=True, bottleneck_bias=True, classifier="mean")
    assert old.num_parameters() == 14_376_170
    ws = old.workspaces[0]
    assert ws.head_dim == 4 and ws.q.weight.shape == (32, 32) and ws.k.bias.shape == (32,)


def test_block_is_the_authors_wiring_and_the_workspace_reads_the_ffn_output():
    """``x ← x + Attn(LN x)``, ``Ξ = LN(FFN(LN x))``, ``x ← x + Ξ + Ξ̂`` (the workspace layer against
    tests/reference/ait.py, evaluation); W/O FF: ``Ξ = LN(x)``; W/O SA: the attention left out."""
    x = torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for overrides in ({}, {"ffn": False}, {"self_attention": False}):
        block = micro(**overrides).double().eval().blocks[0]
        ws = block.workspace
        y, _, rec = block(x, record=True)
        x1 = x if block.attn is None else x + block.attn.fn(block.attn.norm(x))[0]
        h = x1 if block.ffn is None else block.ffn.fn(block.ffn.norm(x1))
        out, memory = workspace_literal(h, ws, ws.memory, 6, "batch")
        torch.testing.assert_close(y, x1 + out)
        torch.testing.assert_close(rec.memory, memory)
        if block.ffn is not None:
            assert not block.ffn.residual                          # FFN(LN x) is Ξ's input, not added to x
    assert micro(workspace=False).blocks[0].ffn.residual           # the ViT's x + FFN(LN x)


def test_authors_overrides_are_their_write_top_k_and_detached_write():
    assert AUTHORS_AIT == {"write_residual": True, "bottleneck_softmax": "kept", "write_grad": False}
    c = modwire.get_config("ait_small")
    assert (c.write_residual, c.bottleneck_softmax, c.write_grad, c.write_dropout) == (False, "all", True, 0.1)
    s = micro(**AUTHORS_AIT).workspaces[0]
    assert (s.write_residual, s.bottleneck_softmax, s.write_grad, s.write_dropout.p) == (True, "kept", False, 0.1)
    with pytest.raises(ValueError, match="write_dropout"):
        AiTConfig(write_dropout=1.0)


def test_flatten_classifier_is_layernorm_over_the_flattened_tokens_then_linear():
    model = micro(classifier="flatten").eval()
    assert isinstance(model.norm, torch.nn.Identity) and model.heads.linear.in_features == 16 * 32
    it = model.forward_record(images())
    head = model.heads
    flat = it.states.flatten(1)                                     # [B, N·E]
    expected = torch.nn.functional.layer_norm(flat, flat.shape[1:], head.norm.weight, head.norm.bias) \
        @ head.linear.weight.T + head.linear.bias
    torch.testing.assert_close(it.logits, expected)
    model.new_task(3)                                               # fine-tuning: a fresh classifier
    assert model(images()).shape == (4, 3) and model.config.num_classes == 3
    with pytest.raises(ValueError, match="classifier"):
        model.new_task(3, heads=2)
    with pytest.raises(ValueError, match="classifier"):
        micro(classifier="flatten", num_cls_tokens=1)
    with pytest.raises(ValueError, match="classifier"):
        AiTConfig(classifier="cls")


def test_parameter_sets_name_the_workspace_for_finetuning():
    model = micro()
    prefixes = model.parameter_sets()["workspace"]
    names = [n for n, _ in model.named_parameters() if n.startswith(prefixes)]
    assert names and all(".workspace." in n for n in names)
    assert len(names) == sum(len(list(s.parameters())) for s in model.workspaces)


def test_workspace_options_reach_every_workspace():
    from modwire.models.ait import NO_COLLAPSE

    model = micro(**NO_COLLAPSE, write_residual=True, bottleneck_bias=True, bottleneck_head_split=True)
    assert all(s.bottleneck_softmax == "kept" and s.normalize_update and s.write_residual and s.head_split
               and s.o.bias is not None for s in model.workspaces)
    assert all(not s.write_residual and s.o.bias is None and not s.head_split for s in micro().workspaces)
    rec = model.eval().forward_record(images()).workspace[0]
    torch.testing.assert_close(rec.weights.sum(-1), torch.ones(1, 2, 8))     # renormalised over the kept


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="pool"):
        AiTConfig(pool="all")
    with pytest.raises(ValueError, match="workspace_heads"):
        AiTConfig(slot_dim=32, workspace_heads=5, bottleneck_head_split=True)
    AiTConfig(slot_dim=32, workspace_heads=5)                      # heads of width D need no divisor
    with pytest.raises(ValueError, match="memory_alpha"):
        AiTConfig(memory_alpha=1.0)
    with pytest.raises(ValueError, match="bottleneck_softmax"):
        AiTConfig(bottleneck_softmax="none")
    with pytest.raises(ValueError, match="at least one"):
        AiTConfig(self_attention=False, ffn=False, workspace=False)
