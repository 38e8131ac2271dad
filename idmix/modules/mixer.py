"""The SSM token mixer, wired from injected parts (docs/design.md §6; contracts: parts.py).

    x -> query (optional) ────────────────────────────────────┐
    x -> key_branch -> key_norm  ─┐                           ├─> readout(q, a, b, core, state)
    x -> value_branch -> value_norm ┴─> [RoPE on q, a: "last"] ┘      -> [output_norm]
      -> [head_mix] -> [gate(x, ·)] -> output_proj

The mixer owns only the torchtune attention contract (``setup_cache``/``reset_cache``/
``forward(x, input_pos=…)``), the decoding cache and the init calibration; what the layer
computes is in its parts. ``idmix.modules.compose.ssm_mixer`` builds them from factories.
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional import rope
from .base import CachedMixer
from .cache import RecurrentCache
from .documents import check_layer_input, positions_and_resets
from .parts import Core, Gate, InputBranch, Readout
from .readouts import whole_sequence

CALIBRATIONS = ("per_head", "global", "none")
__all__ = ["CALIBRATIONS", "SSMMixer"]


class SSMMixer(CachedMixer):
    """A token mixer from parts; each attribute is the constructor argument of its name.

    query: InputBranch of H heads, or None (a readout without a query); key_branch,
    value_branch: InputBranches of G state heads, d_h = embed_dim / num_heads wide; key_norm,
    value_norm: per-head modules (``HeadNorm``); core: Core of G heads; readout: Readout;
    output_proj: d × d. Optional: rope_last_base (RoPE on q and the normalised key half after
    the feature map and the norm, so query-key scores depend on t - s only), output_norm
    (per-head module on o), head_mix (d × d on the flattened heads, the S4D-only C_out), gate
    (Gate). calibration: "global", "per_head" or "none" (see :meth:`calibrate_`).
    context_parallel: the ``ContextParallel`` the input is a slice of (None: whole sequences);
    the readout must have been built for it (its ``attention`` the split-sequence op).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        query: nn.Module | None,
        key_branch: nn.Module,
        value_branch: nn.Module,
        key_norm: nn.Module,
        value_norm: nn.Module,
        core: nn.Module,
        readout: nn.Module,
        output_proj: nn.Linear,
        rope_last_base: float | None = None,
        output_norm: nn.Module | None = None,
        head_mix: nn.Module | None = None,
        gate: nn.Module | None = None,
        calibration: str = "global",
        context_parallel=None,
    ):
        super().__init__()
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration: expected one of {CALIBRATIONS}, got {calibration!r}")
        for name, part, protocol in (
            ("query", query, InputBranch),
            ("key_branch", key_branch, InputBranch),
            ("value_branch", value_branch, InputBranch),
            ("core", core, Core),
            ("readout", readout, Readout),
            ("gate", gate, Gate),
        ):
            if part is not None and not isinstance(part, protocol):
                raise TypeError(
                    f"{name}: {type(part).__name__} does not follow the {protocol.__name__} "
                    "contract (idmix.modules.parts)"
                )
        if readout.needs_query != (query is not None):
            raise ValueError(
                f"query: {type(readout).__name__} {'needs' if readout.needs_query else 'takes no'}"
                " query branch"
            )
        G, d_h = core.num_heads, embed_dim // num_heads
        for name, branch in (("key_branch", key_branch), ("value_branch", value_branch)):
            if (branch.num_heads, branch.head_dim) != (G, d_h):
                raise ValueError(
                    f"{name}: expected {G} heads of {d_h} (the core's heads, embed_dim / "
                    f"num_heads), got {branch.num_heads} of {branch.head_dim}"
                )
        if query is not None and (query.num_heads, query.head_dim) != (num_heads, d_h):
            raise ValueError(
                f"query: expected {num_heads} heads of {d_h}, got {query.num_heads} of "
                f"{query.head_dim}"
            )
        if context_parallel is not None and getattr(readout, "attention", None) in (
            None,
            whole_sequence,
        ):
            raise ValueError(
                f"context_parallel: {type(readout).__name__} was not built for a split sequence "
                "(its from_args takes the op from QueryReadout.attention_for(args))"
            )
        self.context_parallel = context_parallel
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, d_h
        self.num_state_groups, self.num_modes = G, core.num_modes
        # registration order = state-dict and init order (kept from the first layer)
        self.query = query
        self.key_branch, self.value_branch = key_branch, value_branch
        self.key_norm, self.value_norm = key_norm, value_norm
        self.core = core
        self.readout = readout
        self.head_mix = head_mix
        self.output_norm = output_norm
        self.gate = gate
        self.output_proj = output_proj
        self.rope_last_base, self.calibration = rope_last_base, calibration

    # torchtune attention contract -------------------------------------------------------------
    def setup_cache(self, batch_size: int, dtype: torch.dtype, max_seq_len: int = 0) -> None:
        """Allocate the decoding state; its size does not depend on max_seq_len."""
        shapes = [
            (b.conv_size - 1, b.out_dim) if b is not None and b.conv_size else (0, 0)
            for b in (self.query, self.key_branch, self.value_branch)
        ]
        self.kv_cache = RecurrentCache.empty(
            batch_size,
            self.num_state_groups,
            self.num_modes + getattr(self.readout, "carried_modes", 0),  # a readout's carries
            self.head_dim,
            self.head_dim,
            shapes,
            dtype,
            device=self.output_proj.weight.device,
        )
        self.cache_enabled = True
        self.readout.prepare_decoding(self.core)

    def reset_cache(self) -> None:
        """Zero the decoding state and snapshot the decoding constants (λ, β, Ĝ) anew."""
        super().reset_cache()
        self.readout.prepare_decoding(self.core)

    def forward(self, x, y=None, *, mask=None, input_pos=None):
        """x: (B, T, d). mask is ignored (causality is in the recurrence); input_pos (B, T):
        positions restarting at 0 mark document starts, where state and conv history reset."""
        B, T = check_layer_input(x, self.embed_dim, input_pos)
        pos, reset = positions_and_resets(input_pos, B, T, x.device)
        cache = self.kv_cache if self.cache_enabled else None
        self.check_context_parallel(cache)
        if self.context_parallel is not None:
            pos = self.context_parallel.positions(input_pos, B, T, x.device)
        if cache is not None:
            cache.check_batch(B)
            if reset is not None:  # rows whose first position starts a document (branch-free)
                cache.reset_rows(reset[:, 0])
            if T == 1:
                return self._step(x[:, 0], pos[:, 0], cache)[:, None]
        convs = (None, None, None) if cache is None else (cache.conv_q, cache.conv_a, cache.conv_b)
        (q, a, b), (cq, ca, cb) = self._inputs(x, pos, reset, convs)
        init = None if cache is None else cache.state
        o, state = self.readout(q, a, b, self.core, init, reset)
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
    def _inputs(self, x, pos, reset, convs=(None, None, None), split=True):
        """The query and the two normalised SSM input halves, with their new conv caches.
        x: (B, T, d) -> ((q (B, T, H, d_h) or None, a, b (B, T, G, d_h)), (cq, ca, cb)).
        split: x is this rank's slice of a split sequence, if the mixer was built for one."""
        cp = self.context_parallel if split else None
        q, cq = (None, None) if self.query is None else self.query(x, pos, reset, convs[0], cp)
        a, ca = self.key_branch(x, pos, reset, convs[1], cp)
        b, cb = self.value_branch(x, pos, reset, convs[2], cp)
        q, a = self._rope_last(q, self.key_norm(a), pos)
        return (q, a, self.value_norm(b)), (cq, ca, cb)

    def _rope_last(self, q, a, pos):
        """RoPE on the feature-mapped query and the normalised key half (rope_last_base set).
        q, a: (B, T, ·, d_h); pos: (B, T)."""
        if self.rope_last_base is None:
            return q, a
        q = None if q is None else rope(q, pos, self.rope_last_base)
        return q, rope(a, pos, self.rope_last_base)

    def _output(self, x, o):
        if (
            self.output_norm is not None
        ):  # in fp32: it amplifies near-zero outputs (early positions)
            o = self.output_norm(o.float()).to(o.dtype)
        o = o.flatten(-2)  # (B, T, d)
        if self.head_mix is not None:
            o = self.head_mix(o)
        if self.gate is not None:
            o = self.gate(x, o)
        return self.output_proj(o)

    @torch.no_grad()
    def _step(self, x_t, pos, cache: RecurrentCache):
        """One decoding step on the cache (updated in place). x_t: (B, d) -> (B, d).
        Inference only: no graph is recorded."""
        q = None
        if self.query is not None:
            q, cq = self.query.step(x_t, pos, cache.conv_q)
            cache.conv_q.copy_(cq)
        a, ca = self.key_branch.step(x_t, pos, cache.conv_a)
        b, cb = self.value_branch.step(x_t, pos, cache.conv_b)
        for dst, src in ((cache.conv_a, ca), (cache.conv_b, cb)):
            if src is not None:
                dst.copy_(src)
        a, b = self.key_norm(a), self.value_norm(b)
        if self.rope_last_base is not None:  # one position: the sequence form at T = 1
            q, a = self._rope_last(None if q is None else q[:, None], a[:, None], pos[:, None])
            q, a = None if q is None else q[:, 0], a[:, 0]
        return self._output(x_t, self.readout.step(q, a, b, self.core, cache.state))

    @torch.no_grad()
    def calibrate_(self, seq_len: int = 256, seed: int = 0) -> torch.Tensor:
        """Rescale C so that the readout's output has unit RMS on unit-variance inputs (init):
        one scale for all heads (``calibration="global"``) or one per state head
        (``"per_head"``: heads with slow decays are not left near zero beside fast ones).

        Returns the scales applied, (G,). The output has degree ``readout.c_degree`` in C
        (2 for the query readout, where C enters through CᴴC; 1 for the linear readout).
        """
        G = self.num_state_groups
        if self.output_proj.weight.is_meta or self.calibration == "none":
            return torch.ones(G)
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(1, seq_len, self.embed_dim, generator=g).to(self.output_proj.weight)
        pos, reset = positions_and_resets(None, 1, seq_len, x.device)
        # the whole sequence on every rank, also when built for a split one: the ranks' C stay
        # equal, and equal to the one-process model's
        split = self.context_parallel is not None
        (q, a, b), _ = self._inputs(x, pos, reset, split=False)
        o = self.readout(q, a, b, self.core, None, **({"whole": True} if split else {}))[0]
        o = o.float()  # (1, T, H, d_h)
        ms = o.pow(2).mean(dim=(0, 1, 3)).view(G, -1).mean(-1)  # (G,): per state head
        if self.calibration == "global":
            ms = ms.mean().expand(G)
        scale = ms.clamp_min(1e-24).rsqrt() ** (1.0 / self.readout.c_degree)
        self.core.scale_readout_(scale)
        return scale.cpu()
