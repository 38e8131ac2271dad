"""The chunked O(T) algorithm (docs/design.md §4) in plain einsums, shared decays only (no
reset): a short listing for reading, between ``interdomain_attention_naive`` and the kernels.

q, k: (B, T, H, R); v: (B, T, H, D); lam, beta: (H, M) complex; C: (H, M, M) complex;
initial_state: (Xk (B, H, M, R), Xv (B, H, M, D)) complex, or None for zeros. Returns
(o (B, T, H, D) in q's dtype, (Xk, Xv) after the last token), as the naive reference does;
computes in C's complex dtype. With L = chunk_size, position i of chunk j (t = jL + i), the
chunk's start state X⁽ʲ⁾ (rows: R key, D value channels), z_s = [k_s; v_s],
G = CᴴC ("conj") or CᵀC ("product") and read = conj ("conj") or identity ("product"):

  pass 1  p(t) = λ^{i+1} ⊙ (X⁽ʲ⁾ᵏ q_t) + Σ_{s≤i} β λ^{i−s} (q_t · k_s),   w(t) = G p(t)
  pass 2  o_t = Re(Σ_m read(λ_m^{i+1} X⁽ʲ⁾ᵛ_m + Σ_{s≤i} β_m λ_m^{i−s} v_s) w_m(t))
  state   X⁽ʲ⁺¹⁾ = λ^{e+1} ⊙ X⁽ʲ⁾ + Σ_{s≤e} β λ^{e−s} z_s,   e: the chunk's last real position

That is the naive o_t = Re(Γ_tᴴ a_t) (ᵀ: "product"), Γ_t = C Xᵛ(t), a_t = C Xᵏ(t) q_t, with no
per-position state formed. T is zero-padded to whole chunks; the causal lag table (s ≤ e)
keeps the padding out of the last state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..powers import complex_powers
from .validation import State


def interdomain_attention_chunk_minimal(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    beta: torch.Tensor,
    C: torch.Tensor,
    readout: str = "conj",
    initial_state: State | None = None,
    chunk_size: int = 16,
) -> tuple[torch.Tensor, State]:
    B, T, H, R = q.shape
    D, M, L, cd, dev = v.shape[-1], lam.shape[-1], chunk_size, C.dtype, q.device
    n, out_dtype = -(-T // L), q.dtype  # chunks; o's dtype (q, k, v become complex chunks)
    lam, beta = lam.to(cd), beta.to(cd)
    read = (lambda x: x.conj()) if readout == "conj" else (lambda x: x)
    G = read(C).mT @ C  # (H, M, M)
    lag = torch.arange(L, device=dev)[:, None] - torch.arange(L, device=dev)  # (L, L): i − s
    decay = torch.where(  # (H, L, L, M): β λ^{i−s}, zero for s > i
        (lag >= 0)[..., None], beta[:, None, None] * complex_powers(lam, lag.clamp_min(0)), 0
    )
    lam_pow = complex_powers(lam, torch.arange(1, L + 1, device=dev))  # (H, L, M): λ^{i+1}
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, n * L - T)).to(cd).unflatten(1, (n, L)) for x in (q, k, v))
    # State pass: each chunk's end state is the state at its last real position e.
    ends = [L - 1] * (n - 1) + [(T - 1) % L]
    dX = torch.einsum("hjsm,bjshc->bjhmc", decay[:, ends], torch.cat([k, v], -1))
    X = [torch.zeros(B, H, M, R + D, dtype=cd, device=dev)]
    if initial_state is not None:
        X = [torch.cat(initial_state, -1).to(cd)]
    for j in range(n):
        X.append(lam_pow[:, ends[j], :, None] * X[-1] + dX[:, j])
    Xk, Xv = torch.stack(X[:-1], 1).split([R, D], -1)  # (B, n, H, M, ·): chunk start states
    # Pass 1: p = carried state read by the query + decay-weighted masked q·k within the chunk.
    p = torch.einsum("bjihr,bjhmr,him->bjihm", q, Xk, lam_pow)
    p = p + torch.einsum("bjihr,bjshr,hism->bjihm", q, k, decay)
    w = torch.einsum("hmn,bjihn->bjihm", G, p)
    # Pass 2: o = carried values read by w + v_s weighted by read(β λ^{i−s}) · w within the chunk.
    o = torch.einsum("bjihm,him,bjhmd->bjihd", w, read(lam_pow), read(Xv))
    o = o + torch.einsum("bjihm,hism,bjshd->bjihd", w, read(decay), v)
    return o.real.flatten(1, 2)[:, :T].to(out_dtype), X[-1].split([R, D], -1)
