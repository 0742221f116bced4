"""The signature-kernel functions of ``modwire.nn.kernel`` against literal loops
(tests/reference/kernel.py) and, for the Concrete sample, against its exact law.

NAC Eq. 2: ``P_ij = exp(-d(s_i, s_j)/ε)``, ``d = 1 - cos``; NAC Eq. 3: ``K̂_ij = K_ij / (δ + Σ_j K_ij)``
(K ~ Concrete(P, τ) in training); NI Eq. 2-3: ``C_ui = C̃_ui / (ε + Σ_u C̃_ui)``,
``C̃_ui = exp(-d(s_u, t_i)/σ)`` where ``d ≤ τ``, else 0.

Only the public signatures are used:
``cosine_distance(a, b)``, ``signature_log_kernel(s_recv, s_send, epsilon, *, truncation=None)``,
``concrete_log_sample(log_p, tau, *, generator=None)``,
``normalize_log_kernel(log_k, *, dim=-1, delta=1e-6, mask=None)``.
"""
import math

import pytest
import torch

import modwire.nn.kernel as kernel  # functions looked up at call time: each test fails on its own
from reference.kernel import (cosine_distance_literal, log_link_prob_literal,
                              ni_compatibility_literal, normalize_literal)

f64 = torch.float64
TOL = dict(rtol=0, atol=1e-12)
GRAD_TOL = dict(rtol=0, atol=1e-10)


def _randn(*shape, seed=0, dtype=f64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64).to(dtype)


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def _grad(out, leaves, seed=7):
    w = _randn(*out.shape, seed=seed, dtype=out.dtype)
    return torch.autograd.grad((out * w).sum(), leaves)


def _tau_between(d, q=0.6):
    """A truncation threshold halfway between two consecutive distances (no pair on the boundary)."""
    v = torch.sort(d.detach().flatten()).values
    i = int(q * (len(v) - 1))
    assert v[i + 1] - v[i] > 1e-9
    return float((v[i] + v[i + 1]) / 2)


# ---------------------------------------------------------------------------- cosine distance

SHAPES = {"batched": ((2, 4, 3), (2, 5, 3)), "shared": ((4, 3), (5, 3)), "two_leading": ((2, 3, 4, 3), (2, 3, 5, 3))}


@pytest.mark.parametrize("shapes", list(SHAPES))
def test_cosine_distance_matches_literal(shapes):
    """NAC Eq. 2 / NI Eq. 2: d(a_i, b_j) = 1 - cos(a_i, b_j) (inputs not normalised), values and gradients."""
    sa, sb = SHAPES[shapes]
    a, b = _randn(*sa, seed=1).requires_grad_(True), _randn(*sb, seed=2).requires_grad_(True)
    a_l, b_l = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    d, d_l = kernel.cosine_distance(a, b), cosine_distance_literal(a_l, b_l)
    assert d.shape == (*sa[:-2], sa[-2], sb[-2])
    torch.testing.assert_close(d, d_l, **TOL)
    for g, g_l in zip(_grad(d, [a, b]), _grad(d_l, [a_l, b_l])):
        torch.testing.assert_close(g, g_l, **GRAD_TOL)


def test_cosine_distance_broadcasts_shared_against_batched():
    """Shared signatures [Uk, d] against per-sample ones [B, Uq, d] (leading axes broadcast)."""
    a, b = _randn(2, 4, 3, seed=1), _randn(5, 3, seed=2)
    torch.testing.assert_close(kernel.cosine_distance(a, b), cosine_distance_literal(a, b), **TOL)
    torch.testing.assert_close(kernel.cosine_distance(b, a), cosine_distance_literal(b, a), **TOL)


# ---------------------------------------------------------------------------- signature_log_kernel

@pytest.mark.parametrize("eps_kind", ["float", "tensor"])
@pytest.mark.parametrize("shapes", ["batched", "shared"])
def test_signature_log_kernel_is_nac_eq2(shapes, eps_kind):
    """log P_ij = -d(s_i, s_j)/ε; no mask without truncation; gradients reach the signatures and a
    0-d tensor ε."""
    sa, sb = SHAPES[shapes]
    s_r, s_s = _randn(*sa, seed=3).requires_grad_(True), _randn(*sb, seed=4).requires_grad_(True)
    eps = 0.7 if eps_kind == "float" else torch.tensor(0.7, dtype=f64, requires_grad=True)
    log_p, mask = kernel.signature_log_kernel(s_r, s_s, eps)
    assert mask is None
    assert log_p.shape == (*sa[:-2], sa[-2], sb[-2]) and log_p.dtype == f64
    leaves = [s_r, s_s] + ([eps] if torch.is_tensor(eps) else [])
    leaves_l = [t.detach().clone().requires_grad_(True) for t in leaves]
    log_p_l = log_link_prob_literal(leaves_l[0], leaves_l[1], leaves_l[2] if len(leaves) == 3 else eps)
    torch.testing.assert_close(log_p, log_p_l, **TOL)
    for g, g_l in zip(_grad(log_p, leaves), _grad(log_p_l, leaves_l)):
        torch.testing.assert_close(g, g_l, **GRAD_TOL)


@pytest.mark.parametrize("shapes", ["batched", "shared", "two_leading"])
def test_signature_log_kernel_truncation_mask_is_d_at_most_threshold(shapes):
    """The truncation mask is the bool ``d ≤ truncation`` (NI Eq. 3's kernel truncation);
    log_p itself is -d/ε whether or not a truncation is given."""
    sa, sb = SHAPES[shapes]
    s_r, s_s = _randn(*sa, seed=5), _randn(*sb, seed=6)
    d = cosine_distance_literal(s_r, s_s)
    tau = _tau_between(d)
    log_p, mask = kernel.signature_log_kernel(s_r, s_s, 0.5, truncation=tau)
    assert mask.dtype == torch.bool and mask.shape == d.shape
    assert torch.equal(mask, d <= tau)
    assert mask.any() and not mask.all()
    torch.testing.assert_close(log_p, -d / 0.5, **TOL)
    torch.testing.assert_close(log_p, kernel.signature_log_kernel(s_r, s_s, 0.5)[0], rtol=0, atol=0)


def test_signature_log_kernel_self_pairs_have_p_one():
    """d(s_i, s_i) = 0: P_ii = 1 (log P_ii = 0) and the pair is never truncated."""
    s = _randn(6, 4, seed=8)
    log_p, mask = kernel.signature_log_kernel(s, s, 0.3, truncation=0.05)
    torch.testing.assert_close(log_p.diagonal(), torch.zeros(6, dtype=f64), rtol=0, atol=1e-12)
    assert mask.diagonal().all()


# ---------------------------------------------------------------------------- concrete_log_sample

P_VALUES = [0.1, 0.3, 0.5, 0.7, 0.9]
N_SAMPLES = 20000


def _log_p_grid(n=N_SAMPLES, p=P_VALUES):
    return torch.tensor(p, dtype=f64).log().expand(n, len(p)).contiguous()


def _logit_from_log(log_x):
    """logit(x) from log(x): log x - log(1 - x)."""
    return log_x - torch.log(-torch.expm1(log_x))


def test_concrete_log_sample_shape_range_and_reproducibility():
    log_p = _log_p_grid(4000)
    log_k = kernel.concrete_log_sample(log_p, 0.5, generator=torch.Generator().manual_seed(0))
    assert log_k.shape == log_p.shape and log_k.dtype == f64
    assert torch.isfinite(log_k).all() and (log_k < 0).all()  # K ∈ (0, 1), checked in the log domain
    again = kernel.concrete_log_sample(log_p, 0.5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(log_k, again)
    other = kernel.concrete_log_sample(log_p, 0.5, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(log_k, other)
    torch.manual_seed(3)
    a = kernel.concrete_log_sample(log_p, 0.5)
    torch.manual_seed(3)
    assert torch.equal(a, kernel.concrete_log_sample(log_p, 0.5))  # generator=None: the global RNG


def test_concrete_log_sample_is_the_reparameterised_formula():
    """K = σ((logit P + log u - log(1-u))/τ): with the same generator state, τ·logit K - logit P
    (= logit u) is the same whatever P and τ are."""
    g = torch.Generator().manual_seed(11)
    log_p1 = torch.rand(50, 6, generator=g, dtype=f64).mul(0.6).add(0.2).log()  # P ∈ [0.2, 0.8]
    log_p2 = torch.rand(50, 6, generator=g, dtype=f64).mul(0.6).add(0.2).log()
    noise = []
    for log_p, tau in ((log_p1, 1.0), (log_p2, 2.0), (log_p1, 3.0)):
        log_k = kernel.concrete_log_sample(log_p, tau, generator=torch.Generator().manual_seed(5))
        noise.append(tau * _logit_from_log(log_k) - _logit_from_log(log_p))
    torch.testing.assert_close(noise[1], noise[0], rtol=0, atol=1e-8)
    torch.testing.assert_close(noise[2], noise[0], rtol=0, atol=1e-8)
    u = torch.sigmoid(noise[0])
    assert (u > 0).all() and (u < 1).all() and abs(u.mean().item() - 0.5) < 0.05


@pytest.mark.parametrize("tau", [0.3, 1.0])
def test_concrete_log_sample_has_the_relaxed_bernoulli_law(tau):
    """Statistical (fixed seeds, loose tolerances): the exact Concrete CDF
    F(k) = σ(τ·logit k - logit P) (Kolmogorov-Smirnov distance), P(K > 1/2) = P, and the mean of K
    is that of torch.distributions.RelaxedBernoulli(temperature=τ, probs=P)."""
    log_k = kernel.concrete_log_sample(_log_p_grid(), tau, generator=torch.Generator().manual_seed(2))
    K = log_k.exp()
    p = torch.tensor(P_VALUES, dtype=f64)
    torch.manual_seed(2)
    K_ref = torch.distributions.RelaxedBernoulli(torch.tensor(tau, dtype=f64), probs=p).sample((N_SAMPLES,))
    for c, pc in enumerate(P_VALUES):
        logit_k = torch.sort(_logit_from_log(log_k[:, c])).values
        cdf = torch.sigmoid(tau * logit_k - math.log(pc / (1 - pc)))
        ecdf = torch.arange(1, N_SAMPLES + 1, dtype=f64) / N_SAMPLES
        ks = torch.maximum((ecdf - cdf).abs(), (ecdf - 1 / N_SAMPLES - cdf).abs()).max().item()
        assert ks < 0.02, (pc, ks)  # the 0.1% critical value is 0.0138 for n = 20000
        assert abs((log_k[:, c] > math.log(0.5)).double().mean().item() - pc) < 0.02
        assert abs(K[:, c].mean().item() - K_ref[:, c].mean().item()) < 0.02


def test_concrete_log_sample_hardens_to_bernoulli_as_tau_goes_to_zero():
    log_k = kernel.concrete_log_sample(_log_p_grid(), 1e-3, generator=torch.Generator().manual_seed(4))
    high = (log_k > math.log(0.99)).double().mean(0)
    low = (log_k < math.log(0.01)).double().mean(0)
    p = torch.tensor(P_VALUES, dtype=f64)
    assert ((high - p).abs() < 0.02).all(), high
    assert ((high + low) > 0.99).all()  # almost no mass strictly between 0.01 and 0.99


def test_concrete_log_sample_reparameterised_gradient():
    """dK/d log P = K(1-K)/(τ(1-P)) for the same noise (K increases with P): finite, nonnegative."""
    tau = 0.7
    log_p = torch.rand(200, 5, generator=torch.Generator().manual_seed(9), dtype=f64).mul(0.8).add(0.1).log()
    log_p.requires_grad_(True)
    log_k = kernel.concrete_log_sample(log_p, tau, generator=torch.Generator().manual_seed(6))
    K = log_k.exp()
    (grad,) = torch.autograd.grad(K.sum(), log_p)
    assert torch.isfinite(grad).all() and (grad >= 0).all()
    P = log_p.detach().exp()
    K = K.detach()
    torch.testing.assert_close(grad, K * (1 - K) / (tau * (1 - P)), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("tau", [1e-2, 0.5])
@pytest.mark.parametrize("dtype", [f64, torch.float32], ids=str)
def test_concrete_log_sample_at_extreme_probabilities_is_not_nan(dtype, tau):
    """P = 1 (self pairs, d = 0: log P = 0), P just below 1, and P ≈ e^-200 (far pairs, small ε):
    no NaN in log K, log K ≤ 0, finite gradients."""
    log_p = torch.tensor([0.0, -1e-9, -0.5, -20.0, -200.0], dtype=dtype).expand(64, 5).contiguous()
    log_p.requires_grad_(True)
    log_k = kernel.concrete_log_sample(log_p, tau, generator=torch.Generator().manual_seed(0))
    assert not torch.isnan(log_k).any() and (log_k <= 0).all()
    (grad,) = torch.autograd.grad((log_k.clamp_min(-1e4) + log_k.exp()).sum(), log_p)
    assert torch.isfinite(grad).all()


# ---------------------------------------------------------------------------- normalize_log_kernel

def _log_k(*shape, seed=0, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=f64).mul(0.95).add(0.05).log().to(dtype)


def _mask(*shape, dim, seed=0):
    """A random mask with one fully masked slice along ``dim`` (index 0 of every other axis)."""
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(seed + 100)) < 0.7
    idx = [0] * len(shape)
    idx[dim] = slice(None)
    m[tuple(idx)] = False
    return m


@pytest.mark.parametrize("delta", [None, 0.1], ids=["default_delta", "delta0.1"])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("dim", [-1, -2, 0])
def test_normalize_log_kernel_matches_literal(dim, masked, delta):
    """K̂ = K·1[mask] / (δ + Σ_dim K·1[mask]) (NAC Eq. 3 with dim=-1; NI Eq. 3 over the function
    axis), δ defaulting to 1e-6; values to 1e-12 after exp, gradients (of Σ w·K̂) to 1e-10."""
    shape = (2, 4, 5)
    log_k = _log_k(*shape).requires_grad_(True)
    mask = _mask(*shape, dim=dim) if masked else None
    kw = {"dim": dim, "mask": mask} if delta is None else {"dim": dim, "mask": mask, "delta": delta}
    out = kernel.normalize_log_kernel(log_k, **kw)
    assert out.shape == shape and out.dtype == f64 and torch.isfinite(out).all()
    log_k_l = log_k.detach().clone().requires_grad_(True)
    k_hat_l = normalize_literal(log_k_l.exp(), dim, 1e-6 if delta is None else delta, mask)
    torch.testing.assert_close(out.exp(), k_hat_l, **TOL)
    (g,), (g_l,) = _grad(out.exp(), [log_k]), _grad(k_hat_l, [log_k_l])
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, g_l, **GRAD_TOL)


@pytest.mark.parametrize("dtype", [f64, torch.float32], ids=str)
@pytest.mark.parametrize("dim", [-1, -2])
def test_normalize_log_kernel_masked_entries_are_finite_and_exp_to_zero(dim, dtype):
    """Masked entries: a large finite negative number (exp → 0 exactly), never -inf or NaN; a fully
    masked slice is all zeros after exp and its gradients are finite (zero)."""
    shape = (3, 4, 5)
    log_k = _log_k(*shape, seed=1, dtype=dtype).requires_grad_(True)
    mask = _mask(*shape, dim=dim, seed=1)
    out = kernel.normalize_log_kernel(log_k, dim=dim, mask=mask)
    assert torch.isfinite(out).all()
    assert out.exp()[~mask].eq(0).all()
    assert (out.exp()[mask] > 0).all()
    empty = (~mask).all(dim, keepdim=True).expand(shape)
    assert empty.any()
    # both the probabilities and the log values (a softmax bias) give finite gradients
    (g,) = torch.autograd.grad((out.exp() * _randn(*shape, dtype=dtype)).sum()
                               + torch.softmax(out, -1).mul(_randn(*shape, seed=3, dtype=dtype)).sum(), log_k,
                               retain_graph=True)
    assert torch.isfinite(g).all()
    (g,) = torch.autograd.grad(out.exp().sum(), log_k)
    assert g[empty].eq(0).all()


# ---------------------------------------------------------------------------- NI Eq. 2-3, composed

def test_ni_compatibility_is_signature_log_kernel_then_normalize_over_functions():
    """NI Eq. 2-3 literally: C̃_ui = exp(-(1 - s_u·t_i)/σ) if d ≤ τ else 0, C_ui = C̃_ui/(ε + Σ_u C̃_ui).

    Exact call tested (s = function signatures are the receivers, rows; t = types are the senders,
    columns; the sum over functions u is the receivers axis, dim=-2):
        log_p, mask = signature_log_kernel(s, t, sigma, truncation=tau)
        C = normalize_log_kernel(log_p, dim=-2, delta=eps, mask=mask).exp()
    """
    B, U, N, d = 2, 4, 6, 3
    s_shared = _unit(torch.tensor([3.0, 0.0, 0.0], dtype=f64) + 0.6 * _randn(U, d, seed=20))  # near e1
    t = _unit(_randn(B, N, d, seed=21))
    t[:, -1] = torch.tensor([-1.0, 0.0, 0.0], dtype=f64)  # the last set element is far from every function
    s_shared.requires_grad_(True)
    t.requires_grad_(True)
    sigma = torch.tensor(0.4, dtype=f64, requires_grad=True)
    s = s_shared.expand(B, U, d)  # shared signatures, one copy per sample
    eps = 0.05
    dist = cosine_distance_literal(s, t).detach()
    tau = _tau_between(dist[dist < 1.5], q=0.5)

    log_p, mask = kernel.signature_log_kernel(s, t, sigma, truncation=tau)
    C = kernel.normalize_log_kernel(log_p, dim=-2, delta=eps, mask=mask).exp()

    leaves_l = [x.detach().clone().requires_grad_(True) for x in (s_shared, t, sigma)]
    C_l = ni_compatibility_literal(leaves_l[0].expand(B, U, d), leaves_l[1], leaves_l[2], tau, eps)
    assert C.shape == (B, U, N)
    assert (C_l > 0).any() and (C_l[..., :-1] == 0).any()  # truncation is exercised
    assert C_l[..., -1].eq(0).all()                         # a set element no function reads
    torch.testing.assert_close(C, C_l, **TOL)
    for g, g_l in zip(_grad(C, [s_shared, t, sigma]), _grad(C_l, leaves_l)):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g_l, **GRAD_TOL)
