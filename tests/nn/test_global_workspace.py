"""The global workspace layer (AiT §4) against the literal equations of tests/reference/ait.py,
and its train / eval semantics (§4.2, Figure 8)."""
import math

import pytest
import torch

from modwire.nn.attention import attend
from modwire.nn.workspace import GlobalWorkspace, balance_loss, hopfield_energy, init_memory
from reference.ait import (balance_literal, bottleneck_literal, energy_literal, hopfield_literal,
                           memory_update_literal, workspace_literal)
from reference.attention import attend_literal


def workspace(**kw):
    """A small workspace in float64, the write's Dropout off (the literal restatements have none)."""
    torch.manual_seed(0)
    args = dict(num_slots=5, slot_dim=8, num_heads=2, bottleneck_size=4, steps=1, write_dropout=0.0)
    args.update(kw)
    ws = GlobalWorkspace(12, **args).double()
    with torch.no_grad():                      # non-trivial LayerNorm affine parameters
        for norm in (ws.norm, ws.write_norm):
            norm.weight.add_(0.3 * torch.randn_like(norm.weight))
            norm.bias.add_(0.1 * torch.randn_like(norm.bias))
    return ws


def tokens(b=3, n=4, seed=1):
    return torch.randn(b, n, 12, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_attend_topk_softmax_all_is_aiT_eq3_top_k_of_the_full_softmax():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (5, 9, 9))
    out, w = attend(q, k, v, topk=3, topk_softmax="all", return_weights=True)
    full = torch.softmax(q @ k.transpose(-1, -2) / 2, dim=-1)
    keep = torch.zeros_like(full, dtype=torch.bool).scatter_(-1, full.topk(3, dim=-1).indices, True)
    torch.testing.assert_close(w, full * keep)
    torch.testing.assert_close(out, (full * keep) @ v)
    assert (w.sum(-1) < 1).all()                                   # not renormalised
    _, kept = attend(q, k, v, topk=3, return_weights=True)        # the default renormalises (NFM Alg. 1)
    torch.testing.assert_close(kept.sum(-1), torch.ones_like(kept.sum(-1)))
    ref, _ = attend_literal(q, k, v, topk=3)
    torch.testing.assert_close(attend(q, k, v, topk=3)[0], ref)
    with pytest.raises(ValueError, match="topk_softmax"):
        attend(q, k, v, topk=3, topk_softmax="some")


def test_projections_are_eq3s_by_default_no_biases_and_heads_of_width_d():
    """AiT Eq. 1-3 (and the authors' code): W^Q_i, W^K_i, W^V_i map to the slot width D for each
    of the A heads, W^O maps A·D back to D, none has a bias; the scale is 1/√D. The write's
    LayerNorm has the authors' eps 1e-6, its Dropout their 0.1; Eq. 3's write (no residual)."""
    ws = GlobalWorkspace(12, num_slots=5, slot_dim=8, num_heads=2)
    assert (ws.write_norm.eps, ws.write_dropout.p, ws.write_residual, ws.bottleneck_softmax, ws.write_grad) == \
        (1e-6, 0.1, False, "all", True)
    ws = workspace()
    e, d, a = 12, 8, 2
    assert (ws.head_dim, ws.head_split, ws.q.bias, ws.k.bias, ws.v.bias, ws.o.bias) == (d, False, None, None, None, None)
    assert ws.q.weight.shape == (a * d, d) and ws.k.weight.shape == ws.v.weight.shape == (a * d, e)
    assert ws.o.weight.shape == (d, a * d)
    split = workspace(head_split=True, bias=True)                  # the option: A heads of width D/A, biases
    assert split.head_dim == d // a and split.q.weight.shape == (d, d) and split.o.bias.shape == (d,)


@pytest.mark.parametrize("k", [4, None])
def test_bottleneck_attention_and_memory_update_equal_eq3_eq4_literally(k):
    ws = workspace(bottleneck_size=k or 0)                         # Eq. 3 as printed (the default)
    pool = tokens(1, 7)[0]
    gamma = ws.memory.clone()
    gamma_hat, w = ws.write(pool.unsqueeze(0), gamma, need_weights=True)
    ref_hat, ref_w = bottleneck_literal(gamma, pool, ws, k)
    torch.testing.assert_close(gamma_hat[0], ref_hat)
    torch.testing.assert_close(w[0], ref_w)
    torch.testing.assert_close(ws.update(gamma, gamma_hat)[0], memory_update_literal(gamma, ref_hat, 0.9))
    if k is not None:
        assert ((w[0] > 0).sum(-1) == k).all()                    # each slot selects exactly k patches


@pytest.mark.parametrize("options", [dict(write_residual=True), dict(bias=True), dict(head_split=True),
                                     dict(bias=True, head_split=True, write_residual=False)])
def test_workspace_options_equal_their_literal_restatement(options):
    """``write_residual`` (the authors' LN(γ + Concat(heads) W^O)), ``bias`` and ``head_split``
    (heads of width D/A, scale 1/√(D/A)) against tests/reference/ait.py."""
    ws = workspace(**options)
    pool = tokens(1, 7)[0]
    gamma = ws.memory.clone()
    gamma_hat, w = ws.write(pool.unsqueeze(0), gamma, need_weights=True)
    ref_hat, ref_w = bottleneck_literal(gamma, pool, ws, 4, residual=ws.write_residual, head_split=ws.head_split)
    torch.testing.assert_close(w[0], ref_w)
    torch.testing.assert_close(gamma_hat[0], ref_hat)
    if ws.write_residual:                                           # the residual changes γ̂
        assert not torch.allclose(gamma_hat[0], bottleneck_literal(gamma, pool, ws, 4)[0])


def mean_slot_cosine(memory):
    g = torch.nn.functional.normalize(memory, dim=-1)
    m = len(g)
    return float(((g @ g.T).sum() - m) / (m * m - m))


@pytest.mark.parametrize("bias", [False, True])
def test_biases_collapse_the_memory_of_a_frozen_workspace(bias):
    """The effect stated for ``bias`` (modwire.nn.workspace): with frozen random weights and
    random pools, 40 writes keep the slots apart without biases and make them one vector with
    biases on W^Q, W^K, W^V, W^O (as printed, without the residual write)."""
    torch.manual_seed(0)
    ws = GlobalWorkspace(32, num_slots=16, slot_dim=16, num_heads=4, bottleneck_size=32, bias=bias,
                         write_dropout=0.0).train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(40):
            ws(torch.randn(8, 16, 32, generator=g))
    cosine = mean_slot_cosine(ws.memory)
    assert cosine > 0.99 if bias else cosine < 0.5


def test_collapse_options_renormalise_the_kept_weights_and_unit_scale_the_update():
    """bottleneck_softmax="kept" and normalize_update=True (modwire.nn.workspace, "Memory collapse")."""
    ws = workspace(bottleneck_softmax="kept", normalize_update=True)
    pool = tokens(1, 7)[0]
    gamma = ws.memory.clone()
    gamma_hat, w = ws.write(pool.unsqueeze(0), gamma, need_weights=True)
    ref_hat, ref_w = bottleneck_literal(gamma, pool, ws, 4, renormalise=True)
    torch.testing.assert_close(w[0], ref_w)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    torch.testing.assert_close(gamma_hat[0], ref_hat)
    new = ws.update(gamma, gamma_hat)[0]
    torch.testing.assert_close(new, memory_update_literal(gamma, ref_hat, 0.9, unit_update=True))
    assert not torch.allclose(new, memory_update_literal(gamma, ref_hat, 0.9))
    with pytest.raises(ValueError, match="bottleneck_softmax"):
        GlobalWorkspace(12, bottleneck_softmax="some")


@pytest.mark.parametrize("pool", ["batch", "sample"])
@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("residual", [True, False])
def test_training_forward_and_gradients_equal_the_literal_layer(pool, steps, residual):
    """``h → Ξ + Ξ̂`` with ``Ξ = LN(h)`` (§4.3's skip connection), the memory it keeps, and the
    gradients of the input and of every parameter, against tests/reference/ait.py."""
    ws = workspace(pool=pool, steps=steps, write_residual=residual).train()
    x = tokens().requires_grad_()
    gamma = ws.memory.clone()
    y, _ = ws(x)
    x_ref = x.detach().clone().requires_grad_()
    y_ref, memories = workspace_literal(x_ref, ws, gamma, 4, pool)
    torch.testing.assert_close(y, y_ref)
    # the buffer keeps γ^{t+1} (per-sample pools: Eq. 4 with the pools' mean γ̂)
    if pool == "batch":
        torch.testing.assert_close(ws.memory, memories[0])
    g = torch.randn_like(y)
    grads = torch.autograd.grad((y * g).sum(), [x, *ws.parameters()])
    grads_ref = torch.autograd.grad((y_ref * g).sum(), [x_ref, *ws.parameters()])
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


def test_per_sample_pool_memory_update_is_eq4_with_the_mean_update():
    ws = workspace(pool="sample").train()
    x = tokens()
    gamma = ws.memory.clone()
    ws(x)
    hats = torch.stack([bottleneck_literal(gamma, x_b, ws, 4)[0] for x_b in ws.norm(x)])
    torch.testing.assert_close(ws.memory, memory_update_literal(gamma, hats.mean(0), 0.9))


def test_balance_loss_equals_eq5_eq6_and_is_zero_for_balanced_selection():
    g = torch.Generator().manual_seed(0)
    w = torch.rand(3, 4, 6, generator=g, dtype=torch.float64) * (torch.rand(3, 4, 6, generator=g) > 0.5)
    torch.testing.assert_close(balance_loss(w.unsqueeze(0)), balance_literal(w, 1e-10))
    # 4 slots, 8 positions, each slot selects 2 positions with equal weight, each position once
    balanced = torch.zeros(2, 4, 8, dtype=torch.float64)
    for j in range(4):
        balanced[:, j, 2 * j: 2 * j + 2] = 0.5
    assert balance_loss(balanced.unsqueeze(0)).item() == 0.0
    skewed = balanced.clone()
    skewed[:, :, 0] += 0.1                                         # every slot also selects position 0
    assert balance_loss(skewed.unsqueeze(0)).item() > 0.1
    one = torch.ones(1, 2, 4, 1, dtype=torch.float64)                # one position: no variance (the authors' 0)
    assert balance_loss(one).item() == 0.0
    half = w.unsqueeze(0).to(torch.bfloat16)                        # computed in float32 under low precision
    assert balance_loss(half).dtype == torch.float32
    torch.testing.assert_close(balance_loss(half), balance_literal(w.to(torch.bfloat16).double(), 1e-10).float())


def test_hopfield_retrieval_and_energy_equal_eq7_eq8_and_the_step_lowers_the_energy():
    g = torch.Generator().manual_seed(0)
    xi, patterns = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(4, 5, generator=g, dtype=torch.float64)
    energies = hopfield_energy(xi, patterns, 1.5)
    for s in range(6):
        torch.testing.assert_close(energies[s], energy_literal(xi[s], patterns, 1.5))
    ws = workspace()
    out, before, after = ws.read(xi.unsqueeze(0), patterns.unsqueeze(0), energies=True)
    for s in range(6):
        torch.testing.assert_close(out[0, s], hopfield_literal(xi[s], patterns, 1.0))
    assert (after <= before + 1e-12).all()                         # the update rule never raises E (CCCP)
    assert (after < before).float().mean() > 0.5


def test_evaluation_never_changes_the_memory_and_with_memory_forward_uses_the_batch_write():
    ws = workspace().eval()
    stored = ws.memory.clone()
    x = tokens()
    y, rec = ws(x, record=True)
    assert torch.equal(ws.memory, stored)                          # frozen at test time (§4.2)
    y_ref, memories = workspace_literal(x, ws, stored, 4, "batch")  # ... but γ^{t+1} is computed for retrieval
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(rec.memory, memories)
    assert ws.balance is None


def test_squashed_pool_evaluation_depends_on_the_batch_only_through_the_written_memory():
    """§4.2 / Figure 8 (1), documented in modwire.models.ait: sample 0's output in a batch equals
    its output alone with the memory replaced by the γ^{t+1} written from that batch."""
    ws = workspace().eval()
    x = tokens()
    y_batch, rec = ws(x, record=True)
    other = torch.cat([x[:1], tokens(2, 4, seed=9)])
    assert not torch.allclose(ws(other)[0][0], y_batch[0])        # other samples change sample 0's output
    ws.memory_forward = False
    stored = ws.memory.clone()
    ws.memory.copy_(rec.memory[0])
    torch.testing.assert_close(ws(x[:1])[0][0], y_batch[0])
    ws.memory.copy_(stored)
    # without the memory forward (Figure 8 (2)) the output is a function of the sample alone
    torch.testing.assert_close(ws(x)[0][:1], ws(x[:1])[0])


def test_per_sample_pool_makes_each_output_independent_of_the_batch():
    ws = workspace(pool="sample").eval()
    x = tokens()
    torch.testing.assert_close(ws(x)[0][1:2], ws(x[1:2])[0])


def test_write_dropout_acts_on_concat_heads_w_o_in_training_only():
    """The authors' Dropout on ``Concat(heads) W^O`` (``write_dropout``): each entry zeroed or scaled
    by 1/(1-p) in a training forward, untouched in evaluation (where the memory is frozen anyway)."""
    ws = workspace(write_dropout=0.5, write_residual=True)
    seen = []
    ws.write_dropout.register_forward_hook(lambda mod, args, out: seen.append((args[0], out)))
    torch.manual_seed(1)
    ws.train()(tokens())
    (before, after), = seen
    dropped = after == 0
    assert 0 < dropped.float().mean() < 1
    torch.testing.assert_close(after[~dropped], 2 * before[~dropped])
    seen.clear()
    ws.eval()(tokens())
    assert torch.equal(seen[0][0], seen[0][1])


def test_gradient_reaches_the_write_projections_unless_the_write_is_detached():
    for write_grad in (True, False):
        ws = workspace(write_grad=write_grad).train()
        y, _ = ws(tokens())
        wanted = [p for p in (ws.v.weight, ws.o.weight, ws.q.weight) if p.requires_grad]
        task = torch.autograd.grad(y.square().sum(), wanted, allow_unused=True)
        if write_grad:
            assert all(g is not None and g.abs().sum() > 0 for g in task)
        else:                                                       # the authors' code: W^V, W^O never train
            frozen = [*ws.v.parameters(), *ws.o.parameters(), *ws.write_norm.parameters()]
            assert all(g is None for g in task) and not any(p.requires_grad for p in frozen)   # (built frozen)
            assert torch.autograd.grad(ws.balance, ws.q.weight)[0].abs().sum() > 0   # W^Q only from the balance loss


def test_retrieval_attention_is_the_without_hopfield_ablation():
    ws = workspace(retrieval="attention", retrieval_heads=3).eval()
    assert ws.retrieve.q.bias is None and ws.retrieve.v.bias is None          # built as the AiT's self-attention
    assert workspace(retrieval="attention", retrieval_heads=3, qv_bias=True).retrieve.q.bias is not None
    x = tokens()
    xi = ws.norm(x)
    patterns = ws.up(ws.update(ws.memory, ws.write(xi.reshape(1, -1, 12), ws.memory, need_weights=False)[0]))
    expected, _ = ws.retrieve(xi, patterns.expand(3, -1, -1))
    torch.testing.assert_close(ws(x)[0], xi + expected)                        # Ξ + MHA(Ξ, f_LT(γ))


def test_memory_initialisations_of_table3():
    g = torch.Generator().manual_seed(0)
    assert torch.equal(init_memory("identity", 4, 6), torch.eye(4, 6))
    u = init_memory("uniform", 32, 32, g)
    bound = 1 / math.sqrt(64)
    assert u.abs().max() <= bound and u.abs().max() > 0.9 * bound and abs(u.mean()) < 0.01
    s = init_memory("sinusoidal", 10, 8)
    assert s[3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / 8)), abs=1e-6)
    assert s[3, 5] == pytest.approx(math.cos(3 / 10000 ** (4 / 8)), abs=1e-6)
    n = init_memory("gaussian", 200, 50, g)
    assert abs(n.mean()) < 0.02 and abs(n.std() - 1) < 0.02
    with pytest.raises(ValueError, match="memory_init"):
        init_memory("zeros", 4, 4)


def test_bad_arguments_are_named():
    ws = workspace()
    with pytest.raises(ValueError, match=r"expected float tokens \[B, N, 12\], got torch.float64 \[3, 4, 5\]"):
        ws(torch.zeros(3, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"got torch.int64 \[3, 4, 12\]"):
        ws(torch.zeros(3, 4, 12, dtype=torch.long))
    with pytest.raises(ValueError, match="slot_dim"):
        GlobalWorkspace(12, slot_dim=10, num_heads=4, head_split=True)
    GlobalWorkspace(12, slot_dim=10, num_heads=4)                 # heads of width D need no divisor
    with pytest.raises(ValueError, match="pool"):
        GlobalWorkspace(12, pool="everything")
