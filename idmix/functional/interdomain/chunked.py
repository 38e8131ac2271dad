"""Chunked two-pass O(T) algorithm (DESIGN.md §3) in real-valued batched GEMMs.

The sequence is cut into chunks of L positions, and chunks are grouped into segments of
about ``SEGMENT_TOKENS`` positions. Within a segment every step is a batched matmul over all
its chunks; the only sequential work is the chunk-state carry (one complex multiply-add per
chunk). Nothing of size T·M·(R+D) is ever held: besides inputs and output, memory is bounded
by one segment. The backward pass is written out by hand (no autograd through the chunk
loop); it recomputes one segment at a time from the state stored at its start, which is all
the forward keeps besides its inputs.

Layouts inside a segment: q, k (B, H, N, L, R); v (B, H, N, L, D); per-position mode vectors
(.., L, 2M) and states (.., R+D, 2M) = [Xᵏ | Xᵛ]ᵀ, both in interleaved real form (decays.py),
so ``_c`` views them as complex without a copy.
"""

from __future__ import annotations

import torch

from .decays import ChunkDecays, chunk_decays

SEGMENT_TOKENS = 512


def _c(x: torch.Tensor) -> torch.Tensor:
    """Complex view (..., M) of an interleaved real tensor (..., 2M)."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def _r(x: torch.Tensor) -> torch.Tensor:
    """Interleaved real view (..., 2M) of a complex tensor (..., M)."""
    return torch.view_as_real(x).flatten(-2)


def _dot_conj(x: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    """Σ_dim g ⊙ conj(x) for complex tensors (the gradient of a ⊙ x w.r.t. a)."""
    return torch.linalg.vecdot(x, g, dim=dim)


def _shear(X: torch.Tensor) -> torch.Tensor:
    """Y[..., t, a] = X[..., t, t-a] for a <= t, else 0; X: (..., L, L).

    Maps a causal (t, s) matrix to (t, lag) and back (it is its own adjoint and, on lower
    triangles, its own inverse), so the intra-chunk decay β λ^{t-s} becomes one shared
    (lag × 2M) matrix and the intra-chunk contractions become plain GEMMs.
    """
    L = X.shape[-1]
    t = torch.arange(L, device=X.device)
    lag = t[:, None] - t[None, :]
    Y = X.gather(-1, lag.clamp_min(0).expand(X.shape))
    return torch.where(lag >= 0, Y, torch.zeros((), dtype=X.dtype, device=X.device))


def _scan(inc, Z0, c):
    """Linear recurrence over chunks, complex: S_0 = Z0, S_{j+1} = c ⊙ S_j + inc_j.

    inc: (B, H, N, C, M); Z0: (B, H, C, M); c: (H, M).
    Returns (starts: (B, H, N, C, M) = S_0..S_{N-1}, contiguous; S_N: (B, H, C, M)).
    """
    starts = torch.empty_like(inc)
    starts[:, :, 0] = Z0
    c = c[:, None, :]
    N = inc.shape[2]
    for j in range(N - 1):
        torch.addcmul(inc[:, :, j], c, starts[:, :, j], out=starts[:, :, j + 1])
    return starts, torch.addcmul(inc[:, :, N - 1], c, starts[:, :, N - 1])


def _scan_adjoint(g_S, g_end, c):
    """Adjoint of :func:`_scan`: G_N = g_end, G_j = g_S_j + conj(c) ⊙ G_{j+1}.

    Returns (G_1..G_N: (B, H, N, C, M), the gradients of the increments; G_0 = grad of Z0).
    """
    g_inc = torch.empty_like(g_S)
    N = g_S.shape[2]
    g_inc[:, :, N - 1] = g_end
    c = c.conj_physical()[:, None, :]
    for j in range(N - 1, 0, -1):
        torch.addcmul(g_S[:, :, j], c, g_inc[:, :, j], out=g_inc[:, :, j - 1])
    return g_inc, torch.addcmul(g_S[:, :, 0], c, g_inc[:, :, 0])


class _Saved:
    """Forward intermediates of one segment, kept only while its backward runs."""

    __slots__ = ("zT", "starts", "y", "lagged", "p", "w", "u", "mix")


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, L, F) -> (B, H, N·L, F) view."""
    return x.flatten(2, 3)


def _bmm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a @ b in one GEMM pass; acc: (B, H, N, L, F); a: (B, H, N·L, K); b: (H, K, F)."""
    B, H = a.shape[:2]
    out = torch.baddbmm(
        acc.reshape(B * H, -1, acc.shape[-1]), a.flatten(0, 1), b.expand(B, *b.shape).flatten(0, 1)
    )
    return out.view(acc.shape)


def _segment_forward(q, k, v, dec: ChunkDecays, G_hat, Z0, keep: bool = False):
    """One segment. Z0: (B, H, R+D, 2M). Returns (o: (B, H, N, L, D), Z_end, intermediates)."""
    B, H, N, L, R = q.shape
    f = _Saved()
    f.zT = torch.cat([k.transpose(-1, -2), v.transpose(-1, -2)], dim=-2)  # (B, H, N, R+D, L)
    inc = (f.zT.flatten(2, 3) @ dec.end).view(B, H, N, -1, dec.end.shape[-1])  # Σ_s β λ^{L-1-s} z_s
    starts, Z_end = _scan(_c(inc), _c(Z0), _c(dec.chunk))
    f.starts = starts = _r(starts)  # (B, H, N, R+D, 2M) chunk-start states
    start = _c(dec.start)[None, :, None]  # (1, H, 1, L, M) = λ^{i+1}
    # Pass 1: p(t) = λ^{i+1} ⊙ (Xᵏ q_t) + Σ_{s<=t} β λ^{t-s} (q_t · k_s)
    f.y = q @ starts[..., :R, :]  # (B, H, N, L, 2M)
    f.lagged = _shear(q @ k.transpose(-1, -2))  # (B, H, N, L, L): [t, lag] = q_t · k_{t-lag}
    f.p = _bmm_acc(_r(start * _c(f.y)), _flat(f.lagged), dec.by_lag)
    f.w = (_flat(f.p) @ G_hat.mT).view(f.p.shape)  # w̃ = Ĝ p̂
    # Pass 2: o_t = Re(Xᵛᴴ (conj(λ^{i+1}) ⊙ w̃)) + Σ_{s<=t} Re(conj(β λ^{t-s}) · w̃) v_s
    f.u = _r(start.conj_physical() * _c(f.w))
    f.mix = _shear((_flat(f.w) @ dec.by_lag.mT).view(B, H, N, L, L))  # (t, s) weights
    o = torch.baddbmm(
        (f.mix @ v).flatten(0, 2),
        f.u.flatten(0, 2),
        starts[..., R:, :].transpose(-1, -2).flatten(0, 2),
    ).view(v.shape)
    return o, _r(Z_end), (f if keep else None)


def _segment_backward(q, k, v, dec: ChunkDecays, G_hat, Z0, do, dZ_end):
    """Gradients of one segment. Returns (dq, dk, dv, d_decays: ChunkDecays, dG, dZ0)."""
    _, _, f = _segment_forward(q, k, v, dec, G_hat, Z0, keep=True)
    B, H, N, L, R = q.shape
    starts = f.starts
    start = _c(dec.start)[None, :, None]
    start_conj = start.conj_physical()
    # o = u Xᵛᵀ + mix v, mix = shear(w by_lagᵀ), u = conj(start) ⊙ w
    dv = f.mix.transpose(-1, -2) @ do
    d_mix = _shear(do @ v.transpose(-1, -2))  # (B, H, N, L, lag)
    du = do @ starts[..., R:, :]  # (B, H, N, L, 2M)
    dXv = do.transpose(-1, -2) @ f.u  # (B, H, N, D, 2M)
    dw = (_flat(d_mix) @ dec.by_lag).view(du.shape) + _r(start * _c(du))
    d_by_lag = (_flat(d_mix).transpose(-1, -2) @ _flat(f.w)).sum(0)
    # start enters as start ⊙ y and as conj(start) ⊙ w: gradient Σ dp ⊙ conj(y) + w ⊙ conj(du)
    d_start = _dot_conj(_c(du), _c(f.w), dim=2).sum(0)
    # w = Ĝ p
    dp = (_flat(dw) @ G_hat).view(dw.shape)
    dG = (_flat(dw).transpose(-1, -2) @ _flat(f.p)).sum(0)
    # p = start ⊙ y + shear(q kᵀ) by_lag
    d_lagged = (_flat(dp) @ dec.by_lag.mT).view(B, H, N, L, L)
    d_by_lag = d_by_lag + (_flat(f.lagged).transpose(-1, -2) @ _flat(dp)).sum(0)
    d_scores = _shear(d_lagged)
    dy = _r(start_conj * _c(dp))
    d_start = _r(d_start + _dot_conj(_c(f.y), _c(dp), dim=2).sum(0))
    # y = q Xᵏ, scores = q kᵀ
    dq = dy @ starts[..., :R, :].transpose(-1, -2) + d_scores @ k
    dk = d_scores.transpose(-1, -2) @ q
    dS = torch.cat([q.transpose(-1, -2) @ dy, dXv], dim=-2)  # (B, H, N, R+D, 2M)
    g_inc, dZ0 = _scan_adjoint(_c(dS), _c(dZ_end), _c(dec.chunk))
    g_inc = _r(g_inc)  # gradient of each chunk's increment, (B, H, N, R+D, 2M)
    d_chunk = _r(_dot_conj(_c(starts), _c(g_inc), dim=-2).sum((0, 2)))
    d_end = (f.zT.flatten(2, 3).transpose(-1, -2) @ g_inc.flatten(2, 3)).sum(0)
    dzT = (g_inc.flatten(2, 3) @ dec.end.mT).view(f.zT.shape)  # (B, H, N, R+D, L)
    dk = dk + dzT[..., :R, :].transpose(-1, -2)
    dv = dv + dzT[..., R:, :].transpose(-1, -2)
    return dq, dk, dv, ChunkDecays(d_by_lag, d_start, d_end, d_chunk), dG, _r(dZ0)


def _plan(T: int, L: int) -> list[tuple[int, int, int]]:
    """Pieces (t0, n_chunks, chunk_len) covering [0, T): full segments, then a ragged tail."""
    per_seg = max(1, SEGMENT_TOKENS // L)
    full = T // L
    pieces = [(c * L, min(per_seg, full - c), L) for c in range(0, full, per_seg)]
    if T % L:
        pieces.append((full * L, 1, T % L))
    return pieces


def _to_chunks(x: torch.Tensor, t0: int, n: int, L: int) -> torch.Tensor:
    """(B, T, H, F) -> (B, H, n, L, F) copy of positions [t0, t0 + n·L)."""
    B, _, H, F = x.shape
    return x[:, t0 : t0 + n * L].reshape(B, n, L, H, F).permute(0, 3, 1, 2, 4).contiguous()


def _write_chunks(dst: torch.Tensor, t0: int, x: torch.Tensor) -> None:
    """Write x: (B, H, n, L, F) into dst: (B, T, H, F) at positions [t0, t0 + n·L)."""
    B, H, n, L, F = x.shape
    dst[:, t0 : t0 + n * L] = x.permute(0, 2, 3, 1, 4).reshape(B, n * L, H, F)


def _all_decays(lam_ri, beta_ri, T, L) -> dict[int, ChunkDecays]:
    return {Lp: chunk_decays(lam_ri, beta_ri, Lp) for Lp in {p[2] for p in _plan(T, L)}}


class ChunkedInterdomain(torch.autograd.Function):
    """Real-form chunked op with a hand-written, segment-recomputing backward.

    Inputs: q, k: (B, T, H, R); v: (B, T, H, D); lam_ri, beta_ri: (H, M, 2);
    G_hat: (H, 2M, 2M) in interleaved order; Z0: (B, H, R+D, 2M); L: chunk length.
    Outputs: o (B, T, H, D), Z_end (B, H, R+D, 2M). One real dtype (fp32 or fp64) for all.
    """

    @staticmethod
    def forward(ctx, q, k, v, lam_ri, beta_ri, G_hat, Z0, L):
        B, T, H, _ = q.shape
        decays = _all_decays(lam_ri, beta_ri, T, L)
        o = q.new_empty(B, T, H, v.shape[-1])
        Z, starts = Z0.contiguous(), []
        for t0, n, Lp in _plan(T, L):
            starts.append(Z)
            chunks = [_to_chunks(x, t0, n, Lp) for x in (q, k, v)]
            o_p, Z, _ = _segment_forward(*chunks, decays[Lp], G_hat, Z)
            _write_chunks(o, t0, o_p)
        ctx.L, ctx.device_type = L, q.device.type
        ctx.save_for_backward(q, k, v, lam_ri, beta_ri, G_hat, *starts)
        return o, Z

    @staticmethod
    def backward(ctx, do, dZ_end):
        with torch.autocast(ctx.device_type, enabled=False):
            return ChunkedInterdomain._backward(ctx, do, dZ_end)

    @staticmethod
    def _backward(ctx, do, dZ_end):
        q, k, v, lam_ri, beta_ri, G_hat, *starts = ctx.saved_tensors
        T = q.shape[1]
        with torch.enable_grad():
            lam_, beta_ = lam_ri.detach().requires_grad_(), beta_ri.detach().requires_grad_()
            decays = _all_decays(lam_, beta_, T, ctx.L)
        d_decays = {Lp: [torch.zeros_like(t) for t in d] for Lp, d in decays.items()}
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dG = torch.zeros_like(G_hat)
        dZ = torch.zeros_like(starts[0]) if dZ_end is None else dZ_end.contiguous()
        for (t0, n, Lp), Z0 in reversed(list(zip(_plan(T, ctx.L), starts, strict=True))):
            chunks = [_to_chunks(x, t0, n, Lp) for x in (q, k, v)]
            dec = ChunkDecays(*(t.detach() for t in decays[Lp]))
            do_p = torch.zeros_like(chunks[2]) if do is None else _to_chunks(do, t0, n, Lp)
            gq, gk, gv, g_dec, g_G, dZ = _segment_backward(*chunks, dec, G_hat, Z0, do_p, dZ)
            for dst, g in zip((dq, dk, dv), (gq, gk, gv), strict=True):
                _write_chunks(dst, t0, g)
            for acc, g in zip(d_decays[Lp], g_dec, strict=True):
                acc += g
            dG += g_G
        outs = [t for d in decays.values() for t in d]
        grads = [g for Lp in decays for g in d_decays[Lp]]
        dlam, dbeta = torch.autograd.grad(outs, (lam_, beta_), grads)
        return dq, dk, dv, dlam, dbeta, dG, dZ, None
