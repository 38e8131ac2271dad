"""Variable-length packed sequences (``cu_seqlens``), each with its own initial and final
state, in the runtime form (N, H, R+D, 2M) interleaved real."""

from __future__ import annotations

import torch


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
    """Runs attend(*tokens, reset, initial_state, final) -> (o, state) over packed sequences.

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
        return attend(*tokens, reset, None, False)[0], None
    lengths = [b - a for a, b in zip(cu, cu[1:], strict=False)]
    positions, outs, members, finals = [], [], [], []
    for length in sorted(set(lengths)):
        rows = [i for i, n in enumerate(lengths) if n == length]
        starts = torch.tensor([cu[i] for i in rows], device=q.device)
        index = starts[:, None] + torch.arange(length, device=q.device)  # (n, length)
        init = None if initial_state is None else initial_state[rows]
        o, state = attend(*(x[0, index] for x in tokens), None, init, True)
        positions.append(index.flatten())
        outs.append(o.flatten(0, 1))
        members += rows
        finals.append(state)
    o = torch.cat(outs)[torch.cat(positions).argsort()][None]
    if not final:
        return o, None
    order = torch.tensor(members, device=q.device).argsort()
    return o, torch.cat(finals)[order]
