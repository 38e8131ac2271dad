"""Single-token decode step (docs/design.md §5): O(M(R+D) + M²) per head.

One entry, ``interdomain_decode_step``, for both forms of the op's parameters and state. The
runtime form is the real one: the interleaved real state (B, H, R+D, 2M) the layers keep,
advanced in place on PyTorch or the fused Triton kernel. A complex (Xk, Xv) state is copied to
that form and back (the readable API and reference).
"""

from __future__ import annotations

import torch

from .driver import takes_triton
from .layout import as_complex, interleaved_to_state, state_to_interleaved
from .triton_engine import kernels_module
from .validation import (
    State,
    check_complex,
    check_devices,
    check_real_float,
    check_real_params,
    check_state,
)

DECODE_STATE_DTYPES = (torch.float32, torch.float64)
DECODE_COMPLEX_STATE_DTYPES = (torch.complex64, torch.complex128)


def check_decode_state_dtype(name: str, dtype: torch.dtype, allowed: tuple) -> None:
    """A decode state in fp32/fp64 (complex64/complex128 for the complex API): a bf16 or fp16
    state would carry the recurrence in that precision, token after token."""
    if dtype not in allowed:
        raise TypeError(
            f"{name}: expected a decode state in one of {tuple(map(str, allowed))} (the step "
            f"accumulates in the state's dtype; q, k, v may be lower precision), got {dtype}"
        )


def check_decays_and_gram(lam, beta, G_hat, H: int, M: int, B: int | None = None) -> None:
    """The decode step's lam, beta: (H, M) complex (or per row (B, H, M) when B is given) and
    G_hat: (H, 2M, 2M) real."""
    per_row = B is not None and isinstance(lam, torch.Tensor) and lam.dim() == 3
    shape, text = ((B, H, M), "(B, H, M)") if per_row else ((H, M), "(H, M)")
    check_complex("lam", lam, shape, text)
    check_complex("beta", beta, shape, text)
    check_real_float("G_hat", G_hat)
    if tuple(G_hat.shape) != (H, 2 * M, 2 * M):
        raise ValueError(
            f"G_hat: expected (H, 2M, 2M) = {(H, 2 * M, 2 * M)}, got {tuple(G_hat.shape)}"
        )


def check_decode_inputs(q, k, v, B: int, H: int, R: int, D: int) -> None:
    """One decode step's q: (B, H, R) or (B, H, r, R), k: (B, H, R), v: (B, H, D), real
    floating, given the state's sizes."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_real_float(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if tuple(k.shape) != (B, H, R):
        raise ValueError(f"k: expected (B, H, R) = {(B, H, R)} (the state's), got {tuple(k.shape)}")
    if tuple(v.shape) != (B, H, D):
        raise ValueError(f"v: expected (B, H, D) = {(B, H, D)} (the state's), got {tuple(v.shape)}")
    grouped = q.dim() == 4 and q.shape[2] >= 1
    if not (tuple(q.shape) == (B, H, R) or (grouped and q.shape[:2] == (B, H) and q.shape[3] == R)):
        raise ValueError(
            f"q: expected (B, H, R) = {(B, H, R)} or (B, H, r, R) for r query heads per state "
            f"head, got {tuple(q.shape)}"
        )
    check_devices("q", q, k=k, v=v)


def empty_state(B, H, M, R, D, dtype=torch.complex64, device=None) -> State:
    """Zero complex state (Xk: (B, H, M, R), Xv: (B, H, M, D)), views of one buffer."""
    Z = torch.zeros(B, H, R + D, M, dtype=dtype, device=device).mT
    return Z[..., :R], Z[..., R:]


def _takes_kernel(backend: str, q: torch.Tensor, shared_decays: bool, records_grad: bool) -> bool:
    """Whether a step goes to the fused kernel: asked for explicitly (which then says why it
    cannot, if it cannot), or "auto" with one query per state head, shared decays and no
    gradient to record through the state it returns (the kernel has no backward)."""
    if not takes_triton(backend, q):
        return False
    return backend == "triton" or (q.dim() == 3 and shared_decays and not records_grad)


def interdomain_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    G_hat: torch.Tensor,
    state: State | torch.Tensor,
    *,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, State | torch.Tensor]:
    """Advance the state by one position and read it out.

    q: (B, H, R), or (B, H, r, R) for r query heads reading each state head (grouped state);
    k: (B, H, R); v: (B, H, D), one real dtype; G_hat: (H, 2M, 2M) real, interleaved
    (``readout_gram(C, readout)``, computed once per set of weights, not per step). The state
    and decays in one of the op's two forms:
    - complex: state (Xk (B, H, M, R), Xv (B, H, M, D)) complex64 or complex128; lam, beta
      (H, M) complex, or (B, H, M) per row (a selective layer's decays at this token);
    - real: state (B, H, R+D, 2M) fp32 or fp64, contiguous (the op's and the layers' runtime
      form); lam, beta (H, M, 2) or (B, H, M, 2) [re, im]. No complex tensor anywhere, so the
      torch path compiles whole with Inductor.
    inplace: update the given state (and return it); otherwise a new state is returned, and
    gradients flow through a sequence of steps (on the torch path, which "auto" then takes
    whenever autograd records).
    Returns (o: (B, H, D), or (B, H, r, D), in q's dtype; the new state, in the given form).

    Steps: X ← λ⊙X + β⊗z; p = Xᵏ q; w̃ = Ĝ p̂ (p̂, w̃: p, w in interleaved real form);
    o = Re(Xᵛᴴ w). U and Γ are never formed (the paper's O(M²(R+D)) form); the state is read
    once.
    backend: "torch", "triton" (the fused in-place kernel of ``idmix_kernels``; on CPU only
    under TRITON_INTERPRET=1; 3-dim q and an fp32 state, shared decays), or "auto": triton for
    CUDA tensors with 3-dim q and shared decays when it is installed, torch otherwise.
    """
    if isinstance(state, torch.Tensor):
        if isinstance(lam, torch.Tensor) and lam.is_complex():
            raise TypeError(
                "state: expected a tuple (Xk, Xv) with complex lam and beta (a tensor state is "
                "the real form (B, H, R+D, 2M), with real (…, M, 2) decays), got a tensor"
            )
        return _real_step(q, k, v, lam, beta, G_hat, state, inplace, backend)
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"state: expected a tuple (Xk, Xv), got {type(state).__name__}")
    B, H, M, R = state[0].shape if state[0].dim() == 4 else (None,) * 4
    if B is None:
        raise ValueError(f"state[0] (Xk): expected (B, H, M, R), got {tuple(state[0].shape)}")
    D = state[1].shape[-1]
    check_state(state, B, H, M, R, D, "state")
    for i, X in enumerate(state):
        check_decode_state_dtype(f"state[{i}]", X.dtype, DECODE_COMPLEX_STATE_DTYPES)
    check_decode_inputs(q, k, v, B, H, R, D)
    check_decays_and_gram(lam, beta, G_hat, H, M, B)
    check_devices("q", q, lam=lam, beta=beta, G_hat=G_hat, state=state)
    R = state[0].shape[-1]
    cdtype = torch.complex128 if state[0].dtype == torch.complex128 else torch.complex64
    Z = state_to_interleaved(*(X.to(cdtype) for X in state))  # a copy
    lam_ri, beta_ri = (torch.view_as_real(x.to(cdtype)) for x in (lam, beta))
    records_grad = not _eager_without_grad(q, k, v, lam, beta, G_hat, *state)
    if _takes_kernel(backend, q, lam.dim() == 2, records_grad):
        o = _real_step(q, k, v, lam_ri, beta_ri, G_hat, Z, True, "triton")[0]
    else:  # functional, so that gradients flow through a sequence of steps
        o, Z = torch_step(q, k, v, lam_ri, beta_ri, G_hat, Z)
    Xk, Xv = interleaved_to_state(Z, R)
    if inplace:
        state[0].copy_(Xk)
        state[1].copy_(Xv)
        Xk, Xv = state
    return o, (Xk, Xv)


def _real_step(q, k, v, lam_ri, beta_ri, G_hat, state, inplace: bool, backend: str):
    """The step on the real interleaved state: (o, the new state)."""
    if (
        not isinstance(state, torch.Tensor)
        or not state.is_floating_point()
        or state.dim() != 4
        or not state.is_contiguous()
    ):
        raise ValueError(
            "state: expected a contiguous (B, H, R+D, 2M) real floating tensor, got "
            f"{getattr(state, 'dtype', type(state).__name__)} {tuple(getattr(state, 'shape', ()))}"
        )
    check_decode_state_dtype("state", state.dtype, DECODE_STATE_DTYPES)
    B, H = state.shape[:2]
    R = k.shape[-1] if isinstance(k, torch.Tensor) else 0
    M = check_real_params(lam_ri, beta_ri, G_hat, H, lead=(B,), names=("lam", "beta", "G_hat"))
    if state.shape[3] != 2 * M or not 0 < R < state.shape[2]:
        raise ValueError(
            f"state: expected (B, H, R+D, 2M) with M = {M} and R = {R} (k's), got "
            f"{tuple(state.shape)}"
        )
    check_decode_inputs(q, k, v, B, H, R, state.shape[2] - R)
    check_devices("q", q, lam=lam_ri, beta=beta_ri, G_hat=G_hat, state=state)
    shared = lam_ri.dim() == 3
    eager = _eager_without_grad(q, k, v, lam_ri, beta_ri, G_hat, state)
    if _takes_kernel(backend, q, shared, records_grad=not (inplace or eager)):
        if q.dim() != 3:
            raise ValueError(f"q: the triton decode step takes (B, H, R), got {tuple(q.shape)}")
        if not shared:
            raise ValueError("lam: the triton decode step takes shared (H, M, 2) decays")
        state = state if inplace else state.clone()
        o = kernels_module().decode_step_triton(q, k, v, lam_ri, beta_ri, G_hat, state)
        return o.to(q.dtype), state
    if eager:
        state = state if inplace else state.clone()
        return _eager_step_(q, k, v, lam_ri, beta_ri, G_hat, state), state
    o, new = torch_step(q, k, v, lam_ri, beta_ri, G_hat, state)
    if not inplace:  # functional, so that gradients flow through a sequence of steps
        return o, new
    state.copy_(new)
    return o, state


def _eager_without_grad(*tensors) -> bool:
    """Eager (not being traced by torch.compile/export) with no gradient to record."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _eager_step_(q, k, v, lam_ri, beta_ri, G_hat, Z):
    """The torch step in place on Z, for eager decoding: the state update as two complex ops on
    a view of Z (the real form's strided re/im arithmetic is ~10 small ops, several times
    slower in eager; compiled, Inductor fuses that form into one loop, so it stays there).
    Equal to :func:`torch_step` (tested). Returns o."""
    rdtype = Z.dtype
    R = k.shape[-1]
    X = as_complex(Z)  # (B, H, C, M), shares Z's memory
    lam, beta = (
        torch.view_as_complex(x.to(rdtype).contiguous()).unsqueeze(-2) for x in (lam_ri, beta_ri)
    )
    z = torch.cat([k, v], dim=-1).to(rdtype)[..., None]  # (B, H, C, 1)
    X.mul_(lam).addcmul_(z, beta)  # X ← λ⊙X + β⊗z
    return _read(q, G_hat, Z, R).to(q.dtype)


def _read(q, G_hat, Z, R: int) -> torch.Tensor:
    """o = Re(Xᵛᴴ Ĝ p̂) with p = Xᵏ q, on the updated state Z (B, H, R+D, 2M) interleaved real:
    q (B, H, R) or (B, H, r, R) -> o (B, H, D) or (B, H, r, D), in Z's dtype. Three batched
    row-vector GEMMs (CPU BLAS is several times faster at x @ A than A @ x), called as bmm on
    3-dim views: ``matmul``'s broadcasting costs more than the GEMMs at decode sizes."""
    B, H, C, M2 = Z.shape
    rows = q.to(Z.dtype).reshape(B * H, -1, R)  # (B·H, r, R)
    r = rows.shape[1]
    Zf = Z.view(B * H, C, M2)
    p = torch.bmm(rows, Zf[:, :R])  # p̂ (B·H, r, 2M)
    by_head = p.view(B, H, r, M2).transpose(0, 1).reshape(H, B * r, M2)  # a view when B = 1
    w = torch.bmm(by_head, G_hat.to(Z.dtype).mT)  # w̃ = Ĝ p̂ per head
    w = w.view(H, B, r, M2).transpose(0, 1).reshape(B * H, r, M2)
    o = torch.bmm(w, Zf[:, R:].mT)  # Σ_m Re(Xᵛ)w_re + Im(Xᵛ)w_im: (B·H, r, D)
    return o.view(B, H, r, -1) if q.dim() == 4 else o.view(B, H, -1)


def torch_step(q, k, v, lam_ri, beta_ri, G_hat, Z):
    """Functional step on Z: (B, H, R+D, 2M) interleaved real. Returns (o, new Z)."""
    with torch.autocast(q.device.type, enabled=False):
        rdtype = Z.dtype
        B, H, C, M2 = Z.shape
        M = M2 // 2
        z = torch.cat([k, v], dim=-1).to(rdtype)[..., None]  # (B, H, C, 1)
        zr, zi = Z.view(B, H, C, M, 2).unbind(-1)
        (lr, li), (br, bi) = (x.to(rdtype).unbind(-1) for x in (lam_ri, beta_ri))  # (H, M)
        lr, li, br, bi = (x.unsqueeze(-2) for x in (lr, li, br, bi))  # (B?, H, 1, M)
        new = torch.stack([lr * zr - li * zi + br * z, lr * zi + li * zr + bi * z], -1)
        new = new.view(B, H, C, M2)  # X ← λ⊙X + β⊗z, in one fused pass under compile
        o = _read(q, G_hat, new, k.shape[-1])
    return o.to(q.dtype), new
