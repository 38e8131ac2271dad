"""The S4D-only baseline's core: the same complex diagonal recurrence, read out linearly.

Per head h and input channel c: X_t = λ ⊙ X_{t-1} + β z_t ∈ Cᴹ and y_t = Re(cᵀ X_t), with one
mode contraction c ∈ Cᴹ per head (``c = Cᵀ w`` for a full complex C and real weights w).
The output is a causal convolution of z with the kernel K[τ] = Re(Σ_m c_m β_m λ_m^τ), computed
by FFT in O(T log T); the initial-state term and the final state are O(T·M·C) contractions.
Packed documents (``reset``) break the convolution; they take a chunked form instead
(:func:`_chunked_with_resets`), O(T·L) and free of data-dependent control flow.
"""

from __future__ import annotations

import torch

from .interdomain.numerics import contain, poison_output, poison_state
from .interdomain.validation import check_reset
from .powers import complex_powers


def s4d_linear_readout(
    z: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    reset: torch.Tensor | None = None,
):
    """z: (B, T, H, Cz) real; lam, beta, c: (H, M) complex; initial_state: (B, H, M, Cz) complex;
    reset: (B, T) bool, True where a document starts (the state, the initial one included, is
    zeroed before that position), or None.

    Returns y: (B, T, H, Cz) real (z's dtype), or (y, final_state (B, H, M, Cz) complex).
    Computes in fp32 (fp64 for fp64 z), whatever the ambient autocast. A non-finite z reaches
    only its head's later positions in its document (``interdomain.numerics``): the FFT and
    the chunk products would otherwise spread it to every position.
    """
    B, T, H, Cz = z.shape
    check_reset(reset, B, T)
    (z,), _, initial_state, poison = contain((z,), (), reset, initial_state)
    y, X = _readout(z, lam, beta, c, initial_state, reset, return_final_state)
    y = poison_output(y, poison)
    return (y, poison_state(X, poison)) if return_final_state else y


def _readout(z, lam, beta, c, initial_state, reset, need_state: bool):
    """s4d_linear_readout on finite inputs: (y, final state or None unless need_state)."""
    B, T, H, Cz = z.shape
    with torch.autocast(z.device.type, enabled=False):
        rdtype = torch.float64 if z.dtype == torch.float64 else torch.float32
        cdtype = torch.complex128 if rdtype == torch.float64 else torch.complex64
        lam, beta, c, zr = lam.to(cdtype), beta.to(cdtype), c.to(cdtype), z.to(rdtype)
        X0 = None if initial_state is None else initial_state.to(cdtype)
        if reset is not None:
            y, X = _chunked_with_resets(zr, lam, beta, c, X0, reset)
            return y.to(z.dtype), X
        n = torch.arange(T, device=z.device)
        pw = complex_powers(lam, n)  # (H, T, M)
        kernel = ((c * beta)[:, None, :] * pw).sum(-1).real  # (H, T)
        size = 2 * T
        zf = torch.fft.rfft(zr, n=size, dim=1)  # (B, size//2+1, H, Cz)
        kf = torch.fft.rfft(kernel, n=size, dim=1)  # (H, size//2+1)
        y = torch.fft.irfft(zf * kf.T[None, :, :, None], n=size, dim=1)[:, :T]
        if X0 is not None:
            decay0 = c[:, None, :] * lam[:, None, :] * pw  # c ⊙ λ^{t+1}: (H, T, M)
            y = y + torch.einsum("htm,bhmc->bthc", decay0, X0).real
        if not need_state:
            return y.to(z.dtype), None
        w_end = beta[:, None, :] * pw.flip(1)  # β λ^{T-1-s}
        X = torch.einsum("hsm,bshc->bhmc", w_end, zr.to(cdtype))
        if X0 is not None:
            X = X + (lam * pw[:, -1])[None, :, :, None] * X0
    return y.to(z.dtype), X


RESET_CHUNK = 64


def _chunked_with_resets(z, lam, beta, c, X0, reset, L: int = RESET_CHUNK):
    """The linear readout of packed documents, chunk by chunk (z real, lam/beta/c complex).

    Per chunk of L positions: the intra-chunk part is the Toeplitz kernel K[t - s] masked to
    pairs in one document; chunk-end increments Σ_s β λ^{L-1-s} z_s (inputs after the chunk's
    last document start only) are carried to later chunks by an (N × N) decay matrix
    λ^{L(j-1-i)} masked where a document starts in between (all exponents >= 0); each position
    reads its chunk-start state as Re(c ⊙ λ^{t+1} · S_j) if no document started before it in
    the chunk. z is zero-padded to whole chunks at the end (causality keeps earlier outputs).
    Returns (y: (B, T, H, Cz) real, final state (B, H, M, Cz) complex).
    """
    B, T, H, Cz = z.shape
    N = -(-T // L)
    pad = N * L - T
    zc = torch.nn.functional.pad(z, (0, 0, 0, 0, 0, pad)).view(B, N, L, H, Cz)
    rs = torch.nn.functional.pad(reset, (0, pad)).view(B, N, L)
    pw = complex_powers(lam, torch.arange(L + 1, device=z.device))  # λ^0..λ^L: (H, L+1, M)
    # document structure within each chunk
    d = rs.long().cumsum(-1)  # starts so far in the chunk, (B, N, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=z.device).tril()
    same = (d[..., :, None] == d[..., None, :]) & causal  # (B, N, L, L)
    valid = (d == 0).to(z.dtype)  # the chunk-start state reaches t
    contrib = (d == d[..., -1:]).to(z.dtype)  # z_s reaches the chunk end
    starts_before = torch.cumsum(d[..., -1].clamp_max(1), -1)  # chunks with a start, up to j
    # intra-chunk: y[t] = Σ_{s<=t, same doc} K[t - s] z_s
    K = ((c * beta)[:, None, :] * pw[:, :L]).sum(-1).real  # (H, L)
    t = torch.arange(L, device=z.device)
    lag = (t[:, None] - t[None, :]).clamp_min(0)
    W = K[:, lag][None, None] * same[:, :, None].to(z.dtype)  # (B, N, H, L, L)
    y = torch.einsum("bnhts,bnshc->bnthc", W, zc)
    # chunk-end increments and the chunk-start states they build
    end = beta[:, None, :] * pw[:, :L].flip(1)  # β λ^{L-1-s}: (H, L, M)
    inc = torch.einsum("hsm,bnshc->bnhmc", end, (zc * contrib[..., None, None]).to(end.dtype))
    # S_j = Σ_{i<j} reach[j, i] λ^{L(j-1-i)} inc_i + reach0[j] λ^{Lj} X0
    j = torch.arange(N, device=z.device)
    pwL = complex_powers(lam, L * j)  # λ^{L n}: (H, N, M)
    cum = starts_before[:, (j - 1).clamp_min(0)]  # chunks with a start, up to j - 1: (B, N)
    reach = (j[:, None] > j[None, :]) & (cum[:, :, None] == starts_before[:, None, :])
    gap = (j[:, None] - 1 - j[None, :]).clamp_min(0)
    decay = pwL[:, gap].permute(1, 2, 0, 3) * reach[..., None, None]  # (B, N, N, H, M)
    S = torch.einsum("bjihm,bihmc->bjhmc", decay, inc)
    if X0 is not None:
        reach0 = ((j == 0) | (cum == 0)).to(z.dtype)  # (B, N): no start before chunk j
        S = S + reach0[..., None, None, None] * pwL[None].transpose(1, 2)[..., None] * X0[:, None]
    read = c[:, None, :] * pw[:, 1:]  # c ⊙ λ^{t+1}: (H, L, M)
    y = y + torch.einsum("htm,bjhmc->bjthc", read, S).real * valid[..., None, None]
    y = y.reshape(B, N * L, H, Cz)[:, :T]
    # final state: inputs of each row's last document, plus X0 if the row never resets
    doc = reset.long().cumsum(1)
    last_doc = (doc == doc[:, -1:]).to(z.dtype)  # (B, T)
    w_end = beta[:, None, :] * complex_powers(lam, torch.arange(T, device=z.device)).flip(1)
    X = torch.einsum("hsm,bshc->bhmc", w_end, (z * last_doc[..., None, None]).to(w_end.dtype))
    if X0 is not None:
        keep = (doc[:, -1] == 0).to(z.dtype)[:, None, None, None]
        lam_T = complex_powers(lam, torch.tensor([T], device=z.device))[:, 0]  # (H, M)
        X = X + keep * lam_T[None, :, :, None] * X0
    return y, X


def s4d_linear_readout_naive(z, lam, beta, c, initial_state=None, reset=None):
    """Reference: the per-step recurrence (state zeroed where reset). Returns (y, final_state)."""
    B, T, H, Cz = z.shape
    cdtype = torch.complex128
    lam_, beta_ = lam.to(cdtype)[None, :, :, None], beta.to(cdtype)[None, :, :, None]
    X = (
        torch.zeros(B, H, lam.shape[1], Cz, dtype=cdtype)
        if initial_state is None
        else initial_state.to(cdtype)
    )
    ys = []
    for t in range(T):
        if reset is not None:
            X = X * ~reset[:, t, None, None, None]
        X = lam_ * X + beta_ * z[:, t, :, None, :].to(cdtype)
        ys.append(torch.einsum("hm,bhmc->bhc", c.to(cdtype), X).real)
    return torch.stack(ys, 1).to(z.dtype), X


def s4d_linear_step(
    z: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step. z: (B, H, Cz); state: (B, H, M, Cz) complex. Returns (y, new state)."""
    with torch.autocast(z.device.type, enabled=False):
        X = lam[None, :, :, None] * state + beta[None, :, :, None] * z[:, :, None, :].to(
            state.real.dtype
        )
        y = torch.einsum("hm,bhmc->bhc", c.to(X.dtype), X).real
    return y.to(z.dtype), X


__all__ = ["s4d_linear_readout", "s4d_linear_readout_naive", "s4d_linear_step"]
