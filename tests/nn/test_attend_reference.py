"""``modwire.nn.attend`` against its literal, loop-by-loop definition (tests/reference/attention.py).

Equations: NAC Eq. 3 (scores ``scale·q_i·k_j + bias_ij`` with ``bias = log K̂``); NFM Algorithm 1
(top-k softmax) and NFM "Default Computation" (a zero key/value prepended: the null slot);
AiT Eq. 3 (``top-k(A)``); NI Eq. 7-10 (``C_ui`` scaling each query's output: row_scale).

Only the public signature is used:
``attend(q, k, v, *, bias, key_mask, row_scale, topk, null_kv, scale, return_weights)``.
"""
import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import modwire.nn
from reference.attention import attend_literal, null_weight

N_Q, N_K, D_K, D_V = 4, 5, 3, 2  # Nq ≠ Nk, dk ≠ dv
LEADS = [(2, 3), (2, 2, 3)]      # e.g. [B, H] and [B, U, H]
F64_TOL = dict(rtol=0, atol=1e-10)
F64_GRAD_TOL = dict(rtol=0, atol=1e-8)
F32_TOL = dict(rtol=1e-6, atol=1e-6)  # 1e-6, absolute on O(1) values and relative on the
#                                        few larger gradient sums (1 fp32 ulp at 8 is 9.5e-7)


def attend(*args, **kwargs):
    """The library's kernel, looked up at call time (each test fails on its own where it is missing)."""
    return modwire.nn.attend(*args, **kwargs)


def _inputs(lead, dtype=torch.float64, seed=0):
    """Random q, k, v, bias, key_mask, row_scale for leading axes ``lead`` (continuous values:
    no ties in top-k). The key mask has a row with no allowed key and a row with exactly one."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    key_mask = torch.rand(*lead, N_Q, N_K, generator=g) < 0.6
    first = (0,) * len(lead)
    key_mask[first + (1,)] = False         # query row 1 of the first leading index: no key at all
    key_mask[first + (2,)] = False
    key_mask[first + (2, 3)] = True        # query row 2: exactly one allowed key
    return dict(q=randn(*lead, N_Q, D_K), k=randn(*lead, N_K, D_K), v=randn(*lead, N_K, D_V),
                bias=randn(*lead, N_Q, N_K), key_mask=key_mask,
                row_scale=(torch.rand(*lead, N_Q, generator=g, dtype=torch.float64) + 0.25).to(dtype))


def _shared(t, lead):
    """The first leading slice of ``t``, kept broadcastable: ``[1, ..., 1, *t.shape[-2:]]``."""
    return t[(0,) * len(lead)].reshape((1,) * len(lead) + tuple(t.shape[len(lead):]))


# name → which options (each option alone, broadcast forms, and combinations)
CASES = {
    "plain": {},
    "bias": {"bias": "full"},
    "bias_shared": {"bias": "shared"},                 # [1.., Nq, Nk]: one log K̂ for all heads
    "scale": {"scale": 0.7},
    "key_mask": {"key_mask": "full"},
    "key_padding": {"key_mask": "keys"},               # [..., 1, Nk]
    "topk1": {"topk": 1},
    "topk2": {"topk": 2},
    "null_kv": {"null_kv": True},
    "row_scale": {"row_scale": "full"},
    "row_scale_shared": {"row_scale": "shared"},       # [1.., Nq]
    "row_scale_float": {"row_scale": 0.7},
    "bias+key_mask": {"bias": "full", "key_mask": "full"},
    "key_mask+topk2": {"key_mask": "full", "topk": 2},
    "null_kv+topk2": {"null_kv": True, "topk": 2},
    "null_kv+key_mask": {"null_kv": True, "key_mask": "full"},
    "bias+topk3+row_scale": {"bias": "full", "topk": 3, "row_scale": "full"},
    "all": {"bias": "full", "key_mask": "full", "topk": 2, "null_kv": True, "row_scale": "full",
            "scale": 0.9},
    "all_broadcast": {"bias": "shared", "key_mask": "keys", "topk": 3, "null_kv": True,
                      "row_scale": "shared"},
}


def _case_kwargs(case, lead, dtype=torch.float64, seed=0):
    """Leaf tensors (float ones requiring grad) and options for ``attend(q, k, v, **rest)``."""
    x = _inputs(lead, dtype, seed)
    spec = CASES[case]
    kw = {"q": x["q"], "k": x["k"], "v": x["v"]}
    if "bias" in spec:
        kw["bias"] = x["bias"] if spec["bias"] == "full" else _shared(x["bias"], lead)
    if "key_mask" in spec:
        kw["key_mask"] = x["key_mask"] if spec["key_mask"] == "full" else x["key_mask"][..., :1, :]
    if "row_scale" in spec:
        rs = spec["row_scale"]
        kw["row_scale"] = rs if isinstance(rs, float) else (
            x["row_scale"] if rs == "full" else x["row_scale"][(0,) * len(lead)].reshape(
                (1,) * len(lead) + (N_Q,)))
    for opt in ("topk", "null_kv", "scale"):
        if opt in spec:
            kw[opt] = spec[opt]
    for name, t in kw.items():
        if torch.is_tensor(t):
            kw[name] = t.detach().clone().requires_grad_(t.is_floating_point())
    return kw


def _clone(kw):
    return {n: (t.detach().clone().requires_grad_(t.requires_grad) if torch.is_tensor(t) else t)
            for n, t in kw.items()}


def _run(fn, kw, **extra):
    rest = {n: t for n, t in kw.items() if n not in ("q", "k", "v")}
    return fn(kw["q"], kw["k"], kw["v"], **rest, **extra)


def _grads(kw, out, seed=1):
    g = torch.Generator().manual_seed(seed)
    cot = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    leaves = {n: t for n, t in kw.items() if torch.is_tensor(t) and t.requires_grad}
    grads = torch.autograd.grad((out * cot).sum(), list(leaves.values()), allow_unused=True)
    return {n: (torch.zeros_like(leaves[n]) if gr is None else gr) for n, gr in zip(leaves, grads)}


def _compare(case, lead, dtype, tol, grad_tol):
    kw = _case_kwargs(case, lead, dtype)
    kw_lit = _clone(kw)
    out, w = _run(attend, kw, return_weights=True)
    out_l, w_l = _run(attend_literal, kw_lit)
    assert out.shape == (*lead, N_Q, D_V) and w.shape == (*lead, N_Q, N_K)
    assert out.dtype == dtype and w.dtype == dtype
    torch.testing.assert_close(out, out_l, **tol)
    torch.testing.assert_close(w, w_l, **tol)
    torch.testing.assert_close(out, w @ kw["v"], **tol)  # out = weights @ v always (null value is 0)
    g, g_l = _grads(kw, out), _grads(kw_lit, out_l)
    assert set(g) == set(g_l)
    for name in g:
        assert torch.isfinite(g[name]).all(), name
        torch.testing.assert_close(g[name], g_l[name], **grad_tol, msg=lambda m: f"d/d{name}: {m}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("lead", LEADS, ids=str)
def test_attend_matches_literal_float64_values_and_gradients(lead, case):
    """NAC Eq. 3 / NFM Alg. 1 + Default Computation / AiT Eq. 3 / NI Eq. 7-10, alone and combined:
    out and weights to 1e-10, d/dq, d/dk, d/dv, d/dbias (and d/drow_scale) to 1e-8."""
    _compare(case, lead, torch.float64, F64_TOL, F64_GRAD_TOL)


@pytest.mark.parametrize("case", ["plain", "bias", "key_mask+topk2", "null_kv+topk2", "row_scale",
                                  "all", "all_broadcast"])
@pytest.mark.parametrize("lead", LEADS, ids=str)
def test_attend_matches_literal_float32(lead, case):
    """The issue's acceptance: fp32 values and gradients match the literal loop to 1e-6."""
    _compare(case, lead, torch.float32, F32_TOL, F32_TOL)


class ToySetModel(nn.Module):
    """A linear projection gives per-head q, k, v and a gate C_ui ∈ (0, 1) (NI Eq. 9's row scale)
    from an input set; attention with top-k + null slot + row scale; a linear read-out, pooled."""

    def __init__(self, attend_fn, d_in=6, heads=2, d_k=4, d_v=3, n_out=3, topk=2):
        super().__init__()
        self.attend_fn, self.heads, self.d_k, self.d_v, self.topk = attend_fn, heads, d_k, d_v, topk
        self.qkv = nn.Linear(d_in, heads * (2 * d_k + d_v))
        self.gate = nn.Linear(d_in, heads)
        self.readout = nn.Linear(heads * d_v, n_out)

    def forward(self, x, key_mask):
        b, n, _ = x.shape
        h = self.qkv(x).view(b, n, self.heads, 2 * self.d_k + self.d_v).transpose(1, 2)
        q, k, v = h.split([self.d_k, self.d_k, self.d_v], dim=-1)  # [B, H, N, *]
        row_scale = torch.sigmoid(self.gate(x)).transpose(1, 2)    # [B, H, N]
        out, _ = self.attend_fn(q, k, v, key_mask=key_mask, topk=self.topk, null_kv=True,
                                row_scale=row_scale)
        return self.readout(out.transpose(1, 2).reshape(b, n, self.heads * self.d_v)).mean(1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, F32_TOL), (torch.float64, F64_TOL)], ids=["fp32", "fp64"])
def test_toy_model_with_topk_null_slot_row_scale_matches_literal_gradients(dtype, tol):
    """Issue acceptance: a toy model using attend(topk, null_kv, row_scale) matches the same model
    on the literal loop to 1e-6 in fp32 (loss and gradients of every parameter and of the input)."""
    torch.manual_seed(0)
    lib = ToySetModel(lambda q, k, v, **kw: attend(q, k, v, **kw)).to(dtype)
    lit = ToySetModel(lambda q, k, v, **kw: attend_literal(q, k, v, **kw)).to(dtype)
    lit.load_state_dict(lib.state_dict())
    x = torch.randn(3, 6, 6, dtype=dtype)
    target = torch.tensor([0, 2, 1])
    key_mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    key_mask[1, ..., 4:] = False  # padding in the second set
    results = []
    for model in (lib, lit):
        xi = x.clone().requires_grad_(True)
        loss = F.cross_entropy(model(xi, key_mask), target)
        grads = torch.autograd.grad(loss, [xi, *model.parameters()])
        results.append((loss, grads))
    (loss, grads), (loss_l, grads_l) = results
    torch.testing.assert_close(loss, loss_l, **tol)
    names = ["x"] + [n for n, _ in lib.named_parameters()]
    for name, g, g_l in zip(names, grads, grads_l):
        assert torch.isfinite(g).all(), name
        assert g_l.abs().max() > 0, name  # the comparison is not vacuous
        torch.testing.assert_close(g, g_l, **tol, msg=lambda m: f"d/d{name}: {m}")


@pytest.mark.parametrize("opts", [{}, {"bias": True}, {"topk": 2}, {"row_scale": True},
                                  {"bias": True, "topk": 2, "row_scale": True}], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_all_masked_row_is_exactly_zero_with_finite_zero_gradients(opts, dtype):
    """A query with no allowed key reads exactly 0 (zero weights); gradients stay finite and the
    empty row contributes none (d/dq_i = 0, d/dbias_i· = 0)."""
    x = _inputs((2, 3), dtype)
    kw = {n: x[n].clone().requires_grad_(True) for n in ("q", "k", "v")}
    kw["key_mask"] = x["key_mask"]  # row 1 of [0, 0] is all False
    if opts.get("bias"):
        kw["bias"] = x["bias"].clone().requires_grad_(True)
    if opts.get("row_scale"):
        kw["row_scale"] = x["row_scale"].clone().requires_grad_(True)
    if "topk" in opts:
        kw["topk"] = opts["topk"]
    assert not x["key_mask"][0, 0, 1].any()
    out, w = _run(attend, kw, return_weights=True)
    assert torch.equal(out[0, 0, 1], torch.zeros(D_V, dtype=dtype))
    assert torch.equal(w[0, 0, 1], torch.zeros(N_K, dtype=dtype))
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    g = _grads(kw, out)
    for name, gr in g.items():
        assert torch.isfinite(gr).all(), name
    assert g["q"][0, 0, 1].eq(0).all()
    if "bias" in g:
        assert g["bias"][0, 0, 1].eq(0).all()
    kw_l = _clone(kw)
    g_l = _grads(kw_l, _run(attend_literal, kw_l)[0])
    tol = F64_GRAD_TOL if dtype == torch.float64 else F32_TOL
    for name in g:
        torch.testing.assert_close(g[name], g_l[name], **tol)


@pytest.mark.parametrize("null_kv", [False, True], ids=["no_null", "null"])
@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize("lead", LEADS, ids=str)
def test_topk_keeps_exactly_k_weights_per_row(lead, topk, null_kv):
    """NFM Alg. 1 / AiT Eq. 3: exactly min(k, #allowed keys [+1 for the null slot]) entries are
    nonzero per query row, the null slot counted through its weight 1 - Σ_j w_ij."""
    x = _inputs(lead)
    out, w = attend(x["q"], x["k"], x["v"], bias=x["bias"], key_mask=x["key_mask"], topk=topk,
                    null_kv=null_kv, return_weights=True)
    kept = (w != 0).sum(-1)
    if null_kv:
        kept = kept + (null_weight(w).abs() > 1e-12).long()
    available = x["key_mask"].sum(-1) + int(null_kv)
    assert torch.equal(kept, torch.minimum(available, torch.tensor(topk)))
    # and they are the highest-scoring allowed keys
    scores = (x["q"] @ x["k"].transpose(-1, -2) * D_K ** -0.5 + x["bias"]).masked_fill(~x["key_mask"], -1e30)
    if not null_kv:
        for idx in itertools.product(*(range(n) for n in (*lead, N_Q))):
            chosen = set(torch.nonzero(w[idx]).flatten().tolist())
            n_allowed = int(x["key_mask"][idx].sum())
            best = set(torch.argsort(scores[idx], descending=True)[:min(topk, n_allowed)].tolist())
            assert chosen == best, idx


@pytest.mark.parametrize("null_kv", [False, True], ids=["no_null", "null"])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
def test_topk_at_least_the_number_of_keys_is_plain_attention(masked, null_kv):
    """k ≥ the number of candidates (Nk, plus the null slot) keeps every key: plain attention."""
    x = _inputs((2, 3))
    base = dict(bias=x["bias"], key_mask=x["key_mask"] if masked else None, null_kv=null_kv,
                return_weights=True)
    out0, w0 = attend(x["q"], x["k"], x["v"], **base)
    for topk in (N_K + int(null_kv), N_K + 3):
        out, w = attend(x["q"], x["k"], x["v"], topk=topk, **base)
        torch.testing.assert_close(out, out0, rtol=0, atol=1e-12)
        torch.testing.assert_close(w, w0, rtol=0, atol=1e-12)
    if null_kv and not masked:  # k = Nk with the null slot drops exactly one of the Nk + 1 candidates
        _, w = attend(x["q"], x["k"], x["v"], topk=N_K, **base)
        kept = (w != 0).sum(-1) + (null_weight(w).abs() > 1e-12).long()
        assert kept.eq(N_K).all()


@pytest.mark.parametrize("topk", [None, 1, 3])
def test_null_slot_with_every_real_key_masked_reads_zero_with_null_weight_one(topk):
    """NFM Default Computation: the null slot is always allowed; with no real key left the query
    reads the zero value (out = 0) and the null slot takes all the weight."""
    x = _inputs((2, 2, 3))
    q, k, v, bias = (x[n].clone().requires_grad_(True) for n in ("q", "k", "v", "bias"))
    none = torch.zeros(2, 2, 3, N_Q, N_K, dtype=torch.bool)
    out, w = attend(q, k, v, bias=bias, key_mask=none, null_kv=True, topk=topk, return_weights=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(w, torch.zeros_like(w))
    assert torch.equal(null_weight(w), torch.ones(2, 2, 3, N_Q, dtype=torch.float64))
    (out.sum() + (out * out).sum()).backward()
    for t in (q, k, v, bias):
        assert t.grad is None or (torch.isfinite(t.grad).all() and t.grad.eq(0).all())


@pytest.mark.parametrize("case", ["plain", "key_mask+topk2", "null_kv+topk2", "all"])
def test_row_scale_zero_gives_zero(case):
    """NI Eq. 9-10: C_ui = 0 (function u does not process x_i) gives an exactly zero output."""
    kw = _case_kwargs(case, (2, 3))
    kw["row_scale"] = torch.zeros(2, 3, N_Q, dtype=torch.float64)
    out, w = _run(attend, kw, return_weights=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(w, torch.zeros_like(w))
    # a single zero row in an otherwise scaled batch
    rs = _inputs((2, 3))["row_scale"]
    rs[1, 2, 0] = 0.0
    kw["row_scale"] = rs
    out, w = _run(attend, kw, return_weights=True)
    assert out[1, 2, 0].eq(0).all() and w[1, 2, 0].eq(0).all() and out.abs().sum() > 0


@pytest.mark.parametrize("opts", [{}, {"null_kv": True}, {"topk": 2}, {"null_kv": True, "topk": 2}], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_large_negative_bias_equals_masking_the_key(opts, dtype):
    """NAC Eq. 3: log K̂_ij → -∞ (K̂_ij → 0) removes key j, like key_mask does (rows keep other keys)."""
    x = _inputs((2, 3), dtype)
    bias_neg = x["bias"].clone()
    bias_neg[..., 2] = -1e9
    mask = torch.ones(2, 3, N_Q, N_K, dtype=torch.bool)
    mask[..., 2] = False
    out_b, w_b = attend(x["q"], x["k"], x["v"], bias=bias_neg, return_weights=True, **opts)
    out_m, w_m = attend(x["q"], x["k"], x["v"], bias=x["bias"], key_mask=mask, return_weights=True, **opts)
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    torch.testing.assert_close(out_b, out_m, **tol)
    torch.testing.assert_close(w_b, w_m, **tol)
    assert w_b[..., 2].eq(0).all()


def test_default_scale_is_inverse_sqrt_dk():
    """NAC Eq. 3 / Transformer scaling: scale defaults to dk ** -0.5."""
    x = _inputs((2, 2, 3))
    args = (x["q"], x["k"], x["v"])
    out, w = attend(*args, bias=x["bias"], return_weights=True)
    out_s, w_s = attend(*args, bias=x["bias"], scale=D_K ** -0.5, return_weights=True)
    torch.testing.assert_close(out, out_s, rtol=0, atol=1e-14)
    torch.testing.assert_close(w, w_s, rtol=0, atol=1e-14)
    out_l, _ = attend_literal(*args, bias=x["bias"], scale=D_K ** -0.5)
    torch.testing.assert_close(out, out_l, **F64_TOL)
    out_1, _ = attend(*args, bias=x["bias"], scale=1.0)
    assert (out - out_1).abs().max() > 1e-3  # the scale matters for these inputs


def test_return_weights_false_gives_none():
    x = _inputs((2, 3))
    out, w = attend(x["q"], x["k"], x["v"], key_mask=x["key_mask"], topk=2, null_kv=True)
    assert w is None and out.shape == (2, 3, N_Q, D_V)
    out_w, _ = attend(x["q"], x["k"], x["v"], key_mask=x["key_mask"], topk=2, null_kv=True,
                      return_weights=True)
    torch.testing.assert_close(out, out_w, rtol=0, atol=0)


@pytest.mark.parametrize("topk", [0, -1, 2.5, 2.0, "2"], ids=repr)
def test_bad_topk_raises_value_error_naming_topk(topk):
    x = _inputs((2, 3))
    with pytest.raises(ValueError, match="topk"):
        attend(x["q"], x["k"], x["v"], topk=topk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8], ids=str)
def test_non_bool_key_mask_raises_naming_key_mask(dtype):
    x = _inputs((2, 3))
    attend(x["q"], x["k"], x["v"], key_mask=x["key_mask"])  # a bool mask is accepted
    with pytest.raises((TypeError, ValueError), match="key_mask"):
        attend(x["q"], x["k"], x["v"], key_mask=x["key_mask"].to(dtype))


def test_bias_that_is_neither_a_tensor_nor_a_pattern_is_a_clear_error():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match="AttentionPattern"):
        modwire.nn.attend(q, q, q, bias=[[0.0]])


def test_null_slot_with_a_mask_and_bias_broadcast_over_keys():
    """A key_mask / bias of size 1 on the key axis (broadcast) is expanded before the null
    column is prepended: the same result as the explicitly expanded inputs."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    row_mask = torch.tensor([True, False, True, True]).view(1, 1, 4, 1)   # row 1 may read no real key
    row_bias = torch.randn(1, 1, 4, 1, generator=g, dtype=torch.float64)
    out, w = modwire.nn.attend(q, k, v, key_mask=row_mask, bias=row_bias, null_kv=True, return_weights=True)
    ref, w_ref = attend_literal(q, k, v, key_mask=row_mask.expand(2, 3, 4, 4), bias=row_bias.expand(2, 3, 4, 4),
                                null_kv=True)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(w, w_ref, atol=1e-10, rtol=1e-10)
    assert (w[:, :, 1] == 0).all()
