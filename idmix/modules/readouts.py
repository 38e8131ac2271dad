"""How an SSM mixer reads its state: the query-conditioned readout of Interdomain Attention and
the linear (S4D-only) readout. Both take the two normalised input halves a (keys) and b
(values), the S4D core and the state in the one runtime form, (B, G, 2d_h, 2M) interleaved
real (``idmix.functional.state_to_interleaved``), and return per-head outputs.

    forward(q, a, b, core, state, reset) -> (o (B, T, H, d_h), final state)
    step(q, a, b, core, state) -> o (B, H, d_h), the state advanced in place

q: (B, T, H, d_h) (None for a readout without a query); a, b: (B, T, G, d_h); state: None or
the initial state; reset: (B, T) bool document starts or None. A query readout runs the op
it was built with (``attention``): on the whole sequence, or, when ``SSMArgs.context_parallel``
is set, on this rank's slice of a split one (``QueryReadout.attention_for``).
``c_degree``: the degree of the output in C (the calibration at init takes that root of the
scale). ``from_args(SSMArgs)`` builds a readout for ``ssm_mixer``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional import (
    READOUTS,
    interdomain_attention,
    interdomain_decode_step,
    interleaved_to_state,
    s4d_linear_readout,
    s4d_linear_step,
    state_to_interleaved,
)
from ..functional.interdomain.validation import check_backend, check_chunk_size, check_precision
from .parts import ReadoutParts, SSMArgs


def whole_sequence(q, k, v, lam_ri, beta_ri, G_hat, state, **options):
    """The op on the real-form state the readouts keep: (o, final state)."""
    return interdomain_attention(
        q, k, v, lam_ri, beta_ri, G_hat, initial_state=state, output_final_state=True, **options
    )


class QueryReadout(nn.Module):
    """o = Re(Γᴴ U ξ(q)) ("conj") or Re(Γᵀ U ξ(q)) ("product"), through the chunked O(T) path
    in training and the O(1) step in decoding; U and Γ are never formed (docs/design.md §2).

    With num_state_groups G < H, the r = H/G query heads of a group read one shared state
    (like GQA: the state shrinks H/G times). attention: the op it runs, ``whole_sequence`` or
    a ``ContextParallel.op()``. No parameters.
    """

    c_degree = 2  # the output depends on C through CᴴC
    needs_query = True

    def __init__(
        self,
        num_heads: int,
        num_state_groups: int,
        convention: str = "conj",
        chunk_size=64,
        backend: str = "auto",
        precision: str = "auto",
        attention=whole_sequence,
    ):
        super().__init__()
        if convention not in READOUTS:
            raise ValueError(f"readout_convention: expected one of {READOUTS}, got {convention!r}")
        if num_state_groups < 1 or num_heads % num_state_groups:
            raise ValueError(
                f"num_state_groups: expected a divisor of num_heads={num_heads}, got "
                f"{num_state_groups!r}"
            )
        check_chunk_size(chunk_size)
        check_backend(backend)
        check_precision(precision)
        self.num_heads, self.num_state_groups = num_heads, num_state_groups
        self.convention, self.chunk_size, self.backend = convention, chunk_size, backend
        self.precision, self.attention = precision, attention

    @classmethod
    def from_args(cls, args: SSMArgs) -> QueryReadout:
        """Its convention, chunk size, backend, precision and op from ``args``."""
        return cls(
            args.num_heads,
            args.groups,
            args.readout_convention,
            args.chunk_size,
            args.backend,
            args.precision,
            cls.attention_for(args),
        )

    @staticmethod
    def attention_for(args: SSMArgs):
        """The chunked op a readout built from args runs: on this rank's slice of a sequence
        split over ``args.context_parallel``, or on the whole one."""
        cp = args.context_parallel
        return whole_sequence if cp is None else cp.op()

    def forward(self, q, a, b, core, state=None, reset=None, *, whole=False):
        """whole: the whole-sequence op even when built for a split sequence (calibration)."""
        lam_ri, beta_ri = core.discretized_real()
        G_hat = core.gram(self.convention)
        r = self.num_heads // self.num_state_groups
        attention = whole_sequence if whole else self.attention
        if r == 1:
            return attention(
                q,
                a,
                b,
                lam_ri,
                beta_ri,
                G_hat,
                state,
                chunk_size=self.chunk_size,
                reset=reset,
                backend=self.backend,
                precision=self.precision,
            )
        # grouped state: the r query heads of a group become r batch replicas sharing one state
        B, T, H, d_h = q.shape
        G = self.num_state_groups

        def replicate(x):  # (B, ...) -> (B·r, ...)
            return x.unsqueeze(1).expand(B, r, *x.shape[1:]).flatten(0, 1)

        q_r = q.unflatten(2, (G, r)).permute(0, 3, 1, 2, 4).flatten(0, 1)  # (B·r, T, G, d_h)
        o, final = attention(
            q_r,
            replicate(a),
            replicate(b),
            lam_ri,
            beta_ri,
            G_hat,
            None if state is None else replicate(state),
            chunk_size=self.chunk_size,
            reset=None if reset is None else replicate(reset),
            backend=self.backend,
            precision=self.precision,
        )
        o = o.unflatten(0, (B, r)).permute(0, 2, 3, 1, 4).flatten(2, 3)  # (B, T, H, d_h)
        return o, final[::r]

    def prepare_decoding(self, core) -> None:
        core.snapshot_decoding(self.convention)

    def step(self, q, a, b, core, state):
        lam_ri, beta_ri = core.decoding_real()
        G_hat = core.decoding_gram(self.convention)
        if self.num_state_groups == self.num_heads:  # one query per state: the fused kernel
            return interdomain_decode_step(
                q, a, b, lam_ri, beta_ri, G_hat, state, inplace=True, backend=self.backend
            )[0]
        grouped = q.unflatten(1, (self.num_state_groups, -1))  # (B, G, r, d_h)
        o, _ = interdomain_decode_step(
            grouped, a, b, lam_ri, beta_ri, G_hat, state, inplace=True, backend=self.backend
        )
        return o.flatten(1, 2)  # (B, H, d_h)


class LinearReadout(nn.Module):
    """The S4D-only readout: per channel y = Re(wᵀ C X) with one real w ∈ Rᴹ per head (the
    ``mode_weights``, init M^-1/2), on the key and the value half alike, the halves summed.
    No query; H·M parameters."""

    c_degree = 1
    needs_query = False

    def __init__(self, num_heads: int, num_modes: int):
        super().__init__()
        self.mode_weights = nn.Parameter(torch.full((num_heads, num_modes), num_modes**-0.5))

    @classmethod
    def from_args(cls, args: SSMArgs) -> ReadoutParts:
        """The readout and its d × d head mix (C_out); PyTorch only, one state per head."""
        if args.groups != args.num_heads:
            raise ValueError(
                "num_state_groups: the linear readout keeps one state per head, got "
                f"{args.num_state_groups!r}"
            )
        if args.backend != "auto":
            raise ValueError(
                f"backend: the linear readout runs on PyTorch only, got {args.backend!r}"
            )
        if args.precision != "auto":
            raise ValueError(
                f"precision: the linear readout has no matrix products, got {args.precision!r}"
            )
        if args.context_parallel is not None:
            raise ValueError(
                "context_parallel: the linear (S4D-only) readout has no context-parallel form; "
                "supported: interdomain and selective interdomain layers, softmax attention"
            )
        head_mix = nn.Linear(args.embed_dim, args.embed_dim, bias=False)
        return ReadoutParts(cls(args.num_heads, args.num_modes), head_mix)

    def contraction(self, C):
        """c = Cᵀ w: (H, M) complex, from C (H, M, M)."""
        return torch.einsum("hmn,hm->hn", C, self.mode_weights.float().to(C.dtype))

    def prepare_decoding(self, core) -> None:
        """Nothing to snapshot: the step reads λ, β and C directly."""

    def forward(self, q, a, b, core, state=None, reset=None):
        lam, beta, C = core.discretized()
        d_h = a.shape[-1]
        z = torch.cat([a, b], dim=-1)
        init = None if state is None else torch.cat(interleaved_to_state(state, d_h), dim=-1)
        y, X = s4d_linear_readout(z, lam, beta, self.contraction(C), init, True, reset)
        return y[..., :d_h] + y[..., d_h:], state_to_interleaved(X[..., :d_h], X[..., d_h:])

    def step(self, q, a, b, core, state):
        lam, beta, C = core.discretized()
        c = self.contraction(C)
        xk, xv = interleaved_to_state(state, a.shape[-1])  # complex views of the state
        ya, new_k = s4d_linear_step(a, lam, beta, c, xk)
        yb, new_v = s4d_linear_step(b, lam, beta, c, xv)
        xk.copy_(new_k)
        xv.copy_(new_v)
        return ya + yb
