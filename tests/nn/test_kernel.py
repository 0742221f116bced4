import math

import pytest
import torch

from reference.nac import link_prob, skmdpa_weights
from modwire.nn import SignatureKernel, attend, concrete_log_sample, cosine_distance


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _probs(kernel, s):
    return kernel.link_probs(s, s)


def _attend(q, k, v, kernel_out, **kwargs):
    """``attend`` with a kernel's ``(bias, key_mask)``."""
    bias, key_mask = kernel_out
    return attend(q, k, v, bias=bias, key_mask=key_mask, **kwargs)


def test_link_probs_match_nac_eq2():
    k = SignatureKernel(epsilon=0.7)
    s_r, s_s = torch.randn(5, 4), torch.randn(6, 4)
    P = k.link_probs(s_r, s_s)
    for i in range(5):
        for j in range(6):
            assert P[i, j].item() == pytest.approx(link_prob(s_r[i], s_s[j], 0.7).item(), abs=1e-6)
    assert (_probs(k, s_r).diagonal() == 1).all()  # P_ii = 1 exactly (self-edges)


def test_expected_mode_bias_is_log_k_hat_of_p():
    k = SignatureKernel(eval_mode="expected", delta=1e-3).eval()
    s = torch.randn(6, 8)
    P = _probs(k, s)
    bias, key_mask = k(s, s)
    assert key_mask is None  # nothing is masked
    torch.testing.assert_close(bias[0, 0], torch.log(P / (1e-3 + P.sum(-1, keepdim=True))), atol=1e-5, rtol=1e-5)
    # and it is deterministic
    assert k.deterministic
    torch.testing.assert_close(k(s, s)[0], k(s, s)[0])


def test_threshold_mode_keeps_exactly_pairs_with_p_above_half():
    k = SignatureKernel(eval_mode="threshold").eval()
    s = torch.randn(12, 3)
    P = _probs(k, s)
    q, kk, v = torch.randn(1, 1, 12, 4), torch.randn(1, 1, 12, 4), torch.randn(1, 1, 12, 4)
    _, w = _attend(q, kk, v, k(s, s), return_weights=True)
    assert ((w[0, 0] > 0) == (P > 0.5)).all()
    assert (P > 0.5).any() and (P <= 0.5).any()  # the test exercises both sides


def test_concrete_samples_in_unit_interval_with_bernoulli_p_marginal():
    # Concrete(P, τ): K > 1/2 exactly when the underlying Bernoulli(P) draw is 1.
    k = SignatureKernel(tau=0.5, train_mode="sample").train()
    s = torch.randn(6, 5)
    P = _probs(k, s)
    log_k = concrete_log_sample(P.log().expand(20000, 6, 6), k.tau)
    # K ∈ (0, 1) strictly off the diagonal (checked in the log domain, where fp32 can represent
    # it); K_ii = 1 exactly: P_ii = 1 and Concrete(1, τ) = 1
    off = ~torch.eye(6, dtype=torch.bool)
    assert torch.isfinite(log_k).all() and (log_k[:, off] < 0).all() and (log_k[:, ~off] == 0).all()
    K = log_k.exp()
    freq = (K > 0.5).float().mean(0)
    assert (freq[off] - P[off]).abs().max() < 0.02  # 20000 draws: std ≤ 0.0035
    assert (freq.diagonal() == 1).all()             # P_ii = 1


def test_a_signature_is_at_distance_exactly_0_from_itself():
    """NAC Eq. 2: d(s_i, s_i) = 0. Computed as 1 - cos in floating point it is not (the test can
    fail): the same signatures as a different tensor leave rounding on the diagonal."""
    s = torch.randn(64, 16)
    assert (cosine_distance(s, s).diagonal() == 0).all()
    assert (cosine_distance(s, s.clone()).diagonal() != 0).any()          # rounding, ~1e-7
    torch.testing.assert_close(cosine_distance(s, s), cosine_distance(s, s.clone()), atol=1e-6, rtol=0)
    per_sample = torch.randn(3, 10, 4)                                     # a conditional NAC's [B, U, d]
    assert (cosine_distance(per_sample, per_sample).diagonal(dim1=-2, dim2=-1) == 0).all()


@pytest.mark.parametrize("mode", ["sample", "expected", "threshold"])
def test_self_links_are_one_in_every_mode_with_finite_gradients(mode):
    """P_ii = 1 and K_ii = 1 (Concrete(1, τ) = 1) in every kernel mode, the bias is log K̂ of
    those K (Eq. 3), and no infinite logit of P_ii spoils the signatures' gradients."""
    k = SignatureKernel(tau=0.5, train_mode=mode).train()
    s = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    assert (k.link_probs(s, s).diagonal() == 1).all()
    torch.manual_seed(1)
    bias, key_mask = k(s, s, batch_size=4)
    torch.manual_seed(1)                                                   # the same draw
    log_p = (-cosine_distance(s, s) / k.epsilon).expand(4, 7, 7)
    K = {"sample": lambda: concrete_log_sample(log_p, k.tau).exp(), "expected": lambda: log_p.exp(),
         "threshold": lambda: (log_p > math.log(0.5)).double()}[mode]()
    assert (K.diagonal(dim1=-2, dim2=-1) == 1).all()
    allowed = torch.ones_like(K, dtype=torch.bool) if key_mask is None else key_mask[:, 0].expand_as(K)
    torch.testing.assert_close(bias[:, 0].expand_as(K)[allowed],
                               torch.log(K / (k.delta + K.sum(-1, keepdim=True)))[allowed], atol=1e-12, rtol=1e-12)
    if mode == "threshold":                                                # a 0/1 kernel: no gradient to give
        return
    q = torch.randn(4, 2, 7, 3, dtype=torch.float64)
    out, _ = _attend(q, q, q, (bias, key_mask))
    out.square().sum().backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_concrete_samples_harden_as_tau_goes_to_zero():
    s = torch.randn(8, 5)
    fractions = []
    for tau in (2.0, 0.5, 0.05):
        k = SignatureKernel(tau=tau).train()
        K = concrete_log_sample(_probs(k, s).log().expand(2000, 8, 8), k.tau).exp()
        fractions.append(((K < 0.01) | (K > 0.99)).float().mean().item())
    assert fractions[0] < fractions[1] < fractions[2] and fractions[2] > 0.9


def test_skmdpa_attention_matches_nac_eq3_literally():
    # One sampled kernel per example, shared by all heads.
    k = SignatureKernel(tau=0.5, delta=1e-2).train()
    U, B, H, dh = 5, 2, 3, 4
    s = torch.randn(U, 6)
    torch.manual_seed(1)
    bias = k(s, s, batch_size=B)
    torch.manual_seed(1)
    K = concrete_log_sample(_probs(k, s).log().expand(B, U, U), k.tau).exp()  # the same draw
    q, kk, v = (torch.randn(B, H, U, dh) for _ in range(3))
    out_fused, _ = _attend(q, kk, v, bias)
    out_ref, w = _attend(q, kk, v, bias, return_weights=True)
    for b in range(B):
        for h in range(H):
            W = skmdpa_weights(q[b, h], kk[b, h], K[b], delta=1e-2)
            torch.testing.assert_close(w[b, h], W, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out_fused[b, h], W @ v[b, h], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_fused, out_ref, atol=1e-5, rtol=1e-5)


def test_train_stochastic_eval_deterministic():
    k = SignatureKernel()
    s = torch.randn(6, 4)
    k.train()
    assert not k.deterministic
    assert not torch.equal(k(s, s, 2)[0], k(s, s, 2)[0])
    per_example = k(s, s, 3)[0]
    assert per_example.shape == (3, 1, 6, 6)  # a fresh sample per example:
    assert not torch.equal(per_example[0], per_example[1]) and not torch.equal(per_example[1], per_example[2])
    k.eval()
    assert k.deterministic
    assert torch.equal(k(s, s, 2)[0], k(s, s, 2)[0])


def test_truncation_masks_far_pairs_and_gradients_still_reach_signatures():
    k = SignatureKernel(truncation=0.8, eval_mode="expected").eval()
    s = torch.randn(10, 3, requires_grad=True)
    bias = k(s, s)
    q, kk, v = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    out, w = _attend(q, kk, v, bias, return_weights=True)
    d = 1 - torch.nn.functional.cosine_similarity(s[:, None], s[None], dim=-1)
    assert (w[0, :, d > 0.8] == 0).all() and (w[0, :, d <= 0.8] > 0).all()
    assert (d > 0.8).any()
    out.square().sum().backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_all_senders_masked_gives_finite_zero_message_and_finite_gradients():
    k = SignatureKernel().train()
    s_r = torch.randn(3, 4, requires_grad=True)
    s_s = torch.randn(5, 4, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False  # receiver 1 has no sender
    bias = k(s_r, s_s, batch_size=2, mask=mask)
    q, kk, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    for return_weights in (False, True):
        out, _ = _attend(q, kk, v, bias, return_weights=return_weights)
        assert torch.isfinite(out).all()
        assert (out[:, :, 1] == 0).all() and (out[:, :, [0, 2]] != 0).any()
    out.sum().backward()
    assert torch.isfinite(s_r.grad).all() and torch.isfinite(s_s.grad).all()


def test_learnable_epsilon_stays_positive_and_gets_gradients():
    k = SignatureKernel(epsilon=0.5, learn_epsilon=True).train()
    assert k.epsilon.item() == pytest.approx(0.5)
    with torch.no_grad():
        k.log_epsilon.fill_(-30.0)  # any real value of the parameter is a valid ε
    assert k.epsilon.item() > 0
    with torch.no_grad():
        k.log_epsilon.fill_(math.log(0.5))
    s = torch.randn(4, 3)
    k(s, s, 2)[0].sum().backward()
    assert k.log_epsilon.grad is not None and k.log_epsilon.grad.abs() > 0


def test_bad_kernel_arguments_are_named():
    with pytest.raises(ValueError, match="eval_mode must be one of"):
        SignatureKernel(eval_mode="mean")
    with pytest.raises(ValueError, match="must be > 0"):
        SignatureKernel(epsilon=0.0)
