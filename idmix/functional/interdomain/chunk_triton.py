"""The shared-decay segment primitives on the Triton kernels (``idmix_kernels``, the top-level
``kernels/`` package): the interface of ``chunk_torch.TorchChunkOps``. The kernels read bf16 and
fp16 chunk copies as they are and compute in fp32; each backward pass recomputes its own
forward pass, so only the chunk-start states are recomputed here."""

from __future__ import annotations

from .chunk_layout import reset_of
from .chunk_torch import IntraGrads, flat
from .decays import ChunkDecays
from .precision import matmul


class TritonChunkOps:
    """The four segment primitives as kernel launches; kernels: the idmix_kernels module."""

    def __init__(self, kernels):
        self.kernels = kernels

    @staticmethod
    def chunk_dtype(x):
        return x.dtype

    def chunk_states(self, zT, dec: ChunkDecays, Z0, masks, precision):
        """One fused kernel: the increments are tile products inside the scan, never stored."""
        return self.kernels.chunk_states(zT, dec.end, dec.chunk, Z0, reset_of(masks), precision)

    def intra_forward(self, q, zT, starts, dec, G_hat, masks, precision):
        reset, R = reset_of(masks), q.shape[-1]
        p = self.kernels.intra_chunk_pass1(q, zT, starts, dec.start, dec.end, reset, precision)
        w = matmul(flat(p), G_hat.mT, precision).view(p.shape)
        return self.kernels.intra_chunk_pass2(
            w, zT, starts, dec.start, dec.end, R, reset, precision
        )

    def intra_backward(self, q, zT, starts, dec, G_hat, do, masks, precision) -> IntraGrads:
        k, reset, R = self.kernels, reset_of(masks), q.shape[-1]
        p = k.intra_chunk_pass1(q, zT, starts, dec.start, dec.end, reset, precision)
        w = matmul(flat(p), G_hat.mT, precision).view(p.shape)
        dv, dXv, dw, ge2, gs2 = k.intra_chunk_pass2_backward(
            do, w, zT, starts, dec.start, dec.end, R, reset, precision
        )
        dp = matmul(flat(dw), G_hat, precision).view(dw.shape)
        dG = matmul(flat(dw).transpose(-1, -2), flat(p), precision).sum(0)
        dq, dkT, dXk, ge1, gs1 = k.intra_chunk_pass1_backward(
            dp, q, zT, starts, dec.start, dec.end, reset, precision
        )
        d_start = gs1.sum((0, 2)) + gs2.sum((0, 2))  # each read once, no temporary
        d_end = ge1.sum((0, 2)) + ge2.sum((0, 2))
        return IntraGrads(dq, dkT, dv.mT, (dXk, dXv), d_start, d_end, dG)

    def chunk_states_backward(self, dS, dZ_end, dec, starts, masks, precision):
        L = dec.start.shape[1]
        return self.kernels.chunk_states_backward(
            *dS, dZ_end, dec.chunk, starts, L, reset_of(masks)
        )
