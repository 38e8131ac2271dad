"""Decoding state of one mixer layer, held in tensordict TensorClasses (batch dim first)."""

from __future__ import annotations

import torch
from tensordict import tensorclass

from ..debug import check_values
from ..functional import interleaved_to_state


def _check_batch(rows: int, B: int) -> None:
    """The layer input's batch size B against the cache's rows (Python ints: no sync)."""
    if B != rows:
        raise ValueError(
            f"x: batch size {B} does not match the decoding cache's batch size {rows} "
            f"(setup_cache(batch_size={rows})); call setup_cache(batch_size={B}, ...) for a "
            f"batch of {B}"
        )


@tensorclass
class RecurrentCache:
    """SSM mixer state: constant in the context length.

    state: (B, H, R+D, 2M) fp32, the key and value states in the interleaved real form of
    ``interdomain_attention`` (complex views: :meth:`complex_state`);
    conv_q, conv_a, conv_b: (B, W-1, d) short-conv histories of the query and the two input
    branches ((B, 0, d) for a branch without a conv).
    """

    state: torch.Tensor
    conv_q: torch.Tensor
    conv_a: torch.Tensor
    conv_b: torch.Tensor

    @classmethod
    def empty(
        cls, batch_size, num_heads, num_modes, key_dim, value_dim, conv_shapes, dtype, device=None
    ):
        """conv_shapes: ((W-1, channels) of the query, a and b branches)."""
        C = key_dim + value_dim
        state = torch.zeros(batch_size, num_heads, C, 2 * num_modes, device=device)
        convs = [torch.zeros(batch_size, w, c, dtype=dtype, device=device) for w, c in conv_shapes]
        return cls(
            state=state,
            conv_q=convs[0],
            conv_a=convs[1],
            conv_b=convs[2],
            batch_size=[batch_size],
        )

    def check_batch(self, B: int) -> None:
        """A layer input of B rows fits this cache (its batch size)."""
        _check_batch(self.state.shape[0], B)

    def complex_state(self, key_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(Xk: (B, H, M, R), Xv: (B, H, M, D)) complex64 views of ``state``."""
        return interleaved_to_state(self.state, key_dim)

    def reset_rows(self, rows: torch.Tensor) -> None:
        """Zero the state of the batch rows where rows (B,) is True (a new document starts)."""
        _zero_rows(rows, self.state, (self.conv_q, self.conv_a, self.conv_b))


def _zero_rows(rows: torch.Tensor, state: torch.Tensor, convs) -> None:
    """Zero the (B, ·, ·, ·) state and the (B, ·, ·) conv histories where rows (B,) is True."""
    new = rows.view(-1, 1, 1, 1)  # a select, not a product: 0·NaN would keep a NaN
    state.copy_(torch.where(new, 0, state))
    for conv in convs:
        conv.copy_(torch.where(new[..., 0], 0, conv))


@tensorclass
class MatrixStateCache:
    """Linear-attention mixer state (GLA, Mamba-2, Gated DeltaNet): constant in the context.

    state: (B, H, K, V) fp32, the matrix S of o = Sᵀ q; conv_q, conv_k, conv_v: (B, W-1, ·)
    short-conv histories of the query, key and value branches ((B, 0, 0) without a conv).
    """

    state: torch.Tensor
    conv_q: torch.Tensor
    conv_k: torch.Tensor
    conv_v: torch.Tensor

    @classmethod
    def empty(cls, batch_size, num_heads, key_dim, value_dim, conv_shapes, dtype, device=None):
        """conv_shapes: ((W-1, channels) of the query, key and value branches)."""
        state = torch.zeros(batch_size, num_heads, key_dim, value_dim, device=device)
        convs = [torch.zeros(batch_size, w, c, dtype=dtype, device=device) for w, c in conv_shapes]
        return cls(state, *convs, batch_size=[batch_size])

    def check_batch(self, B: int) -> None:
        """A layer input of B rows fits this cache (its batch size)."""
        _check_batch(self.state.shape[0], B)

    def reset_rows(self, rows: torch.Tensor) -> None:
        """Zero the state of the batch rows where rows (B,) is True (a new document starts)."""
        _zero_rows(rows, self.state, (self.conv_q, self.conv_k, self.conv_v))


@tensorclass
class KVCache:
    """Softmax attention cache: k, v (B, H, S_max, d_h) and the number of filled positions."""

    k: torch.Tensor
    v: torch.Tensor
    length: torch.Tensor  # (B,) int64, equal across rows

    def check_room(self, B: int, T: int) -> None:
        """A layer input of B rows and T positions fits: the cache's batch size, and room for T
        more positions within max_seq_len (S_max). T > S_max is refused always; the filled
        length is a tensor, so past that it is checked where ``idmix.debug.check_values``
        allows a host sync (eager on CPU, or IDMIX_DEBUG=1): index_copy_ would otherwise fail
        with an index error (CPU) or a device assert (CUDA)."""
        _check_batch(self.k.shape[0], B)
        S = self.k.shape[2]
        if T > S:
            raise ValueError(
                f"x: {T} positions do not fit the KV cache's max_seq_len = {S}; call "
                "setup_cache with a larger max_seq_len"
            )
        if check_values(self.length):
            filled = int(self.length[0])
            if filled + T > S:
                raise ValueError(
                    f"x: {T} more position(s) would go past the KV cache's max_seq_len = {S} "
                    f"({filled} filled); call setup_cache with a larger max_seq_len (or "
                    "reset_cache to start a new sequence)"
                )

    @classmethod
    def empty(cls, batch_size, num_heads, max_seq_len, head_dim, dtype, device=None):
        shape = (batch_size, num_heads, max_seq_len, head_dim)
        return cls(
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
            length=torch.zeros(batch_size, dtype=torch.long, device=device),
            batch_size=[batch_size],
        )


@tensorclass
class Mamba3Cache:
    """Mamba-3's decoding state (fp32), constant in the context: state (B, H, N, P) h; k
    (B, H, N) and x (B, H, P) the previous token's rotated key and value (the trapezoid's second
    term); angle (B, H, S) the running rotation angles."""

    state: torch.Tensor
    k: torch.Tensor
    x: torch.Tensor
    angle: torch.Tensor

    @classmethod
    def empty(cls, batch_size, num_heads, state_dim, head_dim, num_angles, device=None):
        B, H = batch_size, num_heads
        zeros = lambda *shape: torch.zeros(*shape, device=device)  # noqa: E731
        return cls(
            zeros(B, H, state_dim, head_dim), zeros(B, H, state_dim), zeros(B, H, head_dim),
            zeros(B, H, num_angles), batch_size=[batch_size],
        )  # fmt: skip

    def check_batch(self, B: int) -> None:
        """A layer input of B rows fits this cache (its batch size)."""
        _check_batch(self.state.shape[0], B)

    def reset_rows(self, rows: torch.Tensor) -> None:
        """Zero every part where rows (B,) is True (a new document starts)."""
        for part in (self.state, self.k, self.x, self.angle):
            part.copy_(torch.where(rows.view(-1, *[1] * (part.dim() - 1)), 0, part))
