"""Feature map, short conv, S4D init/discretisation and the readout Gram vs their definitions."""

from __future__ import annotations

import math

import pytest
import torch

from idmix.functional import (
    complex_A,
    discretize,
    log_uniform_dt,
    readout_gram,
    s4d_inv_init,
    s4d_lin_init,
    short_conv,
    short_conv_naive,
    short_conv_step,
    silu_l2_feature_map,
    silu_l2_feature_map_naive,
)
from tests.helpers import assert_rel


def test_feature_map_unit_norm_and_zero_safe():
    x = torch.randn(4, 7, 3, 16, dtype=torch.float64)
    y = silu_l2_feature_map(x)
    assert torch.allclose(y.norm(dim=-1), torch.ones(4, 7, 3, dtype=torch.float64))
    assert_rel(y, silu_l2_feature_map_naive(x), 1e-12)
    z = silu_l2_feature_map(torch.zeros(2, 8))
    assert torch.equal(z, torch.zeros(2, 8))
    assert torch.isfinite(silu_l2_feature_map(torch.full((2, 8), -1e4))).all()


@pytest.mark.parametrize("T", [1, 3, 17])
def test_short_conv_matches_naive_and_streams(T):
    x, w, b = torch.randn(2, T, 5), torch.randn(5, 4), torch.randn(5)
    cache = torch.randn(2, 3, 5)
    y, new_cache = short_conv(x, w, b, cache)
    assert_rel(y, short_conv_naive(x, w, b, cache), 1e-6)
    assert torch.equal(new_cache, torch.cat([cache, x], 1)[:, -3:])
    c, outs = cache, []
    for t in range(T):
        o, c = short_conv_step(x[:, t], w, b, c)
        outs.append(o)
    assert_rel(torch.stack(outs, 1), y, 1e-6)
    assert torch.equal(c, new_cache)


def test_short_conv_split_equals_one_pass():
    x, w, b = torch.randn(1, 20, 4), torch.randn(4, 4), torch.randn(4)
    y, _ = short_conv(x, w, b)
    y1, c = short_conv(x[:, :7], w, b)
    y2, _ = short_conv(x[:, 7:], w, b, c)
    assert_rel(torch.cat([y1, y2], 1), y, 1e-6)


def test_short_conv_is_causal():
    x, w = torch.randn(1, 10, 3), torch.randn(3, 4)
    y, _ = short_conv(x, w)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    assert torch.equal(short_conv(x2, w)[0][:, :6], y[:, :6])


def test_s4d_inits():
    log_re, im = s4d_inv_init(3, 8)
    A = complex_A(log_re, im)
    assert torch.allclose(A.real, torch.full((3, 8), -0.5))
    n = torch.arange(8.0)
    assert torch.allclose(A.imag[1], (8 / math.pi) * (8 / (2 * n + 1) - 1))
    log_re, im = s4d_lin_init(2, 4)
    assert torch.allclose(im[0], math.pi * torch.arange(4.0))
    dt = torch.exp(log_uniform_dt(1000, 1e-3, 1e-1))
    assert dt.min() >= 1e-3 - 1e-9 and dt.max() <= 1e-1 + 1e-9
    assert abs(torch.log(dt).mean().item() - math.log(1e-2)) < 0.2


def test_discretize_formulas():
    dt = torch.tensor([0.1, 0.02], dtype=torch.float64)
    A = torch.tensor([[-0.5 + 3j, -1.0 - 1j], [-2.0 + 0j, -0.1 + 10j]], dtype=torch.complex128)
    lam, beta = discretize(dt, A, "zoh")
    for h in range(2):
        for m in range(2):
            a = complex(A[h, m])
            lam_ref = complex(math.e ** (dt[h].item() * a.real)) * complex(
                math.cos(dt[h].item() * a.imag), math.sin(dt[h].item() * a.imag)
            )
            assert abs(complex(lam[h, m]) - lam_ref) < 1e-12
            assert abs(complex(beta[h, m]) - (lam_ref - 1) / a) < 1e-12
    lam, beta = discretize(dt, A, "bilinear")
    a, d = complex(A[0, 0]), dt[0].item()
    assert abs(complex(lam[0, 0]) - (1 + d * a / 2) / (1 - d * a / 2)) < 1e-12
    assert abs(complex(beta[0, 0]) - d / (1 - d * a / 2)) < 1e-12


@pytest.mark.parametrize("readout", ["conj", "product"])
def test_readout_gram_reproduces_complex_readout(readout):
    """X̂ᵥᵀ Ĝ X̂ₖ q == Re(Γᴴ U q) (conj) or Re(Γᵀ U q) (product), Γ = C Xᵥ, U = C Xₖ."""
    H, M, R, D = 2, 5, 3, 4
    C = torch.randn(H, M, M, dtype=torch.complex128)
    Xk = torch.randn(H, M, R, dtype=torch.complex128)
    Xv = torch.randn(H, M, D, dtype=torch.complex128)
    q = torch.randn(H, R, 1, dtype=torch.complex128)
    a = C @ Xk @ q
    Gam = C @ Xv
    ref = ((Gam.conj().mT if readout == "conj" else Gam.mT) @ a).real.squeeze(-1)
    G_hat = readout_gram(C, readout)

    def interleave(X):  # (H, M, n) complex -> (H, 2M, n): rows Re X₀, Im X₀, Re X₁, …
        return torch.view_as_real(X).transpose(-1, -2).reshape(H, 2 * M, -1)

    p, Xv_hat = interleave(Xk @ q), interleave(Xv)
    got = (Xv_hat.mT @ G_hat @ p).squeeze(-1)
    assert_rel(got, ref, 1e-12)
    if readout == "conj":
        assert torch.allclose(G_hat, G_hat.mT)
        assert torch.linalg.eigvalsh(G_hat).min() > -1e-9


def test_rope_matches_reference_and_preserves_norms():
    from idmix.functional.rope import rope, rope_naive

    x = torch.randn(2, 9, 3, 8)
    pos = torch.randint(0, 5000, (2, 9))
    assert_rel(rope(x, pos), rope_naive(x, pos), 1e-5)
    assert torch.allclose(rope(x, pos).norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.equal(rope(x, torch.zeros(9, dtype=torch.long)), x)
    with pytest.raises(ValueError, match="rope needs an even last dim"):
        rope(torch.randn(1, 2, 1, 3), torch.zeros(2, dtype=torch.long))
