"""Which positions of a batch hold tokens, and each new token's position, from transformers'
(B, past + T) attention mask (1 = token, 0 = left padding) or position ids."""

from __future__ import annotations

import torch


def token_keys(attention_mask, input_ids, past: int, only_new: bool = False) -> torch.Tensor:
    """(B, past + T) bool: which positions hold tokens (attention_mask, or all); only_new: the
    last T columns only, (B, T), the others neither read nor copied (a decode step's)."""
    B, T = input_ids.shape
    if attention_mask is None:
        width = T if only_new else past + T
        return torch.ones(B, width, dtype=torch.bool, device=input_ids.device)
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (B, past + T):
        raise ValueError(
            f"attention_mask: expected ({B}, {past + T}) (the cache's {past} positions and "
            f"{T} new ones; 2-d), got {tuple(attention_mask.shape)}"
        )
    keys = attention_mask[:, -T:] if only_new else attention_mask
    return keys.to(device=input_ids.device, dtype=torch.bool)


def token_positions(position_ids, keys: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) positions: position_ids, else counted over the tokens (0 on padding and on each
    row's first token: a document start)."""
    if position_ids is not None:
        return position_ids[:, -T:].to(keys.device)
    return (keys.long().cumsum(-1) - 1).clamp_min(0)[:, -T:]
