"""The op's entry point, the first stage a call meets: ``interdomain_attention``, one signature
for both parameter forms, packed sequences and every implementation (``IMPLEMENTATIONS``),
returning (o, final state or None). Complex parameters become the real form here
(``to_real_form``), once. The dtype policy (fp32, fp64 for fp64 inputs; no autocast) and
the containment of non-finite inputs (``numerics``) are applied here, once."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..readout import readout_gram
from .driver import chunked_forward, selective_forward, shared_on_kernels
from .layout import interleaved_to_state, state_to_interleaved, varlen
from .numerics import contain_state, poison_output, poison_state, sanitise
from .references import (
    interdomain_attention_closed_form_real,
    interdomain_attention_naive_real,
    interdomain_attention_recurrent,
)
from .selective import SELECTIVE_CHUNK
from .shared import chunk_decay_inputs
from .triton_engine import chunked_kernels_forward
from .validation import State, check_arguments


# The decays a call runs with, as typed values (real form, [re, im] last): shared per head, or
# one per token; each path is chosen by type, never by rank.
class SharedDecays(NamedTuple):
    """λ and β shared by every position: lam_ri, beta_ri (H, M, 2)."""

    lam_ri: torch.Tensor
    beta_ri: torch.Tensor

    def at(self, t: int) -> SharedDecays:
        """The decays of position t: the same at every position."""
        return self


class TokenDecays(NamedTuple):
    """Per-token (selective) λ_t and β_t: lam_ri, beta_ri (B, T, H, M, 2)."""

    lam_ri: torch.Tensor
    beta_ri: torch.Tensor

    def at(self, t: int) -> TokenDecays:
        """The decays of position t, (B, H, M, 2) each (per row)."""
        return TokenDecays(self.lam_ri[:, t], self.beta_ri[:, t])


Decays = SharedDecays | TokenDecays


def decays_of(lam_ri: torch.Tensor, beta_ri: torch.Tensor) -> Decays:
    """The typed decays of checked real-form tensors: (H, M, 2) shared, (B, T, H, M, 2) per
    token (``validation.check_real_params`` has checked the shapes)."""
    return (TokenDecays if lam_ri.dim() == 5 else SharedDecays)(lam_ri, beta_ri)


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


def compute_dtypes(q: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(real, complex) dtypes the op computes in: fp64 for fp64 inputs, else fp32."""
    if q.dtype == torch.float64:
        return torch.float64, torch.complex128
    return torch.float32, torch.complex64


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


def _attend(q, k, v, lam_ri, beta_ri, G_hat, Z0, reset, cu, impl, opt: Options, final: bool):
    """Checked real-form arguments -> (o, final state or None); cu: cu_seqlens as a list, or
    None. Packed sequences run as one call with a reset at every start, or, with initial or
    final states, grouped by length (``layout.varlen``)."""
    if cu is None:
        o, Z = _run(q, k, v, decays_of(lam_ri, beta_ri), G_hat, Z0, reset, impl, opt)
        return o, Z if final else None

    def one_call(tokens, reset, init):
        lam, beta = tokens[3:] if lam_ri.dim() == 5 else (lam_ri, beta_ri)
        return _run(*tokens[:3], decays_of(lam, beta), G_hat, init, reset, impl, opt)

    tokens = [q, k, v, lam_ri, beta_ri] if lam_ri.dim() == 5 else [q, k, v]
    return varlen(one_call, tokens, cu, Z0, final)


def interdomain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    C: torch.Tensor,
    *,
    readout: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
    initial_state: State | torch.Tensor | None = None,
    output_final_state: bool = False,
    reset: torch.Tensor | None = None,
    chunk_size: int = 64,
    impl: str = "chunked",
    backend: str = "auto",
    precision: str = "auto",
) -> tuple[torch.Tensor, State | torch.Tensor | None]:
    """Interdomain Attention core (docs/design.md §1 steps 6–7) over whole sequences.

    q, k: (B, T, H, R) real (q = ξ(q), k = k̃, the SSM key input); v: (B, T, H, D) real (ṽ).
    Per position: X_t = λ⊙X_{t-1} + β⊗z_t, U = C Xᵏ, Γ = C Xᵛ, a = U q_t and
    o_t = Re(Γᴴ a) (readout="conj") or Re(Γᵀ a) (readout="product").
    The parameters come in one of two forms, told apart by lam's dtype:
    - complex (the paper's): lam, beta (H, M) complex (discretised S4D), or per token
      (B, T, H, M) (selective decays); C (H, M, M) complex; readout "conj" (default) or
      "product"; initial_state (Xk (B, H, M, R), Xv (B, H, M, D)) complex; the final state
      comes back in that form;
    - real (the runtime's, ``to_real_form``; no complex tensor on the chunked path, so Inductor
      compiles it): lam, beta (H, M, 2) or (B, T, H, M, 2) [re, im]; C: Ĝ (H, 2M, 2M)
      interleaved, which holds the readout (readout must be None); initial_state (B, H, R+D, 2M)
      interleaved real (rows: the R key then the D value channels); so is the final state.
    Zeros when initial_state is None. Returns (o (B, T, H, D) in q's dtype, the final state,
    or None unless output_final_state). Computes in fp32 (fp64 for fp64 inputs).

    cu_seqlens: None, or (N+1,) int offsets 0 = c_0 < … < c_N = T of N packed sequences in a
    batch of one row (B = 1); each runs as if alone, with per-sequence states (N, …) in
    initial_state and the final state.
    reset: (B, T) bool or None (not with cu_seqlens). True where a new sequence starts: the
    state (the initial state included) is zeroed before that position; the final state is that
    of each row's last sequence.
    impl: "chunked" (O(T), default), "naive" (per-step reference), "closed_form" (O(T²)
    oracle, small T) or "recurrent" (T applications of the decode step); the paper's literal
    complex form is ``interdomain_attention_naive``.
    chunk_size: chunk length L of the chunked path (a power of two).
    backend: "auto" (the Triton kernels for CUDA tensors where installed, else PyTorch),
    "torch", "triton" or "inductor" (the PyTorch pieces compiled).
    precision (impl "chunked"): of its matrix products, "ieee" (fp32), "tf32" or "bf16"
    (operands rounded, fp32 accumulation: the GPU's tensor cores; emulated on CPU), or "auto":
    ``numerics.GPU_DEFAULT`` on CUDA, "ieee" elsewhere (docs/precision.md: the errors of each).
    """
    call = check_arguments(
        q, k, v, lam, beta, C, readout=readout, cu_seqlens=cu_seqlens,
        initial_state=initial_state, reset=reset, chunk_size=chunk_size, impl=impl,
        backend=backend, precision=precision,
    )  # fmt: skip
    opt = Options(chunk_size, backend, call.precision)
    Z0 = initial_state
    if call.complex_form:
        cdtype = compute_dtypes(q)[1]
        lam, beta, C = to_real_form(lam, beta, C, call.readout, cdtype)
        if initial_state is not None:
            Z0 = state_to_interleaved(*(s.to(cdtype) for s in initial_state))
    o, Z = _attend(q, k, v, lam, beta, C, Z0, reset, call.cu, impl, opt, output_final_state)
    if Z is not None and call.complex_form:
        Z = interleaved_to_state(Z, q.shape[-1])
    return o, Z


def to_real_form(lam, beta, C, readout: str = "conj", dtype: torch.dtype | None = None):
    """The complex parameters (lam, beta (…, M) complex; C (H, M, M) complex; readout) as the
    op's real form: (lam, beta as (…, M, 2) [re, im]; Ĝ (H, 2M, 2M), ``readout_gram``), in
    dtype's precision (complex64 or complex128; lam's when None). Differentiable."""
    dtype = dtype or lam.dtype
    lam_ri, beta_ri = (torch.view_as_real(x.to(dtype)) for x in (lam, beta))
    return lam_ri, beta_ri, readout_gram(C.to(dtype), readout)
