"""Block-sparse propagator attention (modwire.nn.block_sparse) equals the dense masked one."""
import pytest
import torch

from modwire.nn import (BlockSparseBias, BlockSparseLayout, ModulationSpec, TransformerBlock, attend, block_order,
                        block_sparse_attend, mask_value, order_by_groups)


def block_mask(sizes, extra=0, perm=False, seed=0):
    """Block-diagonal bool mask with clusters of ``sizes``, ``extra`` random off-block
    edges, the diagonal kept; optionally with the modules randomly permuted."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    m = (labels[:, None] == labels[None, :]) & (torch.rand(len(labels), len(labels), generator=g) < 0.6)
    u = len(labels)
    idx = torch.randint(0, u, (2, extra), generator=g)
    m[idx[0], idx[1]] = True
    m |= torch.eye(u, dtype=torch.bool)
    if perm:
        p = torch.randperm(u, generator=g)
        m = m[p][:, p]
    return m


def qkv(u, b=2, h=3, d=8, dv=5, dtype=torch.float64, seed=1, heads_inner=False):
    """``[B, H, U, d]`` tensors; ``heads_inner``: laid out ``[B, U, H, d]`` in memory, as
    the attention projections produce them (the block-sparse path then avoids copies)."""
    g = torch.Generator().manual_seed(seed)
    if heads_inner:
        return [torch.randn(b, u, h, n, generator=g, dtype=dtype).transpose(1, 2) for n in (d, d, dv)]
    return [torch.randn(b, h, u, n, generator=g, dtype=dtype) for n in (d, d, dv)]


def dense(q, k, v, mask, bias=None, **kwargs):
    """What an edge-eliminated NAC computes now: the bias and the edge mask through ``attend``."""
    u = mask.shape[0]
    log_k = torch.zeros(1, 1, u, u, dtype=q.dtype) if bias is None else bias
    return attend(q, k, v, bias=log_k, key_mask=mask, **kwargs)


@pytest.mark.parametrize("sizes,bs", [([8, 8, 8], 8), ([5, 9, 4, 5], 8), ([10, 10, 10], 7), ([6, 11], 32)])
@pytest.mark.parametrize("perm", [False, True])
@pytest.mark.parametrize("bias_batch", [0, 1, 2])
@pytest.mark.parametrize("heads_inner", [False, True])
def test_matches_dense_masked_attend(sizes, bs, perm, bias_batch, heads_inner):
    mask = block_mask(sizes, extra=3, perm=perm)
    u = mask.shape[0]
    q, k, v = qkv(u, heads_inner=heads_inner)
    bias = None if bias_batch == 0 else torch.randn(bias_batch, 1, u, u, dtype=q.dtype)
    layout = BlockSparseLayout.from_mask(mask, bs)
    out = block_sparse_attend(q, k, v, layout, bias)
    torch.testing.assert_close(out, dense(q, k, v, mask, bias)[0], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("bias_batch", [1, 3])
def test_batch_chunked_gathers(monkeypatch, bias_batch):
    """Gathered keys are processed in batch chunks (to keep temporaries small): one example
    per chunk here, with empty block rows and padding."""
    import modwire.nn.block_sparse as bsp
    monkeypatch.setattr(bsp, "_CHUNK_BYTES", 1)
    mask = block_mask([7, 9, 8], extra=4, perm=True)
    mask[:5] = False
    q, k, v = qkv(24, b=3, heads_inner=True)
    bias = torch.randn(bias_batch, 1, 24, 24, dtype=q.dtype)
    for bs in (5, 8, 24):
        out = block_sparse_attend(q, k, v, BlockSparseLayout.from_mask(mask, bs), bias)
        torch.testing.assert_close(out, dense(q, k, v, mask, bias)[0], atol=1e-12, rtol=1e-12)


def test_float32_and_custom_scale():
    mask = block_mask([16, 16, 8], extra=5)
    q, k, v = qkv(40, dtype=torch.float32)
    bias = torch.randn(1, 1, 40, 40)
    layout = BlockSparseLayout.from_mask(mask, 16)
    ref = dense(q, k, v, mask, bias)[0]
    torch.testing.assert_close(block_sparse_attend(q, k, v, layout, bias), ref, atol=2e-6, rtol=1e-5)
    ref = attend(q, k, v, bias=bias.masked_fill(~mask, mask_value(q.dtype)), scale=0.3)[0]
    torch.testing.assert_close(block_sparse_attend(q, k, v, layout, bias, scale=0.3), ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("empty_block", [0, 3])
@pytest.mark.parametrize("heads_inner", [False, True])
def test_receivers_without_senders_get_zero(empty_block, heads_inner):
    mask = block_mask([6, 6, 6, 5], extra=2)
    rows = slice(6 * empty_block, 6 * empty_block + 6)
    mask[rows] = False         # a whole query block with no kept key block (first or last)
    mask[13] = False           # one row inside a kept block row
    u = mask.shape[0]
    q, k, v = qkv(u, heads_inner=heads_inner)
    bias = torch.randn(2, 1, u, u, dtype=q.dtype)
    layout = BlockSparseLayout.from_mask(mask, 6)
    assert layout.has_key is not None and not layout.has_key[13]
    out = block_sparse_attend(q, k, v, layout, bias)
    ref, _ = dense(q, k, v, mask, bias)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    assert out[:, :, rows].abs().max() == 0 and out[:, :, 13].abs().max() == 0


def test_mask_without_any_edge_gives_zeros():
    mask = torch.zeros(10, 10, dtype=torch.bool)
    q, k, v = qkv(10)
    layout = BlockSparseLayout.from_mask(mask, 4)
    assert layout.groups == [] and layout.density == 0.0
    out = block_sparse_attend(q, k, v, layout)
    assert out.shape == (2, 3, 10, 5) and out.abs().max() == 0
    torch.testing.assert_close(out, dense(q, k, v, mask)[0])
    out, w = attend(q, k, v, bias=BlockSparseBias.from_dense(None, mask, 4), return_weights=True)
    assert out.abs().max() == 0 and w.abs().max() == 0


def test_all_true_mask_is_plain_attention():
    u, mask = 21, torch.ones(21, 21, dtype=torch.bool)
    q, k, v = qkv(u)
    layout = BlockSparseLayout.from_mask(mask, 8)
    assert layout.density == 1.0 and layout.num_blocks == 3
    torch.testing.assert_close(block_sparse_attend(q, k, v, layout), attend(q, k, v)[0], atol=1e-12, rtol=1e-12)
    bias = torch.randn(1, 1, u, u, dtype=q.dtype)
    torch.testing.assert_close(block_sparse_attend(q, k, v, layout, bias), attend(q, k, v, bias=bias)[0],
                               atol=1e-12, rtol=1e-12)


def test_block_sparse_bias_through_attend_dispatch_and_weights():
    mask = block_mask([7, 9, 8], extra=4, perm=True)
    mask[3] = False
    u = mask.shape[0]
    q, k, v = qkv(u)
    log_k = torch.randn(1, 1, u, u, dtype=q.dtype)
    sparse = BlockSparseBias.from_dense(log_k, mask, 8)
    ref_out, ref_w = dense(q, k, v, mask, log_k, return_weights=True)
    out, w = attend(q, k, v, bias=sparse)
    assert w is None
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    out, w = attend(q, k, v, bias=sparse, return_weights=True)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=1e-12)
    # the kernel's own mask (key_mask [1, 1, U, U], e.g. truncation) is honoured too
    sparse = BlockSparseBias.from_dense(log_k, torch.ones_like(mask), 5, key_mask=mask[None, None])
    torch.testing.assert_close(attend(q, k, v, bias=sparse)[0], ref_out, atol=1e-12, rtol=1e-12)


def test_from_dense_falls_back_to_one_block_when_dense():
    mask = block_mask([12, 12], extra=40, seed=2)
    q, k, v = qkv(24)
    log_k = torch.randn(1, 1, 24, 24, dtype=q.dtype)
    forced = BlockSparseBias.from_dense(log_k, mask, 6, max_density=1.0)
    assert forced.layout.num_blocks == 4 and forced.layout.density > 0.5
    fallback = BlockSparseBias.from_dense(log_k, mask, 6)
    assert fallback.layout.num_blocks == 1 and fallback.layout.block_size == 24
    ref = dense(q, k, v, mask, log_k)[0]
    for sparse in (forced, fallback):
        torch.testing.assert_close(attend(q, k, v, bias=sparse)[0], ref, atol=1e-12, rtol=1e-12)


def test_processor_layer_and_gradients():
    torch.manual_seed(0)
    u, dim = 20, 16
    mask = block_mask([10, 10], extra=3)
    layer = TransformerBlock(dim, 2, 32, mod=ModulationSpec("nac", 8)).double()
    x = torch.randn(3, u, dim, dtype=torch.float64, requires_grad=True)
    codes = torch.randn(u, 8, dtype=torch.float64)
    log_k = torch.randn(1, 1, u, u, dtype=torch.float64)
    y_ref = layer(x, codes, bias=log_k, key_mask=mask)[0]
    g_ref = torch.autograd.grad(y_ref.square().sum(), x)[0]
    y = layer(x, codes, bias=BlockSparseBias.from_dense(log_k, mask, 8))[0]
    g = torch.autograd.grad(y.square().sum(), x)[0]
    torch.testing.assert_close(y, y_ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)


def test_gradient_reaches_the_dense_bias():
    """Training with a per-example (sampled) kernel: gradients wrt q, k, v and the bias match."""
    mask = block_mask([6, 9, 5], extra=4, perm=True)
    q, k, v = qkv(20, heads_inner=True)
    bias = torch.randn(2, 1, 20, 20, dtype=q.dtype)
    grads = []
    for fn in (lambda *a: dense(*a[:3], mask, a[3])[0],
               lambda *a: block_sparse_attend(*a[:3], BlockSparseLayout.from_mask(mask, 4), a[3])):
        inputs = [x.detach().requires_grad_() for x in (q, k, v, bias)]
        grads.append(torch.autograd.grad(fn(*inputs).square().sum(), inputs))
    for g_sparse, g_dense in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_sparse, g_dense, atol=1e-10, rtol=1e-10)


def test_density_of_block_diagonal_mask():
    layout = BlockSparseLayout.from_mask(block_mask([10] * 4), 10)
    assert layout.num_blocks == 4 and layout.density == pytest.approx(1 / 4)
    assert [tuple(g.cols.shape) for g in layout.groups] == [(4, 1)]
    layout = BlockSparseLayout.from_mask(block_mask([10] * 4), 20)
    assert layout.density == pytest.approx(1 / 2)


def test_block_order_recovers_blocks():
    mask = block_mask([12] * 5, perm=True, seed=3)
    assert BlockSparseLayout.from_mask(mask, 12).density > 0.5
    perm = block_order(mask)
    assert sorted(perm.tolist()) == list(range(60))
    assert BlockSparseLayout.from_mask(mask[perm][:, perm], 12).density == pytest.approx(1 / 5)


def test_order_by_groups_is_a_stable_sort():
    groups = torch.tensor([2, 0, 1, 0, 2, 1])
    perm = order_by_groups(groups)
    assert perm.tolist() == [1, 3, 2, 5, 0, 4]
    labels = torch.tensor([1, 0, 1, 0, 1, 0])
    m = labels[:, None] == labels[None, :]
    p = order_by_groups(labels)
    assert BlockSparseLayout.from_mask(m[p][:, p], 3).density == pytest.approx(1 / 2)


def test_clear_errors():
    with pytest.raises(ValueError, match="square"):
        BlockSparseLayout.from_mask(torch.ones(3, 4, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="bool"):
        BlockSparseLayout.from_mask(torch.ones(4, 4), 2)
    with pytest.raises(ValueError, match="block_size"):
        BlockSparseLayout.from_mask(torch.ones(4, 4, dtype=torch.bool), 0)
    layout = BlockSparseLayout.from_mask(torch.ones(6, 6, dtype=torch.bool), 4)
    q, k, v = qkv(7)
    with pytest.raises(ValueError, match=r"U=6.*got q \(2, 3, 7, 8\)"):
        block_sparse_attend(q, k, v, layout)
    q, k, v = qkv(6)
    with pytest.raises(ValueError, match=r"got q \(2, 3, 6, 8\), k \(2, 3, 5, 8\)"):
        block_sparse_attend(q, k[:, :, :5], v, layout)
    with pytest.raises(ValueError, match=r"bias must be \[B\|1, 1, 6, 6\].*\(1, 3, 6, 6\)"):
        block_sparse_attend(q, k, v, layout, torch.zeros(1, 3, 6, 6, dtype=q.dtype))
    with pytest.raises(ValueError, match="rcm"):
        block_order(torch.ones(4, 4, dtype=torch.bool), method="metis")
    with pytest.raises(ValueError, match="integer"):
        order_by_groups(torch.rand(5))
