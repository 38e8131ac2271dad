"""Per-head complex diagonal S4D core: parameters, discretisation and the readout Gram."""

from __future__ import annotations

import torch
from torch import nn

from ..functional import (
    READOUTS,
    complex_A,
    discretize,
    discretize_real,
    log_uniform_dt,
    readout_gram_real,
    s4d_inv_init,
    s4d_lin_init,
)

A_INITS = {
    "s4d_inv": s4d_inv_init,
    "s4d_inv_conj": lambda H, M: s4d_inv_init(H, M, state_size=2 * M),
    "s4d_lin": s4d_lin_init,
}


class S4DCore(nn.Module):
    """Parameters of H heads × M complex modes, one step size per head.

    log_A_real, A_imag: (H, M) with A = -exp(log_A_real) + i·A_imag (S4D-Inv init);
    log_dt: (H,), Δ log-uniform in [dt_min, dt_max]; C_re, C_im: (H, M, M), the full complex
    readout (complex normal, std ``c_scale`` per real component). B = 1 (redundant next to C).
    Parameter count: H(2M² + 2M + 1). All in the SSM optimiser group (paper §5: capped lr, no
    weight decay), declared by ``param_group``.
    """

    param_group = "ssm"

    def __init__(
        self,
        num_heads: int,
        num_modes: int,
        dt_min=1e-3,
        dt_max=1e-1,
        c_scale=None,
        a_init="s4d_inv",
    ):
        super().__init__()
        if a_init not in A_INITS:
            raise ValueError(f"a_init: expected one of {sorted(A_INITS)}, got {a_init!r}")
        self.a_init = a_init
        self.num_heads, self.num_modes = num_heads, num_modes
        self.dt_min, self.dt_max = dt_min, dt_max
        self.c_scale = c_scale if c_scale is not None else num_modes**-0.5
        self.log_A_real = nn.Parameter(torch.empty(num_heads, num_modes))
        self.A_imag = nn.Parameter(torch.empty(num_heads, num_modes))
        self.log_dt = nn.Parameter(torch.empty(num_heads))
        self.C_re = nn.Parameter(torch.empty(num_heads, num_modes, num_modes))
        self.C_im = nn.Parameter(torch.empty(num_heads, num_modes, num_modes))
        self._memo = {}
        # λ, β and Ĝ as of the last snapshot_decoding (non-persistent: not in the state dict)
        for name in ("lam_ri", "beta_ri", *(f"gram_{r}" for r in READOUTS)):
            self.register_buffer(f"decoding_{name}", None, persistent=False)
        self.reset_parameters()

    @classmethod
    def from_args(cls, args) -> S4DCore:
        """G = ``args.groups`` heads of ``args.num_modes`` modes (``ssm_mixer``'s default core)."""
        return cls(args.groups, args.num_modes, args.dt_min, args.dt_max, a_init=args.a_init)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.C_re.is_meta:
            return
        log_re, im = A_INITS[self.a_init](self.num_heads, self.num_modes)
        self.log_A_real.copy_(log_re)
        self.A_imag.copy_(im)
        self.log_dt.copy_(log_uniform_dt(self.num_heads, self.dt_min, self.dt_max))
        nn.init.normal_(self.C_re, std=self.c_scale)
        nn.init.normal_(self.C_im, std=self.c_scale)

    def _memoised(self, name: str, compute):
        """compute() under fp32 (autocast off), memoised per name while no gradient is recorded
        and the weights are unchanged (a decode loop computes it once, not once per token);
        never memoised while compiling or exporting."""
        memo = not (
            torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or torch.compiler.is_exporting()  # traced weights have no data pointer
        )
        key = tuple((p.data_ptr(), p._version) for p in self.parameters()) if memo else None
        if memo and name in self._memo and self._memo[name][0] == key:
            return self._memo[name][1]
        with torch.autocast(self.C_re.device.type, enabled=False):
            out = compute()
        if memo:
            self._memo[name] = (key, out)
        return out

    def discretized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(lam, beta, C), complex64 (H, M) / (H, M, M), fp32 whatever the autocast."""

        def compute():
            A = complex_A(self.log_A_real.float(), self.A_imag.float())
            lam, beta = discretize(torch.exp(self.log_dt.float()), A)
            return lam, beta, torch.complex(self.C_re.float(), self.C_im.float())

        return self._memoised("complex", compute)

    def discretized_real(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lam_ri, beta_ri): (H, M, 2) fp32 real pairs, no complex tensor (compiles whole)."""
        return self._memoised("real", self._compute_real)

    def gram(self, readout: str) -> torch.Tensor:
        """Ĝ (H, 2M, 2M) fp32 real, interleaved (``readout_gram``), from C in real GEMMs."""
        return self._memoised(f"gram_{readout}", lambda: self._compute_gram(readout))

    def _compute_real(self):
        return discretize_real(
            torch.exp(self.log_dt.float()), self.log_A_real.float(), self.A_imag.float()
        )

    def _compute_gram(self, readout: str):
        return readout_gram_real(self.C_re.float(), self.C_im.float(), readout)

    @torch.no_grad()
    def scale_readout_(self, scale: torch.Tensor) -> None:
        """C ← scale[h] · C per head (the mixer's init calibration). scale: (H,)."""
        self.C_re.mul_(scale.to(self.C_re)[:, None, None])
        self.C_im.mul_(scale.to(self.C_im)[:, None, None])

    # decoding constants ------------------------------------------------------------------------
    @torch.no_grad()
    def snapshot_decoding(self, readout: str) -> None:
        """Compute λ, β and readout's Ĝ from the current weights and keep them as the
        ``decoding_*`` buffers that compiled and exported decode steps read: traced, the memo of
        :meth:`_memoised` is off, and Ĝ would be recomputed every token (an (H, 2M, 2M) GEMM of
        C, M³ per head: more than the step itself). The mixer calls this from setup_cache and
        reset_cache, so after changing the weights, reset the caches before compiled or
        exported decoding (``generate`` sets them up on every call). Later snapshots write into
        the same tensors, so a compiled step sees the same inputs and does not recompile.
        Skipped on the meta device (no values yet)."""
        if self.C_re.is_meta:
            return
        with torch.autocast(self.C_re.device.type, enabled=False):
            lam_ri, beta_ri = self._compute_real()
            fresh = {
                "lam_ri": lam_ri,
                "beta_ri": beta_ri,
                f"gram_{readout}": self._compute_gram(readout),
            }
        for name, value in fresh.items():
            current = getattr(self, f"decoding_{name}")
            if current is not None and (current.shape, current.dtype) == (value.shape, value.dtype):
                current.copy_(value)  # (a model cast to bf16 after setup gets fp32 ones anew)
            else:
                setattr(self, f"decoding_{name}", value)

    def decoding_real(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lam_ri, beta_ri) for a decode step: the snapshot when traced (compile, export) and
        one was taken, else :meth:`discretized_real` (eager: memoised against the weights)."""
        if self.decoding_lam_ri is not None and _traced():
            return self.decoding_lam_ri, self.decoding_beta_ri
        return self.discretized_real()

    def decoding_gram(self, readout: str) -> torch.Tensor:
        """Ĝ for a decode step, chosen as in :meth:`decoding_real`."""
        snapshot = getattr(self, f"decoding_gram_{readout}", None)
        if snapshot is not None and _traced():
            return snapshot
        return self.gram(readout)


def _traced() -> bool:
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()
