"""The S4D-only readout (FFT and the chunked document-aware form) and the real-form entry
points the layers use, against their references: outputs, final states, gradients, fp64."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from idmix.functional import (
    complex_A,
    discretize,
    discretize_real,
    interdomain_attention,
    interdomain_decode_step,
    readout_gram,
    readout_gram_real,
)
from idmix.functional.interdomain.layout import interleaved_to_state, state_to_interleaved
from idmix.functional.s4d_readout import s4d_linear_readout, s4d_linear_readout_naive
from tests.helpers import assert_rel, make_problem

# every op here runs with fresh allocations poisoned to NaN (tests/helpers.PoisonEmpty)
pytestmark = pytest.mark.usefixtures("poison")


def s4d_problem(B, T, H=2, C=3, M=5, seed=0):
    p = make_problem(B=B, T=T, H=H, R=C, D=1, M=M, seed=seed)
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(H, M, dtype=torch.complex128, generator=g)
    X0 = torch.randn(B, H, M, C, dtype=torch.complex128, generator=g)
    reset = torch.rand(B, T, generator=g) < 0.05
    reset[0, T // 2] = True
    if B > 1:
        reset[1] = False  # one row with no document start
    return p["k"], p["lam"], p["beta"], c, X0, reset


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130, 200])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("with_reset", [False, True])
def test_s4d_readout_matches_recurrence(T, with_state, with_reset):
    z, lam, beta, c, X0, reset = s4d_problem(3, T)
    X0 = X0 if with_state else None
    reset = reset if with_reset else None
    leaves = [t.clone().requires_grad_() for t in (z, lam, beta, c)]
    y, X = s4d_linear_readout(*leaves, X0, True, reset)
    ref_leaves = [t.clone().requires_grad_() for t in (z, lam, beta, c)]
    y_ref, X_ref = s4d_linear_readout_naive(*ref_leaves, X0, reset)
    assert_rel(y, y_ref, 1e-10, "y")
    assert_rel(X, X_ref, 1e-10, "final state")
    g = torch.randn_like(y)
    loss = (y * g).sum() + torch.view_as_real(X).sum()
    loss_ref = (y_ref * g).sum() + torch.view_as_real(X_ref).sum()
    for a, b, name in zip(
        torch.autograd.grad(loss, leaves),
        torch.autograd.grad(loss_ref, ref_leaves),
        ("z", "lam", "beta", "c"),
        strict=True,
    ):
        assert_rel(a, b, 1e-9, f"grad {name}")


def test_s4d_readout_with_resets_gradcheck():
    z, lam, beta, c, X0, reset = s4d_problem(2, 9, H=1, C=2, M=2)
    reset[0, 4] = True
    args = [t.clone().requires_grad_() for t in (z, lam, beta, c, X0)]

    def fn(z, lam, beta, c, X0):
        from idmix.functional import s4d_readout

        y, X = s4d_readout._chunked_with_resets(z, lam, beta, c, X0, reset, L=4)
        return y, torch.view_as_real(X)

    assert gradcheck(fn, args)


def test_real_discretisation_and_gram_equal_the_complex_ones():
    g = torch.Generator().manual_seed(1)
    log_re = torch.randn(3, 7, dtype=torch.float64, generator=g)
    im = 30 * torch.randn(3, 7, dtype=torch.float64, generator=g)
    dt = torch.tensor([1e-3, 1e-2, 0.5], dtype=torch.float64)
    for method in ("zoh", "bilinear"):
        lam, beta = discretize(dt, complex_A(log_re, im), method)
        lam_ri, beta_ri = discretize_real(dt, log_re, im, method)
        assert_rel(lam_ri, torch.view_as_real(lam), 1e-14, f"lam {method}")
        assert_rel(beta_ri, torch.view_as_real(beta), 1e-13, f"beta {method}")
    C = torch.randn(3, 7, 7, dtype=torch.complex128, generator=g)
    for readout in ("conj", "product"):
        assert_rel(readout_gram_real(C.real, C.imag, readout), readout_gram(C, readout), 1e-14)


def test_fp32_beta_keeps_its_digits_for_small_steps():
    """β = (λ - 1)/A in fp32 without cancellation at Δ = 1e-4 (expm1 form)."""
    log_re, im = torch.full((1, 4), -0.69), torch.tensor([[0.0, 1.0, 10.0, 100.0]])
    dt = torch.tensor([1e-4])
    lam, beta = discretize(dt.double(), complex_A(log_re.double(), im.double()))
    _, beta_ri = discretize_real(dt, log_re, im)
    assert_rel(beta_ri, torch.view_as_real(beta), 1e-6, "beta fp32")


@pytest.mark.parametrize("T", [1, 37])
def test_real_entry_points_equal_the_complex_ones(T):
    p = make_problem(B=2, T=T, H=2, R=4, D=3, M=5)
    Z0 = state_to_interleaved(*p["initial_state"])
    lam_ri, beta_ri = torch.view_as_real(p["lam"]), torch.view_as_real(p["beta"])
    G = readout_gram(p["C"])
    reset = torch.zeros(2, T, dtype=torch.bool)
    reset[0, T // 2] = True
    o, Z = interdomain_attention(
        p["q"],
        p["k"],
        p["v"],
        lam_ri,
        beta_ri,
        G,
        initial_state=Z0,
        chunk_size=16,
        reset=reset,
        output_final_state=True,
    )
    o_ref, (Xk, Xv) = interdomain_attention(
        p["q"],
        p["k"],
        p["v"],
        p["lam"],
        p["beta"],
        p["C"],
        initial_state=p["initial_state"],
        chunk_size=16,
        reset=reset,
        output_final_state=True,
    )
    assert_rel(o, o_ref, 1e-12, "o")
    assert_rel(Z, state_to_interleaved(Xk, Xv), 1e-12, "state")
    # the in-place real step equals the complex functional step
    state = Z.clone()
    o_step = interdomain_decode_step(
        p["q"][:, 0], p["k"][:, 0], p["v"][:, 0], lam_ri, beta_ri, G, state, inplace=True
    )[0]
    o_c, new = interdomain_decode_step(
        p["q"][:, 0], p["k"][:, 0], p["v"][:, 0], p["lam"], p["beta"], G, (Xk, Xv)
    )
    assert_rel(o_step, o_c, 1e-12, "step o")
    for a, b in zip(interleaved_to_state(state, 4), new, strict=True):
        assert_rel(a, b, 1e-12, "step state")


def test_real_entry_point_errors_name_the_argument():
    p = make_problem(B=1, T=4, H=2, R=3, D=3, M=4)
    lam_ri, beta_ri = torch.view_as_real(p["lam"]), torch.view_as_real(p["beta"])
    G = readout_gram(p["C"])
    args = (p["q"], p["k"], p["v"])
    with pytest.raises(ValueError, match=r"lam: expected \(H, M, 2\)"):
        interdomain_attention(*args, lam_ri[:1], beta_ri, G)
    with pytest.raises(ValueError, match=r"C: expected \(H, 2M, 2M\)"):
        interdomain_attention(*args, lam_ri, beta_ri, G[:, :4])
    with pytest.raises(ValueError, match=r"initial_state: expected \(B, H, R\+D, 2M\)"):
        interdomain_attention(*args, lam_ri, beta_ri, G, initial_state=torch.zeros(1, 2, 6, 4))
    with pytest.raises(ValueError, match=r"state: expected a contiguous"):
        interdomain_decode_step(
            p["q"][:, 0],
            p["k"][:, 0],
            p["v"][:, 0],
            lam_ri,
            beta_ri,
            G,
            torch.zeros(1, 2, 8, 6).mT,
            inplace=True,
        )[0]
