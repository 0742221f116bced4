"""NI App. C.2.3 Eq. 20-24 (``modwire.nn.positions``) against a literal loop over heads, functions
and token pairs."""
import pytest
import torch

from modwire.nn.modulated import ModulationSpec
from modwire.nn.positions import RelativePositionBias, pad_bias
from reference.nac import modlin

GRID, H, P, U, DC = (2, 3), 2, 4, 3, 5


def _literal(m: RelativePositionBias, codes=None):
    rows, cols = m.grid
    pos = [(i, j) for i in range(rows) for j in range(cols)]           # row-major grid tokens
    out = torch.zeros((U,) * (codes is not None) + (H, len(pos), len(pos)), dtype=m.e_row.dtype)
    for h in range(H):
        for a, (i1, j1) in enumerate(pos):
            for b, (i2, j2) in enumerate(pos):
                er, ec = m.e_row[i2 - i1 + rows - 1], m.e_col[j2 - j1 + cols - 1]
                shared = m.w_row.weight[h] @ er + m.w_col.weight[h] @ ec   # Eq. 20 + 21
                if codes is None:
                    out[h, a, b] = shared
                    continue
                for u in range(U):                                      # Eq. 22-24
                    p_row = modlin(er, codes[u], m.f_row.weight, m.f_row.bias, m.f_row.code_proj)[h]
                    p_col = modlin(ec, codes[u], m.f_col.weight, m.f_col.bias, m.f_col.code_proj)[h]
                    out[u, h, a, b] = (p_row + m.w_row.weight[h] @ er) + (p_col + m.w_col.weight[h] @ ec)
    return out


def test_shared_bias_matches_eq20_21():
    torch.manual_seed(0)
    m = RelativePositionBias(GRID, H, P).double()
    torch.testing.assert_close(m(), _literal(m), rtol=0, atol=1e-12)


def test_per_function_bias_matches_eq22_24():
    torch.manual_seed(1)
    m = RelativePositionBias(GRID, H, P, mod=ModulationSpec("ni", DC)).double()
    codes = torch.randn(U, DC, dtype=torch.float64)
    out = m(codes)
    assert out.shape == (U, H, 6, 6)
    torch.testing.assert_close(out, _literal(m, codes), rtol=0, atol=1e-12)
    # functions differ: the per-function term is not a constant
    assert (out[0] - out[1]).abs().max() > 1e-3


def test_pad_bias_gives_cls_tokens_zero():
    b = torch.randn(H, 6, 6)
    p = pad_bias(b, 8)
    assert p.shape == (H, 8, 8) and torch.equal(p[:, :6, :6], b)
    assert p[:, 6:].abs().max() == 0 and p[:, :, 6:].abs().max() == 0
    with pytest.raises(ValueError, match="covers 6 tokens"):
        pad_bias(b, 5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind 'ni'"):
        RelativePositionBias(GRID, H, P, mod=ModulationSpec("nac", DC))
    with pytest.raises(ValueError, match="per-function"):
        RelativePositionBias(GRID, H, P)(torch.randn(U, DC))
