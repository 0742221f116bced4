"""``sparse_softmax`` over a keys axis that is not the last (NFM's readers, ``[B, 1 + n, P, H]``): its
top-k is picked by reductions and float masks (:func:`modwire.nn.attention._rank_pick`), not ``topk``.
Checked against the same rules over the last axis (``topk``) and the literal rules of
tests/reference/nfm.py, with ties, gradients and low precision."""
import pytest
import torch

from modwire.nn import sparse_softmax
from modwire.nn.attention import _kth_largest, _rank_pick, _top_mask
from tests.reference.nfm import kept_softmax_literal, subtract_kth_literal


def scores_with_ties(n_keys: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """``[2, n_keys, 5, 3]`` scores, keys on axis 1; rows with repeated values (SpaceToDepth windows of a
    constant region tie) and a zero column (the null slot)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n_keys, 5, 3, generator=g, dtype=torch.float64)
    s[:, : n_keys // 2] = (s[:, : n_keys // 2] * 2).round() / 2        # coarse values: many exact ties
    s[:, 0] = 0
    return s.to(dtype)


@pytest.mark.parametrize("n_keys,k", [(n, k) for n in (2, 3, 6, 9, 13, 30) for k in (1, 2, 5) if k < n])
def test_top_mask_keeps_exactly_k_of_the_highest_lower_index_first_on_ties(n_keys, k):
    s = scores_with_ties(n_keys, 10 * n_keys + k)
    keep = _top_mask(s, k, 1)
    assert keep.dtype == s.dtype and torch.all((keep == 0) | (keep == 1))
    assert torch.all(keep.sum(1) == k)
    rows = s.movedim(1, -1).reshape(-1, n_keys)
    for row, kept in zip(rows, keep.movedim(1, -1).reshape(-1, n_keys)):
        # the literal rule: order by value, then the lower index first; keep the first k
        order = sorted(range(n_keys), key=lambda j: (-row[j].item(), j))
        want = torch.zeros(n_keys, dtype=s.dtype)
        want[order[:k]] = 1
        assert torch.equal(kept, want), (row, kept, want)


LITERAL = {"kept": kept_softmax_literal, "subtract": subtract_kth_literal}


@pytest.mark.parametrize("rule", ["kept", "subtract"])
@pytest.mark.parametrize("n_keys,k", [(6, 5), (6, 3), (9, 5), (13, 3), (13, 1), (30, 5)])
def test_both_rules_on_the_keys_axis_equal_the_literal_rules_with_gradients(rule, n_keys, k):
    s = scores_with_ties(n_keys, 7 * n_keys + k).requires_grad_()
    g = torch.Generator().manual_seed(1)
    w = sparse_softmax(s, topk=k, topk_softmax=rule, dim=1)
    rows = s.movedim(1, -1).reshape(-1, n_keys)
    ref = torch.stack([torch.stack(LITERAL[rule](list(r), k)) for r in rows])
    ref = ref.reshape(2, 5, 3, n_keys).movedim(-1, 1)
    torch.testing.assert_close(w, ref, rtol=0, atol=1e-14)
    up = torch.randn(w.shape, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(w, s, up)[0], torch.autograd.grad(ref, s, up)[0], rtol=0, atol=1e-12)
    if rule == "kept":
        assert torch.all((w == 0).sum(1) == n_keys - k)              # a dropped key's weight is exactly 0


@pytest.mark.parametrize("n_keys,k", [(6, 2), (9, 8), (13, 5)])
def test_kth_largest_counts_ties_and_its_gradient_goes_to_one_entry(n_keys, k):
    s = scores_with_ties(n_keys, n_keys + k).requires_grad_()
    got = _kth_largest(s, k, 1)
    want = s.detach().sort(dim=1, descending=True).values.narrow(1, k - 1, 1)
    assert torch.equal(got.detach(), want)
    grad = torch.autograd.grad(got.sum(), s)[0]
    assert torch.all(grad.sum(1) == 1) and torch.all((grad == 0) | (grad == 1))   # one entry per row, as topk's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_keeps_k_and_gives_dropped_keys_zero_weight(dtype):
    s = scores_with_ties(9, 5, dtype=dtype) * 30                    # large scores: -max must not overflow to NaN
    w = sparse_softmax(s, topk=4, dim=1)
    assert w.dtype == dtype and torch.isfinite(w).all()
    assert torch.all((w > 0).sum(1) <= 4) and torch.all((w == 0).sum(1) >= 5)
    torch.testing.assert_close(w.float().sum(1), torch.ones(2, 5, 3), rtol=0, atol=1e-2)
    torch.testing.assert_close(_top_mask(s, 4, 1).to(torch.float64), _top_mask(s.double(), 4, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_with_more_keys_than_bf16_counts_exactly_keeps_k(dtype):
    """300 keys: bf16 cannot tell index 257 from 258, so the tie order is kept in float32."""
    s = torch.randn(2, 300, 3, generator=torch.Generator().manual_seed(4)).to(dtype)
    for k in (5, 290):                                              # the largest-first and the smallest-first picks
        keep = _top_mask(s, k, 1)
        assert keep.dtype == dtype and torch.all(keep.sum(1) == k)
        torch.testing.assert_close(keep.float(), _top_mask(s.float(), k, 1), rtol=0, atol=0)


def test_rank_pick_smallest_breaks_ties_toward_the_higher_index():
    """Dropping the lowest: among equal lowest scores the higher index goes first (so the lower is kept,
    as the largest-first pick keeps it)."""
    s = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]]).T.reshape(1, 5, 1)
    picked, value = _rank_pick(s, 2, 1, largest=False)
    assert picked.flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 1.0] and value.item() == 0.0
    assert _top_mask(s, 3, 1).flatten().tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
