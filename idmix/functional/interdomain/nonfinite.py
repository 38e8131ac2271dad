"""Containment of non-finite inputs for the fast paths (chunked, its kernels, closed form).

The per-step recurrence contains a NaN/inf by itself: it reaches the state at its position and
every later position of its document, and a reset (a select, never a product with 0) drops it.
The chunked path multiplies whole chunks (0·NaN = NaN inside a matrix product) and would spread
it to earlier positions and later documents. So the fast paths see sanitised inputs, and the
damage is put back where the recurrence would have it:

- a head's inputs at position t are *bad* if any of its q, k or v channels is non-finite there
  (q only at t itself; k and v from t on); the initial state of a head is bad if any entry is;
- bad entries are replaced by zeros before the products;
- the head's output is NaN at every position of the document from the first bad k/v on (and at
  each bad q), every channel; its final state is NaN if its last document is poisoned.

Granularity is the head: where the recurrence would leave some channels finite (a NaN in one
value channel only), the whole head row is NaN here. Everything else (earlier positions, other
documents, other heads) equals the result on the sanitised inputs, i.e. is untouched.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...debug import check_values


class Poison(NamedTuple):
    output: torch.Tensor  # (B, T, H) bool: output rows to set to NaN
    final: torch.Tensor  # (B, H) bool: final states to set to NaN


def _finite(x: torch.Tensor) -> torch.Tensor:
    """isfinite on the values only (on x itself autograd would save x for abs's backward)."""
    return torch.isfinite(x.detach())


def _bad(x: torch.Tensor) -> torch.Tensor:
    """(B, T, H, C) -> (B, T, H): any channel non-finite."""
    return ~_finite(x).all(dim=-1)


def _zero_nonfinite(x: torch.Tensor) -> torch.Tensor:
    """x with non-finite entries zeroed; autograd keeps only the bool mask (1 byte/entry)."""
    return torch.where(_finite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _surely_finite(x0, tensors, initial_state) -> bool:
    """Where a host sync is free (eager, CPU: ``idmix.debug.check_values``), one sum per tensor
    tells that everything is finite and containment can be skipped (an overflowing sum only
    sends finite inputs down the containing path, which is exact for them too). Elsewhere
    (compiled graphs, GPU) containment always runs: it is elementwise and fuses."""
    if not check_values(x0):
        return False
    parts = list(tensors)
    if initial_state is not None:
        parts += (
            list(initial_state) if isinstance(initial_state, (tuple, list)) else [initial_state]
        )
    total = sum(p.detach().sum() for p in parts)
    return bool(torch.isfinite(total))


def _poisoned(bad: torch.Tensor, reset, bad_init) -> torch.Tensor:
    """(B, T, H): a bad position at or before t in t's document (or a bad initial state, for
    document 0), by parallel ops only: the bad count before t's document start, subtracted
    from the running count (no serial scan along T, as torch's cummax would be on a GPU)."""
    B, T, H = bad.shape
    count = bad.long().cumsum(dim=1)  # bad positions in [0, t]
    if reset is None:
        within = count
        doc0 = torch.ones(B, T, 1, dtype=torch.bool, device=bad.device)
    else:
        doc = reset.long().cumsum(dim=1)  # the document of each position; 0 continues the state
        t = torch.arange(T, device=bad.device).expand(B, T)
        first = torch.full((B, T + 1), T, dtype=torch.long, device=bad.device)
        first = first.scatter_reduce(1, doc, torch.where(reset, t, T), "amin", include_self=True)
        start = first.gather(1, doc).clamp(max=T - 1)  # (B, T): t's document start (0 for doc 0)
        start = torch.where(doc == 0, 0, start)
        before = (count - bad.long()).gather(1, start[..., None].expand(B, T, H))
        within = count - before
        doc0 = (doc == 0)[..., None]
    poisoned = within > 0
    if bad_init is not None:
        poisoned = poisoned | (doc0 & bad_init[:, None, :])
    return poisoned


def contain_state(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A state (B, H, ...) -> (it with non-finite entries zeroed, (B, H) bool: heads that had
    one)."""
    return _zero_nonfinite(state), ~_finite(state).flatten(2).all(dim=-1)


def contain(carried, read, reset, initial_state):
    """carried: tensors (B, T, H, ·) that enter the state (k, v; z of the S4D readout); read:
    tensors (B, T, H, ·) used at their own position only (q); initial_state: None, a tensor
    (B, H, ...) or a tuple of them. Returns (carried, read, initial_state) with non-finite
    entries zeroed, and the Poison of the outputs and final state (None: all were finite)."""
    x0 = carried[0]
    if _surely_finite(x0, (*carried, *read), initial_state):
        return carried, read, initial_state, None
    B, T, H = x0.shape[:3]
    bad = torch.zeros(B, T, H, dtype=torch.bool, device=x0.device)
    for x in carried:  # out of place: under torch.func.vmap, x may be batched and bad not
        bad = bad | _bad(x)
    bad_init = None
    if initial_state is not None:  # a bad initial state poisons document 0 of its head
        parts = initial_state if isinstance(initial_state, (tuple, list)) else (initial_state,)
        contained = [contain_state(part) for part in parts]
        clean = tuple(c for c, _ in contained)
        bad_init = torch.stack([bad for _, bad in contained]).any(dim=0)
        initial_state = clean if isinstance(initial_state, (tuple, list)) else clean[0]
    poisoned = _poisoned(bad, reset, bad_init)  # (B, T, H)
    output = poisoned
    for x in read:
        output = output | _bad(x)
    carried = tuple(_zero_nonfinite(x) for x in carried)
    read = tuple(_zero_nonfinite(x) for x in read)
    return carried, read, initial_state, Poison(output, poisoned[:, -1])


def sanitise(q, k, v, reset, initial_state):
    """``contain`` for the interdomain op: returns (q, k, v, initial_state, Poison)."""
    (k, v), (q,), initial_state, poison = contain((k, v), (q,), reset, initial_state)
    return q, k, v, initial_state, poison


# Poison None: nothing was non-finite (``contain`` skipped), outputs pass through.


def poison_output(o: torch.Tensor, poison: Poison | None) -> torch.Tensor:
    """o: (B, T, H, D) with the poisoned rows set to NaN."""
    if poison is None:
        return o
    return torch.where(poison.output[..., None], torch.full((), float("nan"), dtype=o.dtype), o)


def poison_state(state, poison: Poison | None):
    """A final state (B, H, ...) tensor or tuple of them, NaN where its head is poisoned."""
    if poison is None or state is None:
        return state

    def one(x):
        mask = poison.final.view(*poison.final.shape, *([1] * (x.dim() - 2)))
        return torch.where(mask, torch.full((), float("nan"), dtype=x.dtype), x)

    return tuple(one(x) for x in state) if isinstance(state, (tuple, list)) else one(state)
