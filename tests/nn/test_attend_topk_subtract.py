"""``topk_softmax="subtract"``: the NFM authors' top-k (Ke et al. 2018's sparse attention, their
``SparseAttention``), in :func:`modwire.nn.attention.sparse_softmax` and :func:`modwire.nn.attend`,
against the literal rule of tests/reference/nfm.py; the other rules are unchanged."""
import pytest
import torch

from modwire.nn import attend, sparse_softmax
from tests.reference.nfm import kept_softmax_literal, subtract_kth_literal


@pytest.mark.parametrize("n_keys", [2, 4, 5, 9])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_sparse_softmax_subtract_matches_the_literal_rule_values_and_gradients(n_keys, k):
    g = torch.Generator().manual_seed(100 * n_keys + k)
    scores = torch.randn(3, 2, n_keys, generator=g, dtype=torch.float64, requires_grad=True)
    w = sparse_softmax(scores, topk=k, topk_softmax="subtract")
    rows = scores.reshape(-1, n_keys)
    ref = torch.stack([torch.stack(subtract_kth_literal(list(r), k)) for r in rows]).reshape(w.shape)
    torch.testing.assert_close(w, ref, rtol=0, atol=1e-14)
    up = torch.randn(w.shape, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(w, scores, up)[0], torch.autograd.grad(ref, scores, up)[0],
                               rtol=0, atol=1e-12)
    if n_keys > k + 1:                                          # the (k+1)-th weight and below are cut
        assert torch.all((w > 0).sum(-1) <= k)
    else:                                                       # as the authors' code: the plain softmax
        torch.testing.assert_close(w, scores.softmax(-1), rtol=0, atol=0)


def test_subtract_differs_from_the_kept_softmax_of_the_papers_text():
    """The two rules keep the same keys but weigh them differently (the issue measured up to 0.53)."""
    g = torch.Generator().manual_seed(0)
    scores = 2 * torch.randn(1000, 8, generator=g, dtype=torch.float64)
    sub = sparse_softmax(scores, topk=3, topk_softmax="subtract")
    kept = sparse_softmax(scores, topk=3, topk_softmax="kept")
    ref = torch.stack([torch.stack(kept_softmax_literal(list(r), 3)) for r in scores[:20]])
    torch.testing.assert_close(kept[:20], ref, rtol=0, atol=1e-14)
    assert torch.all((sub > 0) <= (kept > 0))                 # subtract keeps a subset of the top k
    torch.testing.assert_close(sub.sum(-1), torch.ones(1000, dtype=torch.float64), rtol=0, atol=1e-5)  # ε = 1e-7
    assert (sub - kept).abs().max() > 0.3


def test_attend_takes_the_subtract_rule_with_the_null_slot():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 6 if i else 3, 5, generator=g, dtype=torch.float64) for i in range(3))
    q = q[:, :, :3]
    out, w = attend(q, k, v, topk=2, null_kv=True, topk_softmax="subtract", scale=0.5, return_weights=True)
    scores = torch.cat([torch.zeros(2, 4, 3, 1, dtype=torch.float64), q @ k.transpose(-1, -2) * 0.5], -1)
    full = sparse_softmax(scores, topk=2, topk_softmax="subtract")
    torch.testing.assert_close(w, full[..., 1:], rtol=0, atol=1e-14)
    torch.testing.assert_close(out, full[..., 1:] @ v, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="topk_softmax must be"):
        attend(q, k, v, topk=2, topk_softmax="top")
    with pytest.raises(ValueError, match="does not combine with key_scale"):
        attend(q, k, v, topk=2, topk_softmax="subtract", key_scale=torch.ones(2, 4, 6, dtype=torch.float64))
