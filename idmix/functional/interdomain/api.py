"""The op's entry points, the first stage a call meets: one real-form entry,
``interdomain_attention_real``, with one signature for every implementation
(``IMPLEMENTATIONS``); the complex API as a thin wrapper over it; the packed-sequence
(``cu_seqlens``) entries over both. The dtype policy (fp32, fp64 for fp64 inputs; no autocast) and
the containment of non-finite inputs (``numerics``) are applied here, once."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..readout import readout_gram
from .driver import chunked_forward, selective_forward, shared_on_kernels
from .layout import (
    Decays,
    SharedDecays,
    TokenDecays,
    decays_of,
    interleaved_to_state,
    state_to_interleaved,
    varlen,
)
from .numerics import contain_state, poison_output, poison_state, resolve_precision, sanitise
from .references import (
    interdomain_attention_closed_form_real,
    interdomain_attention_naive_real,
    interdomain_attention_recurrent,
)
from .selective import SELECTIVE_CHUNK
from .shared import chunk_decay_inputs
from .triton_engine import chunked_kernels_forward
from .validation import (
    CHUNKED_PATH,
    CHUNKED_PATH_REAL,
    PLAIN_IMPLS,
    State,
    check_backend,
    check_chunk_size,
    check_devices,
    check_inputs,
    check_params,
    check_qkv,
    check_real_params,
    check_real_state,
    check_reset,
    check_state,
    check_transforms,
    warn_if_unstable,
)


class Options(NamedTuple):
    """chunk_size: chunk length L (a power of two); backend: as validation.BACKENDS; precision:
    resolved ("ieee", "tf32", "bf16")."""

    chunk_size: int
    backend: str
    precision: str


def _chunked(q, k, v, decays: Decays, G_hat, Z0, reset, opt: Options):
    """Shared decays off the kernels (torch, inductor): ``idmix::chunked_forward``, q, k, v as
    they are (its chunk copies cast them). Per-token decays:
    ``idmix::selective_forward`` in the compute dtype, chunks of at most SELECTIVE_CHUNK."""
    rdtype = Z0.dtype
    lam_ri, beta_ri = (x.to(rdtype) for x in decays)
    if isinstance(decays, TokenDecays):
        L = min(opt.chunk_size, SELECTIVE_CHUNK)
        o, Z, _ = selective_forward(
            q.to(rdtype), k.to(rdtype), v.to(rdtype), lam_ri, beta_ri, G_hat, Z0, reset, L,
            opt.backend, opt.precision,
        )  # fmt: skip
        return o.to(q.dtype), Z
    dec = list(chunk_decay_inputs(lam_ri, beta_ri, q.shape[1], opt.chunk_size))
    k, v = k.to(q.dtype), v.to(q.dtype)
    o, Z, _ = chunked_forward(
        q, k, v, dec, G_hat, Z0, reset, opt.chunk_size, opt.backend, opt.precision
    )
    return o, Z


def _without_options(fn):
    return lambda q, k, v, decays, G_hat, Z0, reset, opt: fn(q, k, v, decays, G_hat, Z0, reset)


class Implementation(NamedTuple):
    """run(q, k, v, decays, G_hat, Z0, reset, options) -> (o in q's dtype, final state);
    literal: it runs on the inputs as given (a per-step recurrence confines a NaN/inf by
    itself); otherwise it sees sanitised inputs and the damage is put back (``numerics``)."""

    run: Callable
    literal: bool


IMPLEMENTATIONS = {
    "chunked": Implementation(_chunked, literal=False),
    "naive": Implementation(_without_options(interdomain_attention_naive_real), literal=True),
    "closed_form": Implementation(
        _without_options(interdomain_attention_closed_form_real), literal=False
    ),
    "recurrent": Implementation(_without_options(interdomain_attention_recurrent), literal=False),
}


IMPLS = tuple(IMPLEMENTATIONS)


def compute_dtypes(q: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(real, complex) dtypes the op computes in: fp64 for fp64 inputs, else fp32."""
    if q.dtype == torch.float64:
        return torch.float64, torch.complex128
    return torch.float32, torch.complex64


def _check_impl(impl, precision) -> None:
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl != "chunked" and precision not in ("auto", "ieee"):
        raise ValueError(f"precision: {precision!r} applies to impl='chunked' only, got {impl!r}")


def _on_kernels(q, k, v, decays: SharedDecays, G_hat, initial_state, opt: Options, reset):
    """Shared decays on the Triton kernels (``triton_engine``): containment happens inside the
    op; only an initial state is checked here (its non-finite entries zeroed, its heads marked),
    so that with none given the call adds no PyTorch op around the kernels."""
    Z0 = bad_init = None
    if initial_state is not None:
        Z0, bad = contain_state(initial_state.float())
        bad_init = bad.to(torch.int8)
    lam_ri, beta_ri = (x.float().contiguous() for x in decays)
    o, Z, *_ = chunked_kernels_forward(
        q, k.to(q.dtype), v.to(q.dtype), lam_ri, beta_ri, G_hat.float(), Z0, bad_init, reset,
        opt.chunk_size, opt.precision,
    )  # fmt: skip
    return o, Z


def _takes_kernels(q, decays: Decays, impl: str, opt: Options) -> bool:
    return (
        impl == "chunked" and isinstance(decays, SharedDecays) and shared_on_kernels(opt.backend, q)
    )


def _run(q, k, v, decays: Decays, G_hat, initial_state, reset, impl: str, opt: Options):
    """Checked real-form inputs -> (o (B, T, H, D) in q's dtype, final state (B, H, R+D, 2M))
    in the compute dtype, whatever the ambient autocast: states and accumulators of a long
    recurrence do not survive bf16."""
    if _takes_kernels(q, decays, impl, opt):
        with torch.autocast(q.device.type, enabled=False):
            return _on_kernels(q, k, v, decays, G_hat, initial_state, opt, reset)
    entry = IMPLEMENTATIONS[impl]
    rdtype, _ = compute_dtypes(q)
    poison = None
    with torch.autocast(q.device.type, enabled=False):
        if not entry.literal:
            q, k, v, initial_state, poison = sanitise(q, k, v, reset, initial_state)
        B, _, H, R = q.shape
        Z0 = (
            q.new_zeros(B, H, R + v.shape[-1], 2 * decays.lam_ri.shape[-2], dtype=rdtype)
            if initial_state is None
            else initial_state.to(rdtype)
        )
        o, Z = entry.run(q, k, v, decays, G_hat.to(rdtype), Z0, reset, opt)
    return poison_output(o, poison), poison_state(Z, poison)


def interdomain_attention_real(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    chunk_size: int = 64,
    impl: str = "chunked",
    reset: torch.Tensor | None = None,
    backend: str = "auto",
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op on real-form parameters and state, with no complex tensor on the chunked path: the
    entry point the layers use, so that Inductor (which has no complex codegen) compiles them.

    q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (H, M, 2) [re, im] shared per head
    (``discretize_real``), or per token (B, T, H, M, 2) (selective decays: ``selective.py``);
    G_hat: (H, 2M, 2M) interleaved (``readout_gram_real``); initial_state: (B, H, R+D, 2M)
    interleaved real state (rows: the R key then the D value channels; columns: re₀, im₀, re₁,
    …), zeros if None; impl, chunk_size, reset, backend and precision as in
    ``interdomain_attention``.
    Returns (o: (B, T, H, D) in q's dtype, final state: (B, H, R+D, 2M) fp32 (fp64)).
    """
    B, T, H, R, D = check_qkv(q, k, v)
    M = check_real_params(lam_ri, beta_ri, G_hat, H, lead=(B, T))
    if initial_state is not None:
        check_real_state(initial_state, "initial_state", (B, H, R + D, 2 * M))
    check_chunk_size(chunk_size)
    check_reset(reset, B, T)
    check_backend(backend, q)
    _check_impl(impl, precision)
    precision = resolve_precision(precision, q)
    check_devices(
        "q", q, lam_ri=lam_ri, beta_ri=beta_ri, G_hat=G_hat, initial_state=initial_state,
        reset=reset,
    )  # fmt: skip
    if impl == "chunked":
        check_transforms(
            "interdomain_attention_real", CHUNKED_PATH_REAL, PLAIN_IMPLS,
            q, k, v, lam_ri, beta_ri, G_hat, initial_state,
        )  # fmt: skip
    warn_if_unstable("lam_ri", lam_ri)
    decays = decays_of(lam_ri, beta_ri)
    opt = Options(chunk_size, backend, precision)
    return _run(q, k, v, decays, G_hat, initial_state, reset, impl, opt)


def interdomain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    C: torch.Tensor,
    *,
    readout: str = "conj",
    initial_state: State | None = None,
    return_final_state: bool = False,
    chunk_size: int = 64,
    impl: str = "chunked",
    reset: torch.Tensor | None = None,
    backend: str = "auto",
    precision: str = "auto",
):
    """Interdomain Attention core (docs/design.md §1 steps 6–7) over a whole sequence.

    q, k: (B, T, H, R) real (q = ξ(q), k = k̃, the SSM key input); v: (B, T, H, D) real (ṽ);
    lam, beta: (H, M) complex (discretised S4D), or per token (B, T, H, M) (selective decays,
    every impl); C: (H, M, M) complex readout;
    initial_state: (Xk: (B, H, M, R), Xv: (B, H, M, D)) complex, zeros if None.
    Per position: X_t = λ⊙X_{t-1} + β⊗z_t, U = C Xᵏ, Γ = C Xᵛ, a = U q_t and
    o_t = Re(Γᴴ a) (readout="conj") or Re(Γᵀ a) (readout="product").
    Returns o: (B, T, H, D) in q's dtype, or (o, final_state) if return_final_state.
    Computes in fp32 (fp64 for fp64 inputs); the state is complex64 (complex128).

    A thin wrapper of ``interdomain_attention_real``: C becomes Ĝ (``readout_gram``), λ, β and
    the state their interleaved real forms.
    impl: "chunked" (O(T), default), "naive" (per-step reference), "closed_form" (O(T²)
    oracle, small T) or "recurrent" (T applications of the decode step); the paper's literal
    complex form is ``interdomain_attention_naive``.
    chunk_size: chunk length L of the chunked path (a power of two).
    reset: (B, T) bool or None. True where a new sequence starts: the state (the initial state
    included) is zeroed before that position, so packed sequences run as if separate; the final
    state is that of each row's last sequence.
    precision (impl "chunked"): of its matrix products, "ieee" (fp32), "tf32" or "bf16"
    (operands rounded, fp32 accumulation: the GPU's tensor cores; emulated on CPU), or "auto":
    ``numerics.GPU_DEFAULT`` on CUDA, "ieee" elsewhere (docs/precision.md: the errors of each).
    """
    check_inputs(q, k, v, lam, beta, C, readout, initial_state, chunk_size)
    check_reset(reset, *q.shape[:2])
    check_devices("q", q, reset=reset)
    check_backend(backend, q)
    _check_impl(impl, precision)
    precision = resolve_precision(precision, q)
    if impl == "chunked":
        check_transforms(
            "interdomain_attention", CHUNKED_PATH, PLAIN_IMPLS,
            q, k, v, lam, beta, C, initial_state,
        )  # fmt: skip
    _, cdtype = compute_dtypes(q)
    decays = decays_of(*(torch.view_as_real(x.to(cdtype)) for x in (lam, beta)))
    Z0 = None
    if initial_state is not None:
        Z0 = state_to_interleaved(*(s.to(cdtype) for s in initial_state))
    G_hat = readout_gram(C.to(cdtype), readout)
    opt = Options(chunk_size, backend, precision)
    o, Z = _run(q, k, v, decays, G_hat, Z0, reset, impl, opt)
    return (o, interleaved_to_state(Z, q.shape[-1])) if return_final_state else o


# --- packed sequences (cu_seqlens) ---
# Variable-length packed sequences (``cu_seqlens``), each with its own initial and final
# state, in the runtime form (N, H, R+D, 2M) interleaved real; the complex API a thin wrapper.


def interdomain_attention_varlen_real(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam_ri: torch.Tensor,
    beta_ri: torch.Tensor,
    G_hat: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 64,
    impl: str = "chunked",
    backend: str = "auto",
    precision: str = "auto",
):
    """``interdomain_attention_real`` over N packed sequences: q, k: (1, S, H, R); v:
    (1, S, H, D); lam_ri, beta_ri: (H, M, 2), or per token (1, S, H, M, 2) packed like q;
    G_hat (H, 2M, 2M); cu_seqlens: (N+1,) int offsets 0 = c_0 < … < c_N = S (length-1
    sequences allowed); initial_state: (N, H, R+D, 2M) real or None (zeros). Each sequence
    runs as if alone. Returns o: (1, S, H, D), or (o, final states (N, H, R+D, 2M)) if
    return_final_state."""
    S, H = check_qkv(q, k, v)[1:3]
    M = check_real_params(lam_ri, beta_ri, G_hat, H, lead=(1, S))
    check_devices("q", q, lam_ri=lam_ri, beta_ri=beta_ri, G_hat=G_hat, initial_state=initial_state)
    if initial_state is not None:  # its shape against cu_seqlens: varlen
        check_real_state(initial_state, "initial_state")
    if impl == "chunked":
        check_transforms(
            "interdomain_attention_varlen_real", CHUNKED_PATH_REAL, PLAIN_IMPLS,
            q, k, v, lam_ri, beta_ri, G_hat, initial_state,
        )  # fmt: skip
    per_token = lam_ri.dim() == 5  # (1, S, H, M, 2): packed with the tokens

    def attend(tokens, reset, init):
        lam, beta = tokens[3:] if per_token else (lam_ri, beta_ri)
        return interdomain_attention_real(
            *tokens[:3], lam, beta, G_hat, init, chunk_size=chunk_size, impl=impl, reset=reset,
            backend=backend, precision=precision,
        )  # fmt: skip

    tokens = [q, k, v, lam_ri, beta_ri] if per_token else [q, k, v]
    o, state = varlen(attend, tokens, cu_seqlens, M, initial_state, return_final_state)
    return (o, state) if return_final_state else o


def interdomain_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    C: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    readout: str = "conj",
    initial_state: State | None = None,
    return_final_state: bool = False,
    chunk_size: int = 64,
    impl: str = "chunked",
    backend: str = "auto",
    precision: str = "auto",
):
    """``interdomain_attention`` over N packed sequences of different lengths: q, k:
    (1, S, H, R); v: (1, S, H, D); lam, beta: (H, M), or per token (1, S, H, M) packed like q;
    cu_seqlens as for ``interdomain_attention_varlen_real``; initial_state: (Xk (N, H, M, R),
    Xv (N, H, M, D)) complex, one state per sequence, zeros if None. Returns o: (1, S, H, D),
    or (o, final states (N, H, M, R), (N, H, M, D)) if return_final_state. The other arguments
    are those of ``interdomain_attention``; a thin wrapper of the real form."""
    S, H = check_qkv(q, k, v)[1:3]  # ranks and sizes before the batch-of-one rule and indexing
    M = check_params(lam, beta, C, H, readout, BT=(1, S))
    check_devices("q", q, lam=lam, beta=beta, C=C, initial_state=initial_state)
    if impl == "chunked":
        check_transforms(
            "interdomain_attention_varlen", CHUNKED_PATH, PLAIN_IMPLS,
            q, k, v, lam, beta, C, initial_state,
        )  # fmt: skip
    R, D = q.shape[-1], v.shape[-1]
    _, cdtype = compute_dtypes(q)
    init = None
    if initial_state is not None:
        # one state per sequence: varlen checks that count against cu_seqlens
        first = initial_state[0] if isinstance(initial_state, (tuple, list)) else None
        N = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() == 4 else -1
        check_state(initial_state, N, H, M, R, D, "initial_state")
        init = state_to_interleaved(*(s.to(cdtype) for s in initial_state))
    out = interdomain_attention_varlen_real(
        q, k, v, *(torch.view_as_real(x.to(cdtype)) for x in (lam, beta)),
        readout_gram(C.to(cdtype), readout), cu_seqlens, initial_state=init,
        return_final_state=return_final_state, chunk_size=chunk_size, impl=impl,
        backend=backend, precision=precision,
    )  # fmt: skip
    if not return_final_state:
        return out
    return out[0], interleaved_to_state(out[1], R)
