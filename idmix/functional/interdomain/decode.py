"""Single-token decode step (DESIGN.md §4): O(M(R+D) + M²) per head.

The state tensors keep their documented shapes, (B, H, M, R) and (B, H, M, D), but the fast
path wants them stored mode-last, i.e. as transposes of contiguous (B, H, R, M) tensors (what
the chunked path returns and ``empty_state`` allocates): then every product below is a real
matrix-vector product over an interleaved real view, with no copy of the state.
"""

from __future__ import annotations

import torch

from .validation import State


def empty_state(B, H, M, R, D, dtype=torch.complex64, device=None) -> State:
    """Zero state (Xk: (B, H, M, R), Xv: (B, H, M, D)) in the decode step's mode-last layout."""
    Z = torch.zeros(B, H, R + D, M, dtype=dtype, device=device).mT
    return Z[..., :R], Z[..., R:]


def _mode_last(X: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(B, H, M, C) complex -> ((B, H, C, M) with unit stride over M, whether it is a view)."""
    XT = X.mT
    if XT.stride(-1) == 1 and XT.stride(-2) == XT.shape[-1]:
        return XT, True
    # clone, not .contiguous(): with M = 1 a transposed tensor already counts as contiguous
    # while its last stride is not 1
    return XT.clone(memory_format=torch.contiguous_format), False


def _interleaved(x: torch.Tensor) -> torch.Tensor:
    """(..., M) complex -> (..., 2M) real view (re₀, im₀, re₁, …)."""
    return torch.view_as_real(x).flatten(-2)


BACKENDS = ("torch", "triton")


def _pick_backend(backend: str | None, q: torch.Tensor) -> str:
    if backend is None:
        if not q.is_cuda:
            return "torch"
        try:
            import idmix_kernels  # noqa: F401
        except ImportError:
            return "torch"
        return "triton"
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or None, got {backend!r}")
    return backend


def _triton_step(q, k, v, lam, beta, G_hat, state, inplace):
    import idmix_kernels

    if q.dim() != 3:
        raise ValueError(f"q: the triton decode step takes (B, H, R), got {tuple(q.shape)}")
    Xk, Xv = state if inplace else tuple(X.clone() for X in state)  # clone keeps the layout
    work = []
    for X in (Xk, Xv):
        XT, is_view = _mode_last(X.to(torch.complex64))
        work.append((XT, is_view and X.dtype == torch.complex64))
    o = idmix_kernels.decode_step_triton(q, k, v, lam, beta, G_hat, *(XT.mT for XT, _ in work))
    for X, (XT, is_view) in zip((Xk, Xv), work, strict=True):
        if not is_view:  # the kernel updated a copy in its layout
            X.copy_(XT.mT)
    return o.to(q.dtype), (Xk, Xv)


def interdomain_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    G_hat: torch.Tensor,
    state: State,
    inplace: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, State]:
    """Advance the state by one position and read it out.

    q: (B, H, R), or (B, H, r, R) for r query heads reading each state head (grouped state);
    k: (B, H, R); v: (B, H, D); lam, beta: (H, M) complex; G_hat: (H, 2M, 2M) real, blocked
    (``readout_gram(C, readout)``, computed once per set of weights, not per step);
    state: (Xk: (B, H, M, R), Xv: (B, H, M, D)) complex, updated in place if ``inplace``.
    Returns (o: (B, H, D), or (B, H, r, D), in q's dtype; new state).

    Steps: X ← λ⊙X + β⊗z; p = Xᵏ q; w̃ = Ĝ [Re p; Im p]; o = Re(Xᵛᴴ (w̃[:M] + i w̃[M:])).
    U and Γ are never formed (the paper's O(M²(R+D)) form); the state is read once.

    backend: "torch", "triton" (the fused in-place kernel of ``idmix_kernels``; on CPU only
    under TRITON_INTERPRET=1; 3-dim q and complex64 mode-last states), or None: triton for
    CUDA tensors when it is installed, torch otherwise.
    """
    if _pick_backend(backend, q) == "triton":
        return _triton_step(q, k, v, lam, beta, G_hat, state, inplace)
    with torch.autocast(q.device.type, enabled=False):
        rdtype = G_hat.dtype
        lam_, beta_ = lam[:, None, :], beta[:, None, :]  # (H, 1, M)
        new, views = [], []
        for X, z in zip(state, (k, v), strict=True):
            XT, is_view = _mode_last(X)  # (B, H, C, M)
            zb = beta_ * z[..., None].to(rdtype)  # (B, H, C, M)
            if inplace and is_view:
                new.append(XT.mul_(lam_).add_(zb))
            else:
                new.append(torch.addcmul(zb, lam_, XT))
            views.append(is_view)
        KT, VT = new
        B, H, M = KT.shape[0], KT.shape[1], KT.shape[-1]
        rows = q.to(rdtype) if q.dim() == 4 else q.to(rdtype)[:, :, None, :]  # (B, H, r, R)
        r = rows.shape[2]
        p = rows @ _interleaved(KT)  # (B, H, r, 2M) interleaved
        p_blocked = p.view(B, H, r, M, 2).transpose(-1, -2).reshape(B, H, r, 2 * M)
        # Row-vector products throughout: CPU BLAS is several times faster at x @ A than A @ x.
        w = (p_blocked @ G_hat.mT).view(B, H, r, 2, M).transpose(-1, -2).reshape(B, H, r, 2 * M)
        o = w @ _interleaved(VT).mT  # Σ_m Re(Xᵛ)w_re + Im(Xᵛ)w_im: (B, H, r, D)
        o = o if q.dim() == 4 else o.squeeze(-2)
        Xk, Xv = KT.mT, VT.mT
        if inplace:
            for old, fresh, is_view in zip(state, (Xk, Xv), views, strict=True):
                if not is_view:
                    old.copy_(fresh)
            Xk, Xv = state
    return o.to(q.dtype), (Xk, Xv)
