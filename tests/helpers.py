"""Shared test utilities: problem factories, relative-error checks, NaN-poisoned allocations."""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from idmix.functional import complex_A, discretize, s4d_inv_init

aten = torch.ops.aten


def rel_rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (fla-style relative RMSE); complex tensors compared as reals."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    a, b = a.double(), b.double()
    denom = b.norm().item()
    return (a - b).norm().item() / max(denom, 1e-30)


def max_rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over every position, relative to b's RMS: one bad position (a head off by
    1%, one row of the wrong chunk) shows here even when the whole-tensor RMSE is small."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    a, b = a.double(), b.double()
    if b.numel() == 0:
        return 0.0
    return (a - b).abs().max().item() / max(b.pow(2).mean().sqrt().item(), 1e-30)


# Tolerances set from the measured error of each comparison (tests/test_reference_ladder.py):
# fp64 implementations agree to ~1e-14 (relative RMSE ≤ 6e-15, worst position 3e-14); fp32
# against the fp64 reference to ≤ 4e-6 RMSE, 3e-5 at the worst position (T ≤ 500).
TOL_FP64 = 5e-13
TOL_FP32 = 1e-4


def assert_rel(a, b, tol: float, what: str = "", max_tol: float | None = None) -> None:
    """Relative RMSE ≤ tol and the worst position ≤ max_tol (10·tol unless given)."""
    err = rel_rmse(a, b)
    assert math.isfinite(err) and err <= tol, f"{what}: relative RMSE {err:.3e} > {tol:.1e}"
    worst, bound = max_rel_error(a, b), 10 * tol if max_tol is None else max_tol
    assert worst <= bound, f"{what}: worst position {worst:.3e} > {bound:.1e} (of b's RMS)"


def make_problem(
    B=2,
    T=37,
    H=2,
    R=5,
    D=7,
    M=6,
    dtype=torch.float64,
    dt_range=(1e-3, 1e-1),
    seed=0,
    with_state=True,
):
    """Random inputs of the interdomain op with S4D-Inv dynamics and a generic complex C.

    Returns dict(q, k, v, lam, beta, C, initial_state).
    """
    g = torch.Generator().manual_seed(seed)
    cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    log_re, im = s4d_inv_init(H, M)
    A = complex_A(log_re.double(), im.double())
    lo, hi = math.log(dt_range[0]), math.log(dt_range[1])
    dt = torch.exp(lo + (hi - lo) * torch.rand(H, generator=g, dtype=torch.float64))
    lam, beta = discretize(dt, A)
    C = torch.complex(randn(H, M, M), randn(H, M, M)) / M
    state = None
    if with_state:
        state = (
            torch.complex(randn(B, H, M, R), randn(B, H, M, R)).to(cdtype),
            torch.complex(randn(B, H, M, D), randn(B, H, M, D)).to(cdtype),
        )
    return dict(
        q=randn(B, T, H, R).to(dtype),
        k=randn(B, T, H, R).to(dtype),
        v=randn(B, T, H, D).to(dtype),
        lam=lam.to(cdtype),
        beta=beta.to(cdtype),
        C=C.to(cdtype),
        initial_state=state,
    )


class PoisonEmpty(TorchDispatchMode):
    """Fill every fresh uninitialised allocation (empty, empty_like, new_empty, …) with NaN, so
    that an output an op forgets to write in full shows up as NaN."""

    EMPTY = {
        aten.empty.memory_format,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.empty_strided.default,
        aten.new_empty_strided.default,
    }

    def __init__(self):
        super().__init__()
        self.poisoned = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "idmix":  # our custom ops: run their Python bodies under the mode
            from torch._library.custom_ops import OPDEFS

            with self:
                return OPDEFS[func._schema.name]._init_fn(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if func in self.EMPTY and (out.is_floating_point() or out.is_complex()):
            out.fill_(float("nan"))
            self.poisoned += 1
        return out


TINY = dict(vocab_size=4096, num_layers=1, num_heads=2, embed_dim=32, max_seq_len=512)


def tiny_model(mixer: str = "interdomain", seed: int = 0, **overrides):
    """A one-block decoder over the embedded corpus's 4096-token vocabulary, in eval mode."""
    from idmix.models import decoder

    kw = {**TINY, "mixer": mixer, **overrides}
    if mixer != "softmax":
        kw.setdefault("num_modes", 4)
    torch.manual_seed(seed)
    return decoder(**kw).eval(), {"_component_": "idmix.models.decoder", **kw}


def save_tiny_export(path, mixer: str = "interdomain", seed: int = 0, **overrides):
    """A model_final.pt export (state dict + config) of tiny_model; returns the model."""
    model, config = tiny_model(mixer, seed, **overrides)
    torch.save({"model": model.state_dict(), "model_config": config}, path)
    return model


def decoder_alias(**kwargs):
    """A builder outside idmix.models (as a user's own would be), for the trust-list test."""
    from idmix.models import decoder

    return decoder(**kwargs)


def selective_problem(B=2, T=37, H=2, R=4, D=3, M=5, dt_range=(1e-3, 1.0), seed=0):
    """make_problem's inputs with per-token decays from a random Δ_t per (row, position, head)."""
    p = make_problem(B=B, T=T, H=H, R=R, D=D, M=M, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    lo, hi = (torch.tensor(x, dtype=torch.float64).log() for x in dt_range)
    dt = torch.exp(lo + (hi - lo) * torch.rand(B, T, H, 1, generator=g, dtype=torch.float64))
    A = complex_A(*(x.double() for x in s4d_inv_init(H, M)))
    p["lam"] = torch.exp(dt * A)
    p["beta"] = (p["lam"] - 1) / A
    return p


def reset_mask(B, T, *positions):
    """A (B, T) document-start mask with True at each (row, t) given."""
    r = torch.zeros(B, T, dtype=torch.bool)
    for b, t in positions:
        r[b, t] = True
    return r


def random_resets(B, T, seed, p=0.1):
    """A (B, T) document-start mask, each position True with probability p (seeded)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.rand(B, T, generator=g) < p


def outputs_and_grads(run, p, **kw):
    """(o, S_T, grads of every input) of run(p, **kw) under a random linear loss on o and S_T,
    drawn by shape: p maps input names to tensors (None for an absent one)."""
    leaves = {n: x.detach().clone().requires_grad_() for n, x in p.items() if x is not None}
    o, S = run({**p, **leaves}, **kw)
    g = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
    loss = loss + (S * torch.randn(S.shape, generator=g, dtype=S.dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return o, S, dict(zip(leaves, grads, strict=True))


def assert_outputs_and_grads_match(got, ref, tol: float, worst: float) -> None:
    """Two outputs_and_grads results agree: the output, the final state and every gradient, each
    within relative RMSE tol and worst position worst."""
    (o, S, g), (o_ref, S_ref, g_ref) = got, ref
    assert_rel(o, o_ref, tol, "output", worst)
    assert_rel(S, S_ref, tol, "final state", worst)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        assert_rel(g[name], g_ref[name], tol, f"d{name}", worst)


def run_in_two_parts(run, p, per_token, cut, reset, **kw):
    """run on [0, cut) then on [cut, T) from the carried state: (o, final state). per_token:
    the names of p's (B, T, ...) inputs; the rest pass whole, initial_state is carried."""
    T = p[per_token[0]].shape[1]
    state, outs = p["initial_state"], []
    for lo, hi in ((0, cut), (cut, T)):
        if hi > lo:
            part = {n: p[n][:, lo:hi] if n in per_token else p[n] for n in p}
            part_reset = None if reset is None else reset[:, lo:hi]
            o, state = run(dict(part, initial_state=state), reset=part_reset, **kw)
            outs.append(o)
    return torch.cat(outs, 1), state


def assert_chunked_matches_naive(run, p, chunk_size: int, reset_at, tol: float, worst: float):
    """An op's chunked form against its per-step loop (impl="naive"), both through run(p, **kw):
    outputs, final state and every input's gradient; reset_at: the (row, t) document starts."""
    reset = reset_mask(p["q"].shape[0], p["q"].shape[1], *reset_at) if reset_at else None
    ref = outputs_and_grads(run, p, reset=reset, impl="naive")
    got = outputs_and_grads(run, p, reset=reset, chunk_size=chunk_size)
    assert_outputs_and_grads_match(got, ref, tol, worst)


def layer_decoding(m, embed_dim: int, packed: bool, T: int = 19, cut: int = 8):
    """A mixer layer's forward against its cache on (2, T) random inputs, one document per row
    or (packed) two in each: (full forward, token-by-token steps, prefill in two pieces cut at
    `cut`, the cached state after the steps, after the prefill)."""
    x = torch.randn(2, T, embed_dim)
    one_doc = torch.arange(T).expand(2, T)
    pos = torch.cat([torch.arange(7), torch.arange(T - 7)]).expand(2, T) if packed else one_doc
    full = m(x, input_pos=pos if packed else None)
    m.setup_cache(2, torch.float32)
    steps = torch.cat([m(x[:, t : t + 1], input_pos=pos[:, t : t + 1]) for t in range(T)], 1)
    state_steps = m.kv_cache.state.clone()
    m.reset_cache()
    pieces = [m(x[:, :cut], input_pos=pos[:, :cut]), m(x[:, cut:], input_pos=pos[:, cut:])]
    return full, steps, torch.cat(pieces, 1), state_steps, m.kv_cache.state
