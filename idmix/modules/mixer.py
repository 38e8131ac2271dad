"""One composable SSM token mixer: input path × readout × RoPE (the paper's Fig. 3 and Table 4).

- input_path "dual_kv": [ξ(SC(W_K x)), W_V x] (Interdomain);  "generic": [SC(W_a x), SC(W_b x)].
- readout "query": o_t = Re(Γᴴ U ξ(q_t)) (or Re(Γᵀ U ξ(q_t))), q = SC(W_Q x) (Interdomain);
  "linear": y = Re(wᵀ C X) per channel over modes, halves summed, then a d×d C_out (S4D-only).
- use_rope: RoPE on the query branch and on the first input half (k or a).
Both halves then go through "N+b" (HeadNorm) and one per-head complex S4D core (S4DCore).
The layer follows torchtune's attention contract, so it drops into TransformerSelfAttentionLayer.

Choices the paper leaves open or that docs/science.md studied (defaults: the paper's reading):
- rope_position: "before_feature_map" (Fig. 3: SC -> RoPE -> ξ; an absolute code, since SiLU
  does not commute with the rotation) or "last" (after ξ and N+b on the key half, after ξ on
  the query: every query-key score depends on t - s only);
- dt_min, dt_max: the log-uniform Δ range; the slowest mode's time constant is
  1/(|Re A|·dt_min) tokens and should fit inside the training context;
- a_init: "s4d_inv" (the paper's formula, n = 0..M-1), "s4d_inv_conj" (S4D's N = 2M),
  "s4d_lin";
- calibration: C rescaled at init so the core output has unit RMS, "global", "per_head" or
  "none";
- output_norm: RMSNorm over each head's output before W_O (not in the paper);
- value_conv: a short conv on the value branch too (not in the paper).
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional import interdomain_attention_real, interdomain_decode_step_real, rope
from ..functional.interdomain.realform import interleaved_to_state, state_to_interleaved
from ..functional.interdomain.validation import check_chunk_size
from ..functional.readout import READOUTS as READOUT_CONVENTIONS
from ..functional.s4d_readout import s4d_linear_readout, s4d_linear_step
from .base import CachedMixer
from .branches import Branch, HeadNorm
from .cache import RecurrentCache
from .documents import check_layer_input, positions_and_resets
from .ssm import S4DCore

INPUT_PATHS = ("dual_kv", "generic")
READOUTS = ("query", "linear")
ROPE_POSITIONS = ("before_feature_map", "last")
CALIBRATIONS = ("per_head", "global", "none")


class SSMMixer(CachedMixer):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_modes: int = 64,
        input_path: str = "dual_kv",
        readout: str = "query",
        use_rope: bool = True,
        readout_convention: str = "conj",
        gate: bool = False,
        chunk_size: int = 64,
        rope_base: float = 10000.0,
        norm_eps: float = 1e-6,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        num_state_groups: int | None = None,
        rope_position: str = "before_feature_map",
        a_init: str = "s4d_inv",
        calibration: str = "global",
        output_norm: bool = False,
        value_conv: bool = False,
    ):
        super().__init__()
        for name, n in (
            ("embed_dim", embed_dim),
            ("num_heads", num_heads),
            ("num_modes", num_modes),
        ):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name}: expected a positive int, got {n!r}")
        check_chunk_size(chunk_size)
        if readout_convention not in READOUT_CONVENTIONS:
            raise ValueError(
                f"readout_convention: expected one of {READOUT_CONVENTIONS}, "
                f"got {readout_convention!r}"
            )
        if not 0 < dt_min <= dt_max:
            raise ValueError(
                f"dt_min, dt_max: expected 0 < dt_min <= dt_max, got {dt_min}, {dt_max}"
            )
        G = num_state_groups or num_heads
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim: {embed_dim} is not divisible by num_heads={num_heads}")
        if input_path not in INPUT_PATHS:
            raise ValueError(f"input_path: expected one of {INPUT_PATHS}, got {input_path!r}")
        if readout not in READOUTS:
            raise ValueError(f"readout: expected one of {READOUTS}, got {readout!r}")
        if num_heads % G or (G != num_heads and readout != "query"):
            raise ValueError(
                f"num_state_groups: expected a divisor of num_heads={num_heads} (query readout "
                f"only), got {num_state_groups!r} with readout={readout!r}"
            )
        H, d_h = num_heads, embed_dim // num_heads
        self.embed_dim, self.num_heads, self.head_dim, self.num_modes = embed_dim, H, d_h, num_modes
        self.num_state_groups = G
        self.input_path, self.readout, self.readout_convention = (
            input_path,
            readout,
            readout_convention,
        )
        self.chunk_size = chunk_size
        if rope_position not in ROPE_POSITIONS:
            raise ValueError(
                f"rope_position: expected one of {ROPE_POSITIONS}, got {rope_position!r}"
            )
        self.rope_last, self.rope_base = use_rope and rope_position == "last", rope_base
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration: expected one of {CALIBRATIONS}, got {calibration!r}")
        self.calibration = calibration
        rope_in_branch = use_rope and rope_position == "before_feature_map"
        kw = dict(rope_base=rope_base)
        self.query = (
            Branch(embed_dim, H, conv=True, use_rope=rope_in_branch, feature_map=True, **kw)
            if readout == "query"
            else None
        )
        dual = input_path == "dual_kv"
        # With grouped state (G < H), the two input halves and the SSM have G heads and every
        # query head reads the (U, Γ) of its group, like GQA: the state shrinks H/G times.
        self.branch_a = Branch(
            embed_dim, G, head_dim=d_h, conv=True, use_rope=rope_in_branch, feature_map=dual, **kw
        )
        self.branch_b = Branch(embed_dim, G, head_dim=d_h, conv=not dual or value_conv, **kw)
        self.norm_a, self.norm_b = HeadNorm(G, d_h, norm_eps), HeadNorm(G, d_h, norm_eps)
        self.ssm = S4DCore(G, num_modes, dt_min, dt_max, a_init=a_init)
        if readout == "linear":
            self.mode_weights = nn.Parameter(torch.full((H, num_modes), num_modes**-0.5))
            self.c_out = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out_norm = nn.RMSNorm(d_h, eps=norm_eps) if output_norm else None
        self.gate = nn.Linear(embed_dim, embed_dim, bias=False) if gate else None
        self.output_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    # torchtune attention contract -------------------------------------------------------------
    def setup_cache(self, batch_size: int, dtype: torch.dtype, max_seq_len: int = 0) -> None:
        """Allocate the decoding state; its size does not depend on max_seq_len."""
        shapes = [
            (b.conv_size - 1, b.out_dim) if b is not None and b.conv_size else (0, 0)
            for b in (self.query, self.branch_a, self.branch_b)
        ]
        self.kv_cache = RecurrentCache.empty(
            batch_size,
            self.num_state_groups,
            self.num_modes,
            self.head_dim,
            self.head_dim,
            shapes,
            dtype,
            device=self.output_proj.weight.device,
        )
        self.cache_enabled = True

    def forward(self, x, y=None, *, mask=None, input_pos=None):
        """x: (B, T, d). mask is ignored (causality is in the recurrence); input_pos (B, T):
        positions restarting at 0 mark document starts, where state and conv history reset."""
        B, T = check_layer_input(x, self.embed_dim, input_pos)
        pos, reset = positions_and_resets(input_pos, B, T, x.device)
        cache = self.kv_cache if self.cache_enabled else None
        if cache is not None:
            if reset is not None:  # rows whose first position starts a document (branch-free)
                cache.reset_rows(reset[:, 0])
            if T == 1:
                return self._step(x[:, 0], pos[:, 0], cache)[:, None]
        convs = (None, None, None) if cache is None else (cache.conv_q, cache.conv_a, cache.conv_b)
        (q, a, b), (cq, ca, cb) = self._inputs(x, pos, reset, convs)
        init = None if cache is None else cache.state
        o, state = self._core(q, a, b, init, reset)
        if cache is not None:
            self._store(cache, state, cq, ca, cb)
        return self._output(x, o)

    @staticmethod
    @torch.no_grad()
    def _store(cache: RecurrentCache, state, cq, ca, cb) -> None:
        """Write the new state into the cache (inference state: never part of a graph)."""
        cache.state.copy_(state)
        for dst, src in zip((cache.conv_q, cache.conv_a, cache.conv_b), (cq, ca, cb), strict=True):
            if src is not None:
                dst.copy_(src)

    # internals ---------------------------------------------------------------------------------
    def _inputs(self, x, pos, reset, convs=(None, None, None)):
        """The query and the two normalised SSM input halves, with their new conv caches.
        x: (B, T, d) -> ((q (B, T, H, d_h) or None, a, b (B, T, G, d_h)), (cq, ca, cb))."""
        q, cq = (None, None) if self.query is None else self.query(x, pos, reset, convs[0])
        a, ca = self.branch_a(x, pos, reset, convs[1])
        b, cb = self.branch_b(x, pos, reset, convs[2])
        q, a = self._rope_last(q, self.norm_a(a), pos)
        return (q, a, self.norm_b(b)), (cq, ca, cb)

    def _rope_last(self, q, a, pos):
        """With rope_position="last", RoPE on ξ(q) and on the normalised key half, so that
        R_s k̃ · R_t ξ(q) depends on t - s only. q, a: (B, T, ·, d_h); pos: (B, T)."""
        if not self.rope_last:
            return q, a
        q = None if q is None else rope(q, pos, self.rope_base)
        return q, rope(a, pos, self.rope_base)

    def _core(self, q, a, b, init, reset=None):
        """q: (B, T, H, d_h); a, b: (B, T, G, d_h); init: (B, G, 2d_h, 2M) real state or None;
        reset: (B, T) bool document starts or None. Returns (o: (B, T, H, d_h), final state)."""
        if self.readout == "query":
            lam_ri, beta_ri = self.ssm.discretized_real()
            G_hat = self.ssm.gram(self.readout_convention)
            if self.num_state_groups != self.num_heads:
                return self._grouped_core(q, a, b, lam_ri, beta_ri, G_hat, init, reset)
            return interdomain_attention_real(
                q, a, b, lam_ri, beta_ri, G_hat, init, chunk_size=self.chunk_size, reset=reset
            )
        lam, beta, C = self.ssm.discretized()
        d_h = self.head_dim
        z = torch.cat([a, b], dim=-1)
        init_z = None if init is None else torch.cat(interleaved_to_state(init, d_h), dim=-1)
        y, X = s4d_linear_readout(z, lam, beta, self._contraction(C), init_z, True, reset)
        return y[..., :d_h] + y[..., d_h:], state_to_interleaved(X[..., :d_h], X[..., d_h:])

    def _grouped_core(self, q, a, b, lam_ri, beta_ri, G_hat, init, reset=None):
        """Grouped state: the r = H/G query heads of a group become r batch replicas that share
        one state (replicas of a, b and the initial state; one state is kept)."""
        B, T, H, d_h = q.shape
        G, r = self.num_state_groups, H // self.num_state_groups

        def replicate(x):  # (B, ...) -> (B·r, ...)
            return x.unsqueeze(1).expand(B, r, *x.shape[1:]).flatten(0, 1)

        q_r = q.unflatten(2, (G, r)).permute(0, 3, 1, 2, 4).flatten(0, 1)  # (B·r, T, G, d_h)
        o, state = interdomain_attention_real(
            q_r,
            replicate(a),
            replicate(b),
            lam_ri,
            beta_ri,
            G_hat,
            None if init is None else replicate(init),
            chunk_size=self.chunk_size,
            reset=None if reset is None else replicate(reset),
        )
        o = o.unflatten(0, (B, r)).permute(0, 2, 3, 1, 4).flatten(2, 3)  # (B, T, H, d_h)
        return o, state[::r]

    def _contraction(self, C):
        """c = Cᵀ w: the per-head mode contraction of the linear readout, (H, M) complex."""
        return torch.einsum("hmn,hm->hn", C, self.mode_weights.float().to(C.dtype))

    def _output(self, x, o):
        if self.out_norm is not None:  # in fp32: it amplifies near-zero outputs (early positions)
            o = self.out_norm(o.float()).to(o.dtype)
        o = o.flatten(-2)  # (B, T, d)
        if self.readout == "linear":
            o = self.c_out(o)
        if self.gate is not None:
            o = torch.sigmoid(self.gate(x)) * o
        return self.output_proj(o)

    @torch.no_grad()
    def _step(self, x_t, pos, cache: RecurrentCache):
        """One decoding step on the cache (updated in place). x_t: (B, d) -> (B, d).
        Inference only: no graph is recorded."""
        q = None
        if self.query is not None:
            q, cq = self.query.step(x_t, pos, cache.conv_q)
            cache.conv_q.copy_(cq)
        a, ca = self.branch_a.step(x_t, pos, cache.conv_a)
        b, cb = self.branch_b.step(x_t, pos, cache.conv_b)
        for dst, src in ((cache.conv_a, ca), (cache.conv_b, cb)):
            if src is not None:
                dst.copy_(src)
        a, b = self.norm_a(a), self.norm_b(b)
        if self.rope_last:  # one position: the sequence form at T = 1
            q, a = self._rope_last(None if q is None else q[:, None], a[:, None], pos[:, None])
            q, a = None if q is None else q[:, 0], a[:, 0]
        if self.readout == "query":
            lam_ri, beta_ri = self.ssm.discretized_real()
            o = interdomain_decode_step_real(
                q.unflatten(1, (self.num_state_groups, -1)),
                a,
                b,
                lam_ri,
                beta_ri,
                self.ssm.gram(self.readout_convention),
                cache.state,
            )
            o = o.flatten(1, 2)  # (B, H, d_h)
        else:
            lam, beta, C = self.ssm.discretized()
            c = self._contraction(C)
            xk, xv = cache.complex_state(self.head_dim)  # views of cache.state
            ya, new_k = s4d_linear_step(a, lam, beta, c, xk)
            yb, new_v = s4d_linear_step(b, lam, beta, c, xv)
            xk.copy_(new_k)
            xv.copy_(new_v)
            o = ya + yb
        return self._output(x_t, o)

    @torch.no_grad()
    def calibrate_(self, seq_len: int = 256, seed: int = 0) -> torch.Tensor:
        """Rescale C so that the core's output has unit RMS on unit-variance inputs (init):
        one scale for all heads (``calibration="global"``) or one per state head
        (``"per_head"``: heads with slow decays are not left near zero beside fast ones).

        Returns the scales applied, (G,). The output is quadratic in C for the query readout
        (C enters through CᴴC) and linear for the linear readout.
        """
        G = self.num_state_groups
        if self.ssm.C_re.is_meta or self.calibration == "none":
            return torch.ones(G)
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(1, seq_len, self.embed_dim, generator=g).to(self.output_proj.weight)
        pos, reset = positions_and_resets(None, 1, seq_len, x.device)
        (q, a, b), _ = self._inputs(x, pos, reset)
        o = self._core(q, a, b, None)[0].float()  # (1, T, H, d_h)
        ms = o.pow(2).mean(dim=(0, 1, 3)).view(G, -1).mean(-1)  # (G,): per state head
        if self.calibration == "global":
            ms = ms.mean().expand(G)
        scale = ms.clamp_min(1e-24).rsqrt() ** (0.5 if self.readout == "query" else 1.0)
        self.ssm.C_re.mul_(scale.to(self.ssm.C_re)[:, None, None])
        self.ssm.C_im.mul_(scale.to(self.ssm.C_im)[:, None, None])
        return scale.cpu()
