"""Variable-length packed sequences (``cu_seqlens``), each with its own initial and final
state, in the runtime form (N, H, R+D, 2M) interleaved real; the complex API a thin wrapper."""

from __future__ import annotations

import torch

from ..readout import readout_gram
from .api import compute_dtypes, interdomain_attention_real
from .realform import interleaved_to_state, state_to_interleaved
from .validation import (
    CHUNKED_PATH,
    CHUNKED_PATH_REAL,
    PLAIN_IMPLS,
    State,
    check_devices,
    check_params,
    check_qkv,
    check_real_params,
    check_real_state,
    check_state,
    check_transforms,
)


def check_cu_seqlens(cu_seqlens, total: int) -> list[int]:
    """cu_seqlens: (N+1,) integer tensor, 0 = c_0 < c_1 < … < c_N = total. Returns it as a list."""
    if (
        not isinstance(cu_seqlens, torch.Tensor)
        or cu_seqlens.dim() != 1
        or cu_seqlens.dtype not in (torch.int32, torch.int64)
        or cu_seqlens.numel() < 2
    ):
        raise ValueError("cu_seqlens: expected a 1-d int32/int64 tensor of N+1 offsets, N >= 1")
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != total or any(b <= a for a, b in zip(cu, cu[1:], strict=False)):
        raise ValueError(
            f"cu_seqlens: expected strictly increasing offsets from 0 to the packed length "
            f"{total} (no empty sequence), got {cu}"
        )
    return cu


def varlen(attend, tokens, cu_seqlens, M: int, initial_state, final: bool):
    """Runs attend(tokens, reset, initial_state) -> (o, state) over packed sequences.

    tokens: the per-position inputs, each (1, S, ...): q, k: (1, S, H, R), v: (1, S, H, D),
    then per-token decays if any; initial_state: (N, H, R+D, 2M) real or None; attend takes
    and returns states in that form. Without initial or final states: one call on the packed
    row with a reset at every sequence start. Otherwise the sequences are grouped by length
    and each group runs as one batch (exact; one call per distinct length).
    Returns (o (1, S, H, D), final states or None).
    """
    q, v = tokens[0], tokens[2]
    if q.shape[0] != 1:
        raise ValueError(f"q: expected a packed batch of 1 row with cu_seqlens, got B={q.shape[0]}")
    S, H, R, D = q.shape[1], q.shape[2], q.shape[3], v.shape[3]
    cu = check_cu_seqlens(cu_seqlens, S)
    N = len(cu) - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, H, R + D, 2 * M):
        raise ValueError(
            f"initial_state: expected (N, H, R+D, 2M) = {(N, H, R + D, 2 * M)}, got "
            f"{tuple(initial_state.shape)}"
        )
    if initial_state is None and not final:
        reset = torch.zeros(1, S, dtype=torch.bool, device=q.device)
        reset[0, cu[:-1]] = True
        return attend(tokens, reset, None)[0], None
    lengths = [b - a for a, b in zip(cu, cu[1:], strict=False)]
    positions, outs, members, finals = [], [], [], []
    for length in sorted(set(lengths)):
        rows = [i for i, n in enumerate(lengths) if n == length]
        starts = torch.tensor([cu[i] for i in rows], device=q.device)
        index = starts[:, None] + torch.arange(length, device=q.device)  # (n, length)
        init = None if initial_state is None else initial_state[rows]
        o, state = attend([x[0, index] for x in tokens], None, init)
        positions.append(index.flatten())
        outs.append(o.flatten(0, 1))
        members += rows
        finals.append(state)
    o = torch.cat(outs)[torch.cat(positions).argsort()][None]
    if not final:
        return o, None
    order = torch.tensor(members, device=q.device).argsort()
    return o, torch.cat(finals)[order]


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
