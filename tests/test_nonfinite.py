"""A NaN or inf reaches only its own head's positions from t to the end of its document, in every
implementation (chunked, closed form, naive, recurrent, the real form, varlen, the layer's
decode cache), forward and backward; everything else equals the run on finite inputs."""

from __future__ import annotations

import pytest
import torch

from idmix.functional import interdomain_attention, readout_gram
from idmix.functional.interdomain import state_to_interleaved
from tests.helpers import make_problem, tiny_model

# every op here runs with fresh allocations poisoned to NaN (tests/helpers.PoisonEmpty)
pytestmark = pytest.mark.usefixtures("poison")

B, T, H, R, D, M = 2, 37, 2, 3, 4, 5
STARTS = [0, 12, 25]  # documents of row 0: [0, 12), [12, 25), [25, 37); row 1 is one document
IMPLS = ["chunked", "closed_form", "naive", "recurrent"]
EXACT = {"chunked", "closed_form", "recurrent"}  # sanitised: head-granular poison; the literal
# naive reference may leave some channels finite


@pytest.fixture(scope="module")
def base():
    p = make_problem(B=B, T=T, H=H, R=R, D=D, M=M, dtype=torch.float64)
    reset = torch.zeros(B, T, dtype=torch.bool)
    reset[0, STARTS] = True
    return p, reset


def run(p, reset, impl, **over):
    a = {**p, **over}
    return interdomain_attention(
        a["q"],
        a["k"],
        a["v"],
        a["lam"],
        a["beta"],
        a["C"],
        initial_state=a["initial_state"],
        chunk_size=8,
        impl=impl,
        reset=reset,
        output_final_state=True,
    )


def with_value(x, index, value):
    y = x.clone()
    y[index] = value
    return y


def region(b, t, h, *, to):
    """(B, T, H) bool: row b, head h, positions t..to-1."""
    m = torch.zeros(B, T, H, dtype=torch.bool)
    m[b, t:to, h] = True
    return m


# Untouched positions, states and gradients measured bit-identical to the finite run (0 error in
# float64; the S4D FFT path 1.7e-17), so they are compared at atol 1e-15.
CASES = {  # name: (tensor, index, affected region)
    "k in document 2": ("k", (0, 15, 1, 2), region(0, 15, 1, to=25)),
    "v in document 1": ("v", (0, 3, 0, 1), region(0, 3, 0, to=12)),
    "q only at t": ("q", (0, 30, 1, 0), region(0, 30, 1, to=31)),
    "k in one long row": ("k", (1, 20, 0, 0), region(1, 20, 0, to=T)),
}


@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"]
)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl", IMPLS)
def test_forward_reaches_only_later_positions_of_its_document(base, impl, case, bad):
    p, reset = base
    name, index, affected = CASES[case]
    clean_o, clean_s = run(p, reset, impl)
    o, s = run(p, reset, impl, **{name: with_value(p[name], index, bad)})
    hit = ~torch.isfinite(o).all(dim=-1)  # (B, T, H)
    assert hit[index[:3]], "the bad position itself must be non-finite"
    assert not (hit & ~affected).any(), "a non-finite value escaped its document, head or past"
    if impl in EXACT:
        assert torch.equal(hit, affected)
    keep = ~affected[..., None].expand_as(o)
    torch.testing.assert_close(o[keep], clean_o[keep], rtol=0, atol=1e-15)
    # final states: a head's is non-finite iff its last document is hit, else untouched
    for b in range(B):
        for h in range(H):
            if affected[b, -1, h] and name != "q":
                assert any(not torch.isfinite(x[b, h]).all() for x in s)
            else:
                for x, clean in zip(s, clean_s, strict=True):
                    torch.testing.assert_close(x[b, h], clean[b, h], rtol=0, atol=1e-15)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_bad_initial_state_poisons_only_until_the_first_reset(base, impl):
    p, reset = base
    Xk = p["initial_state"][0].clone()
    Xk[0, 1, 2, 0] = float("nan")  # row 0, head 1: its first document ends at 0 (reset at 0)
    Xk[1, 0, 0, 1] = float("inf")  # row 1, head 0: one document, all of it
    clean_o, _ = run(p, reset, impl)
    o, _ = run(p, reset, impl, initial_state=(Xk, p["initial_state"][1]))
    hit = ~torch.isfinite(o).all(dim=-1)
    assert not (hit & ~region(1, 0, 0, to=T)).any()
    assert hit[1, :, 0].all() if impl in EXACT else hit[1, 0, 0]
    keep = ~region(1, 0, 0, to=T)[..., None].expand_as(o)
    torch.testing.assert_close(o[keep], clean_o[keep], rtol=0, atol=1e-15)


@pytest.mark.parametrize("impl", IMPLS)
def test_backward_is_finite_and_other_documents_keep_their_gradients(base, impl):
    p, reset = base

    def grads(k_value):
        leaves = {n: p[n].clone().requires_grad_() for n in ("q", "k", "v")}
        k = with_value(leaves["k"], (0, 15, 1, 2), k_value)
        o, _ = run(p, reset, impl, q=leaves["q"], k=k, v=leaves["v"])
        weights = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
        torch.where(torch.isfinite(o), o * weights, 0).sum().backward()
        return {n: x.grad for n, x in leaves.items()}

    bad, clean = grads(float("nan")), grads(0.0)
    other = torch.ones(B, T, H, dtype=torch.bool)
    other[0, 12:25, 1] = False  # the poisoned document's head
    for n in ("q", "k", "v"):
        # the literal naive reference's autograd forms 0·NaN inside the poisoned document (its
        # earlier positions included), never in another document or head; the sanitised
        # implementations give finite gradients everywhere
        if impl in EXACT:
            assert torch.isfinite(bad[n]).all(), n
        else:
            assert torch.isfinite(bad[n][other]).all(), n
        torch.testing.assert_close(bad[n][other], clean[n][other], rtol=0, atol=1e-15)


def test_real_form_and_varlen(base):
    p, reset = base
    lam_ri, beta_ri = (torch.view_as_real(p[n]).contiguous() for n in ("lam", "beta"))
    G = readout_gram(p["C"], "conj")
    k = with_value(p["k"], (0, 15, 1, 2), float("nan"))
    Z0 = state_to_interleaved(*p["initial_state"])
    o, Z = interdomain_attention(
        p["q"],
        k,
        p["v"],
        lam_ri,
        beta_ri,
        G,
        initial_state=Z0,
        chunk_size=8,
        reset=reset,
        output_final_state=True,
    )
    assert torch.equal(~torch.isfinite(o).all(-1), region(0, 15, 1, to=25))
    assert torch.isfinite(Z).all()
    cu = torch.tensor(STARTS + [T])
    ov = interdomain_attention(
        p["q"][:1], k[:1], p["v"][:1], p["lam"], p["beta"], p["C"], cu_seqlens=cu, chunk_size=8
    )[0]
    assert torch.equal(~torch.isfinite(ov[0]).all(-1), region(0, 15, 1, to=25)[0])


@pytest.mark.parametrize("mixer", ["interdomain", "s4d"])
def test_a_layer_cache_forgets_a_poisoned_document(mixer):
    """Decoding: a NaN input poisons the state; a new document (position 0) starts clean."""
    model, _ = tiny_model(mixer)
    attn = model.layers[0].attn
    attn.setup_cache(1, torch.float32, 64)
    x = torch.randn(1, 4, attn.embed_dim)
    x[0, 1, 0] = float("nan")
    assert not torch.isfinite(attn(x, input_pos=torch.arange(4)[None])).all()
    fresh = torch.randn(1, 3, attn.embed_dim)
    out = attn(fresh, input_pos=torch.arange(3)[None])
    attn.reset_cache()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, attn(fresh, input_pos=torch.arange(3)[None]))


@pytest.mark.parametrize("with_reset", [False, True], ids=["fft", "packed"])
def test_s4d_linear_readout_contains_too(base, with_reset):
    from idmix.functional.s4d_readout import s4d_linear_readout

    p, reset = base
    reset = reset if with_reset else None
    z = torch.cat([p["k"], p["v"]], dim=-1)
    c = p["C"][:, 0]
    bad = with_value(z, (0, 15, 1, 2), float("nan"))
    clean_y, clean_X = s4d_linear_readout(
        z, p["lam"], p["beta"], c, return_final_state=True, reset=reset
    )
    y, X = s4d_linear_readout(bad, p["lam"], p["beta"], c, return_final_state=True, reset=reset)
    affected = region(0, 15, 1, to=25 if with_reset else T)
    assert torch.equal(~torch.isfinite(y).all(-1), affected)
    keep = ~affected[..., None].expand_as(y)
    torch.testing.assert_close(y[keep], clean_y[keep], rtol=0, atol=1e-15)
    assert torch.isfinite(X).all() == (not affected[:, -1].any())


def test_containment_path_is_exact_on_finite_inputs(base, monkeypatch):
    """Compiled graphs and GPU tensors always take the containing path (no host sync to skip
    it): on finite inputs it changes nothing, gradients included."""
    from idmix.functional.interdomain import numerics

    p, reset = base
    leaves = lambda: {n: p[n].clone().requires_grad_() for n in ("q", "k", "v")}  # noqa: E731
    results = []
    for forced in (False, True):
        if forced:
            monkeypatch.setattr(numerics, "check_values", lambda x: False)
        x = leaves()
        o, s = run(p, reset, "chunked", **x)
        (o.square().sum() + s[1].abs().sum()).backward()
        results.append((o, *s, *(t.grad for t in x.values())))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("seed", range(6))
def test_poisoned_rows_by_parallel_counts_equal_a_walk_along_t(seed):
    """``numerics._poisoned`` (cumulative counts and a gather at each document's start) marks
    exactly the positions a walk along T would: a bad position at or before t in t's document,
    or a bad initial state while document 0 lasts."""
    from idmix.functional.interdomain.numerics import _poisoned

    g = torch.Generator().manual_seed(seed)
    Bs, Ts, Hs = 3, 29, 2
    bad = torch.rand(Bs, Ts, Hs, generator=g) < 0.05
    reset = torch.rand(Bs, Ts, generator=g) < 0.15 if seed % 3 else None
    bad_init = torch.rand(Bs, Hs, generator=g) < 0.4 if seed % 2 else None
    expected = torch.zeros(Bs, Ts, Hs, dtype=torch.bool)
    for b in range(Bs):
        for h in range(Hs):
            on, doc = bool(bad_init[b, h]) if bad_init is not None else False, 0
            for t in range(Ts):
                if reset is not None and reset[b, t]:
                    on, doc = False, doc + 1
                on = on or bool(bad[b, t, h])
                expected[b, t, h] = on
    assert torch.equal(_poisoned(bad, reset, bad_init), expected)
