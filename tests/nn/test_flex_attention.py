"""Issue 39, item 3: ``attend(backend="flex")`` (:mod:`modwire.nn.flex`) equals SDPA's math path, outputs
and gradients (of q, k, v and of the learned bias), for each learned bias of the library (NAC's ``log K̂``,
NI's and the ViT's relative positions), with and without masks; whole models give the same outputs and
gradients with either ``attention_backend``.

On the CPU torch (2.13) runs FlexAttention forwards only; its backward is refused there (a GPU runs the
fused one). Two fixtures make the CPU check everything quickly:

* ``eager_flex``: modwire's FlexAttention core runs uncompiled, i.e. torch's reference implementation
  (the same ``score_mod`` and block mask the compiled kernel gets), instead of compiling every shape
  with inductor (10-30 s each here; :func:`test_compiled_flex_on_the_cpu` does that once, ``slow``);
* ``cpu_backward``: lifts torch's CPU refusal and modwire's fallback, so torch's reference backward runs:
  the bias gradient that autograd derives from the ``score_mod`` is checked against the math path's.
"""
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
from torch.nn.attention import SDPBackend, sdpa_kernel

import modwire
from modwire.nn import flex
from modwire.nn.attention import attend
from modwire.nn.blocks import TransformerBlock
from modwire.nn.kernel import SignatureKernel
from modwire.nn.modulated import ModulationSpec
from modwire.nn.positions import RelativePositionBias, pad_bias

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_contract import make_inputs  # noqa: E402

B, H, D = 2, 3, 8
COMPILED = flex._compiled          # modwire's own (torch.compile of the core), before the fixture replaces it


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    calls = []

    def core(*args):
        calls.append(args)
        return flex._core(*args)
    monkeypatch.setattr(flex, "_compiled", lambda: core)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return calls


@pytest.fixture
def cpu_backward(monkeypatch):
    monkeypatch.setattr(torch_flex, "_validate_device", lambda q, k, v: None)
    monkeypatch.setattr(flex, "NO_BACKWARD", ())


def _math(*args, **kwargs):
    """``attend`` on SDPA's math kernel (the path a learned bias takes in training)."""
    with sdpa_kernel([SDPBackend.MATH]):
        return attend(*args, **kwargs)


def _check_equal(make, g, calls, **kw):
    """``make()`` → ``(q, k, v, bias, key_mask)`` leaves; flex vs math: outputs and every leaf's gradient
    (``calls``: the ``eager_flex`` fixture's record, which shows that FlexAttention ran)."""
    results = []
    for backend in ("flex", "sdpa"):
        q, k, v, bias, mask = make()
        out, _ = (attend if backend == "flex" else _math)(q, k, v, bias=bias, key_mask=mask, backend=backend, **kw)
        leaves = [t for t in (q, k, v, bias) if t is not None]
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(g))
        results.append((out, torch.autograd.grad(out, leaves, cot)))
    (out, grads), (ref, ref_grads) = results
    assert calls, "FlexAttention did not run"
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert ref.abs().max() > 0.1
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert b.abs().max() > 0


def _leaf(t):
    return t.detach().requires_grad_()


def _qkv(*lead, nq, nk, dk=D, dv=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [_leaf(torch.randn(*lead, n, d, generator=g)) for n, d in ((nq, dk), (nk, dk), (nk, dv))]


def _mask(shape, seed, empty_row=True):
    """A random bool mask; one query row with no allowed key (it must read zeros)."""
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    if empty_row:
        m[..., 1, :] = False
    return m


@pytest.mark.parametrize("masked", [False, True])
def test_nac_log_kernel(cpu_backward, eager_flex, masked):
    """NAC Eq. 3: ``log K̂`` ``[B, 1, U, U]`` (sampled per example, shared by the heads), with the kernel's
    truncation mask, as the propagators call it."""
    torch.manual_seed(0)
    u = 7
    kernel = SignatureKernel(truncation=0.9 if masked else None)       # train mode: a Concrete sample
    sig = torch.randn(u, 5)
    bias, mask = kernel(sig, sig, B)
    assert (mask is not None) == masked and (not masked or not mask.all())

    def make():
        return (*_qkv(B, H, nq=u, nk=u), _leaf(bias), mask)
    _check_equal(make, 1, eager_flex)


@pytest.mark.parametrize("masked", [False, True])
def test_ni_relative_positions(cpu_backward, eager_flex, masked):
    """NI Eq. 7 and App. C.2.3: per-function relative positions ``[U, H, N, N]`` (two CLS tokens at 0),
    kernel-modulated renormalised weights (``key_scale``, ``row_scale``: values augmented to ``dv + 1``)."""
    torch.manual_seed(0)
    u, grid, n = 3, (2, 3), 8
    pos = RelativePositionBias(grid, H, 4, mod=ModulationSpec("ni", 5))
    bias = pad_bias(pos(torch.randn(u, 5)), n)                          # [U, H, N, N]
    c = torch.rand(B, u, 1, n)
    mask = _mask((B, u, 1, n, n), 2) if masked else None

    def make():
        return (*_qkv(B, u, H, nq=n, nk=n, dk=16, dv=6), _leaf(bias), mask)
    _check_equal(make, 3, eager_flex, scale=0.25, key_scale=c, row_scale=c, renorm_eps=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_vit_relative_positions(cpu_backward, eager_flex, masked):
    """The ViT's relative positions ``[H, N, N]`` (NI App. C.2.3 Eq. 20-21), shared by the batch; masked:
    a padding mask ``[B, 1, 1, N]`` over the keys."""
    torch.manual_seed(0)
    bias = pad_bias(RelativePositionBias((2, 2), H, 4)(), 5)
    mask = _mask((B, 1, 1, 5), 4, empty_row=False) if masked else None

    def make():
        return (*_qkv(B, H, nq=5, nk=5), _leaf(bias), mask)
    _check_equal(make, 5, eager_flex)


@pytest.mark.parametrize("bias_shape,mask_shape", [
    ((5, 7), None), (None, (5, 7)), ((1, 5, 7), (2, 1, 7)), ((2, 1, 7), None),
])
def test_shapes_without_batch_axes_and_null_kv(cpu_backward, eager_flex, bias_shape, mask_shape):
    """Two- and three-axis calls, biases and masks broadcast over any axes; ``null_kv`` (NFM) pads both."""
    lead = (2,) if len(bias_shape or mask_shape) > 2 else ()
    for null_kv in (False, True):
        def make():
            g = torch.Generator().manual_seed(0)
            bias = None if bias_shape is None else _leaf(torch.randn(bias_shape, generator=g))
            mask = None if mask_shape is None else _mask(mask_shape, 6, empty_row=False)
            return (*_qkv(*lead, nq=5, nk=7, dk=20, dv=3), bias, mask)
        _check_equal(make, 7, eager_flex, null_kv=null_kv)


def test_causal_mask_as_a_block_mask(cpu_backward, eager_flex):
    """The LM's causal mask (a ``[T, T]`` tril) reaches FlexAttention as a block mask, not a bias."""
    torch.manual_seed(0)
    blocks = [TransformerBlock(16, 2, 32, causal=True, max_len=9, attention_backend=b) for b in ("sdpa", "flex")]
    blocks[1].load_state_dict(blocks[0].state_dict())
    x = torch.randn(2, 9, 16)
    ref, out = (blk(x)[0] for blk in blocks)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    (_, _, _, bias, mask, _, _), = eager_flex
    assert bias is None and mask.shape == (9, 9)


def test_cpu_training_takes_the_sdpa_path(eager_flex):
    """Without the fixture that lifts it, a CPU call that needs a gradient runs SDPA (torch has no CPU
    FlexAttention backward); without a gradient it runs FlexAttention."""
    q, k, v = _qkv(B, H, nq=4, nk=4)
    bias = _leaf(torch.randn(H, 4, 4))
    out, _ = attend(q, k, v, bias=bias, backend="flex")
    assert not eager_flex and out.requires_grad
    with torch.no_grad():
        got, _ = attend(q, k, v, bias=bias, backend="flex")
    assert len(eager_flex) == 1
    torch.testing.assert_close(got, out.detach(), atol=1e-5, rtol=1e-5)


LEARNED_BIAS = ["nac_micro", "ni_micro", "vit_micro"]


def _step(model, x, kw):
    torch.manual_seed(1)                                                 # NAC's Concrete sample
    out = model(x, **kw)
    out = out if torch.is_tensor(out) else out[0]
    out.float().square().mean().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", LEARNED_BIAS)
def test_models_equal_between_backends(name, cpu_backward, eager_flex):
    """A training step (forward, backward): same outputs and parameter gradients (the signatures' and
    the positions' through the learned bias)."""
    torch.manual_seed(0)
    ref_model = modwire.create_model(name)
    model = modwire.create_model(name, attention_backend="flex")
    model.load_state_dict(ref_model.state_dict())
    x, kw = make_inputs(model.config, seed=0)
    (ref, ref_grads), (out, grads) = _step(ref_model, x, kw), _step(model, x, kw)
    assert any(call[3] is not None and call[3].requires_grad for call in eager_flex)   # a learned bias, on flex
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device (benchmarks/gpu_checks.sh runs this)")
@pytest.mark.parametrize("name", LEARNED_BIAS)
def test_models_equal_between_backends_on_cuda(name, monkeypatch):
    """On a GPU: the compiled FlexAttention kernels, forward and backward (the bias gradient inside the
    fused backward), against SDPA, a training step of each model (fp32)."""
    monkeypatch.setattr(flex, "_compiled", COMPILED)
    torch.manual_seed(0)
    ref_model = modwire.create_model(name).cuda()
    model = modwire.create_model(name, attention_backend="flex").cuda()
    model.load_state_dict(ref_model.state_dict())
    x, kw = make_inputs(model.config, seed=0, device="cuda")
    (ref, ref_grads), (out, grads) = _step(ref_model, x, kw), _step(model, x, kw)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-4, rtol=1e-3, msg=n)


def test_config_field_is_validated():
    for name in ("nac_micro", "ni_micro", "vit_micro", "ait_micro"):
        with pytest.raises(ValueError, match="attention_backend.*'sdpa', 'flex'"):
            modwire.create_model(name, attention_backend="triton")
    q, k, v = _qkv(nq=2, nk=2)
    with pytest.raises(ValueError, match="backend must be one of"):
        attend(q, k, v, backend="flash")


@pytest.mark.slow
def test_compiled_flex_on_the_cpu(monkeypatch):
    """The compiled FlexAttention modwire runs outside a compiled model (inductor's CPU kernel; no gradient
    on the CPU), a masked call with a per-example bias: equal to the math path. (Whole models compile with
    FlexAttention under ``aot_eager`` in ``tests/test_compile.py``; inductor fails to lower it inside a
    whole model on the CPU, ``benchmarks/results/flex_cpu_compiled.json``.)"""
    monkeypatch.setattr(flex, "_compiled", COMPILED)
    q, k, v = _qkv(B, H, nq=9, nk=9)
    bias, mask = torch.randn(B, 1, 9, 9), _mask((B, 1, 9, 9), 8)
    with torch.no_grad():
        out, _ = attend(q, k, v, bias=bias, key_mask=mask, backend="flex")
        ref, _ = _math(q, k, v, bias=bias, key_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
