"""The SSM token mixer, wired from injected parts (docs/design.md §5).

    x -> query branch (optional) ─────────────────────────────┐
    x -> key branch -> key norm  ─┐                           ├─> readout(q, a, b, core, state)
    x -> value branch -> value norm ┴─> [RoPE on q, a: "last"] ┘      -> [output norm]
      -> [head mix] -> [gate(x, ·)] -> output projection

The mixer owns only the torchtune attention contract (``setup_cache``/``reset_cache``/
``forward(x, input_pos=…)``), the decoding cache and the init calibration; what the layer
computes is in its parts. ``idmix.modules.compose.ssm_mixer`` builds the paper's layers from
them; ``examples/`` builds new ones.
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional import rope
from .base import CachedMixer
from .branches import Branch, HeadNorm
from .cache import RecurrentCache
from .documents import check_layer_input, positions_and_resets
from .ssm import S4DCore

CALIBRATIONS = ("per_head", "global", "none")
# state-dict keys renamed by the composition redesign (old exports load through this map)
RENAMED_KEYS = {"mode_weights": "readout.mode_weights"}


class SigmoidGate(nn.Linear):
    """o ← σ(W_g x) ⊙ o (d × d, no bias): the ``gate=True`` option."""

    def __init__(self, embed_dim: int):
        super().__init__(embed_dim, embed_dim, bias=False)

    def forward(self, x, o):
        """x, o: (..., d) -> (..., d)."""
        return torch.sigmoid(super().forward(x)) * o


class SSMMixer(CachedMixer):
    """A token mixer from parts.

    query: Branch (B, T, H, d_h) or None (a readout without a query); key_branch, value_branch:
    Branches of G state heads; key_norm, value_norm: HeadNorms; core: S4DCore of G heads;
    readout: ``QueryReadout``/``LinearReadout`` or any module with their ``forward``/``step``/
    ``c_degree``/``needs_query``; output_proj: d × d. Optional: rope_last_base (RoPE on q and
    the normalised key half after the feature map and the norm, so query-key scores depend on
    t - s only), output_norm (per-head module on o), head_mix (d × d on the flattened heads,
    the S4D-only C_out), gate (module (x, o) -> o). calibration: "global", "per_head" or "none"
    (see :meth:`calibrate_`).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        query: Branch | None,
        key_branch: Branch,
        value_branch: Branch,
        key_norm: HeadNorm,
        value_norm: HeadNorm,
        core: S4DCore,
        readout: nn.Module,
        output_proj: nn.Linear,
        rope_last_base: float | None = None,
        output_norm: nn.Module | None = None,
        head_mix: nn.Module | None = None,
        gate: nn.Module | None = None,
        calibration: str = "global",
    ):
        super().__init__()
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration: expected one of {CALIBRATIONS}, got {calibration!r}")
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
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, d_h
        self.num_state_groups, self.num_modes = G, core.num_modes
        # registration order = state-dict and init order (kept from the pre-redesign layer)
        self.query = query
        self.branch_a, self.branch_b = key_branch, value_branch
        self.norm_a, self.norm_b = key_norm, value_norm
        self.ssm = core
        self.readout = readout
        self.c_out = head_mix
        self.out_norm = output_norm
        self.gate = gate
        self.output_proj = output_proj
        self.rope_last_base, self.calibration = rope_last_base, calibration
        self.register_load_state_dict_pre_hook(_rename_old_keys)

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
        self._snapshot_decoding()

    def reset_cache(self) -> None:
        """Zero the decoding state and snapshot the decoding constants (λ, β, Ĝ) anew."""
        super().reset_cache()
        self._snapshot_decoding()

    def _snapshot_decoding(self) -> None:
        """What a compiled or exported decode step reads instead of recomputing it per token
        (``S4DCore.snapshot_decoding``), for readouts that read Ĝ (the S4D-only one does not);
        skipped on the meta device (no values yet)."""
        convention = getattr(self.readout, "convention", None)
        if convention is not None and not self.ssm.C_re.is_meta:
            self.ssm.snapshot_decoding(convention)

    def forward(self, x, y=None, *, mask=None, input_pos=None):
        """x: (B, T, d). mask is ignored (causality is in the recurrence); input_pos (B, T):
        positions restarting at 0 mark document starts, where state and conv history reset."""
        B, T = check_layer_input(x, self.embed_dim, input_pos)
        pos, reset = positions_and_resets(input_pos, B, T, x.device)
        cache = self.kv_cache if self.cache_enabled else None
        if cache is not None:
            cache.check_batch(B)
            if reset is not None:  # rows whose first position starts a document (branch-free)
                cache.reset_rows(reset[:, 0])
            if T == 1:
                return self._step(x[:, 0], pos[:, 0], cache)[:, None]
        convs = (None, None, None) if cache is None else (cache.conv_q, cache.conv_a, cache.conv_b)
        (q, a, b), (cq, ca, cb) = self._inputs(x, pos, reset, convs)
        init = None if cache is None else cache.state
        o, state = self.readout(q, a, b, self.ssm, init, reset)
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
        """RoPE on the feature-mapped query and the normalised key half (rope_last_base set).
        q, a: (B, T, ·, d_h); pos: (B, T)."""
        if self.rope_last_base is None:
            return q, a
        q = None if q is None else rope(q, pos, self.rope_last_base)
        return q, rope(a, pos, self.rope_last_base)

    def _output(self, x, o):
        if self.out_norm is not None:  # in fp32: it amplifies near-zero outputs (early positions)
            o = self.out_norm(o.float()).to(o.dtype)
        o = o.flatten(-2)  # (B, T, d)
        if self.c_out is not None:
            o = self.c_out(o)
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
        a, ca = self.branch_a.step(x_t, pos, cache.conv_a)
        b, cb = self.branch_b.step(x_t, pos, cache.conv_b)
        for dst, src in ((cache.conv_a, ca), (cache.conv_b, cb)):
            if src is not None:
                dst.copy_(src)
        a, b = self.norm_a(a), self.norm_b(b)
        if self.rope_last_base is not None:  # one position: the sequence form at T = 1
            q, a = self._rope_last(None if q is None else q[:, None], a[:, None], pos[:, None])
            q, a = None if q is None else q[:, 0], a[:, 0]
        return self._output(x_t, self.readout.step(q, a, b, self.ssm, cache.state))

    @torch.no_grad()
    def calibrate_(self, seq_len: int = 256, seed: int = 0) -> torch.Tensor:
        """Rescale C so that the readout's output has unit RMS on unit-variance inputs (init):
        one scale for all heads (``calibration="global"``) or one per state head
        (``"per_head"``: heads with slow decays are not left near zero beside fast ones).

        Returns the scales applied, (G,). The output has degree ``readout.c_degree`` in C
        (2 for the query readout, where C enters through CᴴC; 1 for the linear readout).
        """
        G = self.num_state_groups
        if self.ssm.C_re.is_meta or self.calibration == "none":
            return torch.ones(G)
        g = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(1, seq_len, self.embed_dim, generator=g).to(self.output_proj.weight)
        pos, reset = positions_and_resets(None, 1, seq_len, x.device)
        (q, a, b), _ = self._inputs(x, pos, reset)
        o = self.readout(q, a, b, self.ssm, None)[0].float()  # (1, T, H, d_h)
        ms = o.pow(2).mean(dim=(0, 1, 3)).view(G, -1).mean(-1)  # (G,): per state head
        if self.calibration == "global":
            ms = ms.mean().expand(G)
        scale = ms.clamp_min(1e-24).rsqrt() ** (1.0 / self.readout.c_degree)
        self.ssm.C_re.mul_(scale.to(self.ssm.C_re)[:, None, None])
        self.ssm.C_im.mul_(scale.to(self.ssm.C_im)[:, None, None])
        return scale.cpu()


def upgrade_state_dict(state_dict: dict) -> dict:
    """A state dict saved before the composition redesign, with ``RENAMED_KEYS`` moved to their
    new names (any prefix; in place, and returned). Newer state dicts pass unchanged."""
    for key in list(state_dict):
        for old, new in RENAMED_KEYS.items():
            head = key[: -len(old)]
            if key.endswith(old) and not key.endswith(new) and (not head or head.endswith(".")):
                if head + new not in state_dict:
                    state_dict[head + new] = state_dict.pop(key)
    return state_dict


def _rename_old_keys(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: old keys of this mixer (under prefix) to their new names."""
    for old, new in RENAMED_KEYS.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
