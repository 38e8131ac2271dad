"""The core op of Interdomain Attention and the implementations behind it."""

from __future__ import annotations

import torch

from ..readout import readout_gram
from .chunked import chunk_decay_inputs, chunked_forward, kernels_for
from .closed_form import interdomain_attention_closed_form
from .decode import empty_state, interdomain_decode_step, interdomain_decode_step_real
from .naive import interdomain_attention_naive
from .nonfinite import poison_output, poison_state, sanitise
from .precision import resolve_precision
from .realform import interleaved_to_state, state_to_interleaved
from .selective import SELECTIVE_CHUNK, selective_chunked
from .validation import (
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
from .varlen import varlen

IMPLS = ("chunked", "naive", "closed_form", "recurrent")
# What the ops' refusals of a transform on the chunked path suggest (check_transforms)
_CHUNKED = "impl='chunked'"
_USE_NAIVE = "use impl='naive' (or 'closed_form', 'recurrent': plain PyTorch, every transform runs)"
_REAL_PATH = "this op (the chunked path, impl='chunked')"
_USE_NAIVE_COMPLEX = "use interdomain_attention(..., impl='naive') on the complex parameters"


def _compute_dtype(q: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(real, complex) dtypes the op computes in: fp64 for fp64 inputs, else fp32."""
    if q.dtype == torch.float64:
        return torch.float64, torch.complex128
    return torch.float32, torch.complex64


def _chunked(q, k, v, lam, beta, C, readout, initial_state, chunk_size, reset, backend, precision):
    R = q.shape[-1]
    _, cdtype = _compute_dtype(q)
    Z0 = None
    if initial_state is not None:
        Z0 = state_to_interleaved(*(s.to(cdtype) for s in initial_state))
    o, Z = _chunked_real(
        q,
        k,
        v,
        torch.view_as_real(lam.to(cdtype)),
        torch.view_as_real(beta.to(cdtype)),
        readout_gram(C.to(cdtype), readout),
        Z0,
        chunk_size,
        reset,
        backend,
        precision,
    )
    return o, interleaved_to_state(Z, R)


def _chunked_real(q, k, v, lam_ri, beta_ri, G_hat, Z0, chunk_size, reset, backend, precision):
    B, T, H, R = q.shape
    D, M = v.shape[-1], lam_ri.shape[-2]
    rdtype, _ = _compute_dtype(q)
    precision = resolve_precision(precision, q)
    q_, k_, v_ = (x.to(rdtype) for x in (q, k, v))
    Z0 = q_.new_zeros(B, H, R + D, 2 * M) if Z0 is None else Z0.to(rdtype)
    G = G_hat.to(rdtype)
    if lam_ri.dim() == 5:  # per-token decays: their own path (the shared one is untouched)
        L = min(chunk_size, SELECTIVE_CHUNK)
        lam_, beta_ = lam_ri.to(rdtype), beta_ri.to(rdtype)
        kernels = kernels_for(q_, backend)
        o, Z = selective_chunked(q_, k_, v_, lam_, beta_, G, Z0, L, reset, kernels, precision)
        return o.to(q.dtype), Z
    # the shared path takes q, k, v as they are: its chunk copies cast them (to fp32 for the
    # PyTorch path; the kernels read bf16 and fp16 themselves), and o comes back in q's dtype
    decays = list(chunk_decay_inputs(lam_ri.to(rdtype), beta_ri.to(rdtype), T, chunk_size))
    k, v = k.to(q.dtype), v.to(q.dtype)
    o, Z, _ = chunked_forward(q, k, v, decays, G, Z0, reset, chunk_size, backend, precision)
    return o, Z


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
    reset: torch.Tensor | None = None,
    backend: str = "auto",
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked op on real-form parameters and state, with no complex tensor anywhere: the
    entry point the layers use, so that Inductor (which has no complex codegen) compiles them.

    q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (H, M, 2) [re, im]
    (``discretize_real``), or per token (B, T, H, M, 2) (selective decays: ``selective.py``;
    complex ops inside, chunks of at most 16); G_hat: (H, 2M, 2M) interleaved
    (``readout_gram_real``);
    initial_state: (B, H, R+D, 2M) interleaved real state (rows: the R key then the D value
    channels; columns: re₀, im₀, re₁, …), zeros if None; reset and backend as in
    ``interdomain_attention``; precision as there.
    Returns (o: (B, T, H, D) in q's dtype, final state: (B, H, R+D, 2M) fp32 (fp64)).
    """
    B, T, H, R, D = check_qkv(q, k, v)
    M = check_real_params(lam_ri, beta_ri, G_hat, H, lead=(B, T))
    if initial_state is not None:
        check_real_state(initial_state, "initial_state", (B, H, R + D, 2 * M))
    check_chunk_size(chunk_size)
    check_reset(reset, B, T)
    check_backend(backend, q)
    resolve_precision(precision, q)
    check_devices(
        "q", q, lam_ri=lam_ri, beta_ri=beta_ri, G_hat=G_hat, initial_state=initial_state,
        reset=reset,
    )  # fmt: skip
    check_transforms(
        "interdomain_attention_real", _REAL_PATH, _USE_NAIVE_COMPLEX,
        q, k, v, lam_ri, beta_ri, G_hat, initial_state,
    )  # fmt: skip
    warn_if_unstable("lam_ri", torch.linalg.vector_norm(lam_ri.detach(), dim=-1))
    q, k, v, initial_state, poison = sanitise(q, k, v, reset, initial_state)
    with torch.autocast(q.device.type, enabled=False):
        o, state = _chunked_real(
            q, k, v, lam_ri, beta_ri, G_hat, initial_state, chunk_size, reset, backend, precision
        )
    return poison_output(o, poison), poison_state(state, poison)


def _recurrent(q, k, v, lam, beta, C, readout, initial_state, reset):
    """T decode steps: the decode path applied to a whole sequence."""
    B, T, H, R = q.shape
    D, M = v.shape[-1], lam.shape[-1]
    rdtype, cdtype = _compute_dtype(q)
    G_hat = readout_gram(C.to(cdtype), readout)
    if initial_state is None:
        state = empty_state(B, H, M, R, D, dtype=cdtype, device=q.device)
    else:
        state = tuple(s.to(cdtype) for s in initial_state)
    outs = []
    for t in range(T):
        if reset is not None:  # a select, not a product: 0·NaN would carry a NaN across
            state = tuple(torch.where(reset[:, t, None, None, None], 0, X) for X in state)
        lam_t, beta_t = (lam[:, t], beta[:, t]) if lam.dim() == 4 else (lam, beta)
        o_t, state = interdomain_decode_step(q[:, t], k[:, t], v[:, t], lam_t, beta_t, G_hat, state)
        outs.append(o_t)
    return torch.stack(outs, dim=1).to(q.dtype), state


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

    impl: "chunked" (O(T), default), "naive" (per-step complex reference), "closed_form"
    (O(T²) oracle, small T) or "recurrent" (T applications of the decode step).
    chunk_size: chunk length L of the chunked path (a power of two).
    reset: (B, T) bool or None. True where a new sequence starts: the state (the initial state
    included) is zeroed before that position, so packed sequences run as if separate; the final
    state is that of each row's last sequence.
    precision (impl "chunked"): of its matrix products, "ieee" (fp32), "tf32" or "bf16"
    (operands rounded, fp32 accumulation: the GPU's tensor cores; emulated on CPU), or "auto":
    ``precision.GPU_DEFAULT`` on CUDA, "ieee" elsewhere (docs/precision.md: the errors of each).
    """
    check_inputs(q, k, v, lam, beta, C, readout, initial_state, chunk_size)
    check_reset(reset, *q.shape[:2])
    check_devices("q", q, reset=reset)
    check_backend(backend, q)
    resolve_precision(precision, q)
    if impl != "chunked" and precision not in ("auto", "ieee"):
        raise ValueError(f"precision: {precision!r} applies to impl='chunked' only, got {impl!r}")
    if impl == "chunked":
        check_transforms(
            "interdomain_attention", _CHUNKED, _USE_NAIVE, q, k, v, lam, beta, C, initial_state
        )
    # The SSM runs in fp32 (fp64) whatever the ambient autocast: states and accumulators of a
    # long recurrence do not survive bf16. Inputs are upcast here and o is cast back.
    with torch.autocast(q.device.type, enabled=False):
        o, state = _dispatch(
            q, k, v, lam, beta, C, readout, initial_state, chunk_size, impl, reset, backend,
            precision,
        )  # fmt: skip
    return (o, state) if return_final_state else o


def _dispatch(
    q, k, v, lam, beta, C, readout, initial_state, chunk_size, impl, reset, backend, precision
):
    """naive runs literally (the reference); the others see sanitised inputs (``nonfinite``):
    products over chunks would spread a NaN/inf, and so would autograd's 0·NaN backward."""
    if impl == "naive":
        _, cdtype = _compute_dtype(q)
        return interdomain_attention_naive(
            q, k, v, lam, beta, C.to(cdtype), readout, initial_state, reset
        )
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    q, k, v, initial_state, poison = sanitise(q, k, v, reset, initial_state)
    o, state = _contained(
        q, k, v, lam, beta, C, readout, initial_state, chunk_size, impl, reset, backend, precision
    )
    return poison_output(o, poison), poison_state(state, poison)


def _contained(
    q, k, v, lam, beta, C, readout, initial_state, chunk_size, impl, reset, backend, precision
):
    if impl == "recurrent":
        return _recurrent(q, k, v, lam, beta, C, readout, initial_state, reset)
    if impl == "chunked":
        o, state = _chunked(
            q, k, v, lam, beta, C, readout, initial_state, chunk_size, reset, backend, precision
        )
    else:
        _, cdtype = _compute_dtype(q)
        o, state = interdomain_attention_closed_form(
            q, k, v, lam, beta, C.to(cdtype), readout, initial_state, reset
        )
    return o, state


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
    """``interdomain_attention`` over N packed sequences of different lengths.

    q, k: (1, S, H, R); v: (1, S, H, D) (the sequences back to back); cu_seqlens: (N+1,) int
    offsets 0 = c_0 < … < c_N = S (length-1 sequences allowed); lam, beta: (H, M), or per token
    (1, S, H, M) packed like q; initial_state: (Xk (N, H, M, R),
    Xv (N, H, M, D)) complex, one state per sequence, zeros if None. Each sequence runs as if
    alone. Returns o: (1, S, H, D), or (o, final states (N, H, M, R), (N, H, M, D)) if
    return_final_state. The other arguments are those of ``interdomain_attention``.
    """

    S, H = check_qkv(q, k, v)[1:3]  # ranks and sizes before the batch-of-one rule and indexing
    M = check_params(lam, beta, C, H, readout, BT=(1, S))
    check_devices("q", q, lam=lam, beta=beta, C=C, initial_state=initial_state)
    if impl == "chunked":
        check_transforms(
            "interdomain_attention_varlen", _CHUNKED, _USE_NAIVE,
            q, k, v, lam, beta, C, initial_state,
        )  # fmt: skip
    R, D = q.shape[-1], v.shape[-1]
    init = None
    if initial_state is not None:
        # one state per sequence: varlen checks that count against cu_seqlens
        first = initial_state[0] if isinstance(initial_state, (tuple, list)) else None
        N = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() == 4 else -1
        check_state(initial_state, N, H, M, R, D, "initial_state")
        init = state_to_interleaved(*initial_state)
    per_token = lam.dim() == 4  # (1, S, H, M): indexed with the tokens

    def attend(q_, k_, v_, *rest):
        lam_, beta_ = rest[:2] if per_token else (lam, beta)
        reset, init_ = rest[-3:-1]
        o, state = interdomain_attention(
            q_,
            k_,
            v_,
            lam_,
            beta_,
            C,
            readout=readout,
            initial_state=None if init_ is None else interleaved_to_state(init_, R),
            return_final_state=True,
            chunk_size=chunk_size,
            impl=impl,
            reset=reset,
            backend=backend,
            precision=precision,
        )
        return o, state_to_interleaved(*state)

    tokens = (q, k, v, lam, beta) if per_token else (q, k, v)
    o, state = varlen(attend, tokens, cu_seqlens, M, init, return_final_state)
    return (o, interleaved_to_state(state, R)) if return_final_state else o


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
    backend: str = "auto",
    precision: str = "auto",
):
    """``interdomain_attention_real`` over N packed sequences (the runtime form of
    ``interdomain_attention_varlen``): q, k: (1, S, H, R); v: (1, S, H, D); lam_ri, beta_ri:
    (H, M, 2), or per token (1, S, H, M, 2) packed like q; G_hat (H, 2M, 2M); cu_seqlens:
    (N+1,) offsets; initial_state: (N, H, R+D, 2M) real or None (zeros).
    Returns o: (1, S, H, D), or (o, final states (N, H, R+D, 2M)) if return_final_state."""
    S, H = check_qkv(q, k, v)[1:3]
    M = check_real_params(lam_ri, beta_ri, G_hat, H, lead=(1, S))
    check_devices("q", q, lam_ri=lam_ri, beta_ri=beta_ri, G_hat=G_hat, initial_state=initial_state)
    if initial_state is not None:  # its shape against cu_seqlens: varlen
        check_real_state(initial_state, "initial_state")
    check_transforms(
        "interdomain_attention_varlen_real", _REAL_PATH, _USE_NAIVE_COMPLEX,
        q, k, v, lam_ri, beta_ri, G_hat, initial_state,
    )  # fmt: skip
    per_token = lam_ri.dim() == 5  # (1, S, H, M, 2): indexed with the tokens

    def attend(q_, k_, v_, *rest):
        lam_, beta_ = rest[:2] if per_token else (lam_ri, beta_ri)
        reset, init_ = rest[-3:-1]
        return interdomain_attention_real(
            q_,
            k_,
            v_,
            lam_,
            beta_,
            G_hat,
            init_,
            chunk_size=chunk_size,
            reset=reset,
            backend=backend,
            precision=precision,
        )

    tokens = (q, k, v, lam_ri, beta_ri) if per_token else (q, k, v)
    o, state = varlen(attend, tokens, cu_seqlens, M, initial_state, return_final_state)
    return (o, state) if return_final_state else o


__all__ = [
    "IMPLS",
    "interdomain_attention",
    "interdomain_attention_real",
    "interdomain_attention_varlen",
    "interdomain_attention_varlen_real",
    "interdomain_attention_naive",
    "interdomain_attention_closed_form",
    "interdomain_decode_step",
    "interdomain_decode_step_real",
    "empty_state",
    "interleaved_to_state",
    "state_to_interleaved",
]
