"""Per-token (selective) decays against shared decays on CPU, side by side in one run.

    python benchmarks/bench_selective_cpu.py            # T = 4K, 8K, 16K
    python benchmarks/bench_selective_cpu.py --quick    # T = 1K, 2K

Rows: forward+backward of the core op (``interdomain_attention``, real form) with (H, M)
decays and with (B, T, H, M) decays, and the layers' decode step (``interdomain_decode_step``,
in place on the real state) with shared and per-row decays. Targets (issue: selective
decay): per-token fwd+bwd ≤ 1.5× shared at 4K–16K; selective decode step ≤ 1.2× shared.
Shapes: B=1, H=8, R=D=M=64, fp32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import blocked_medians, interleaved_medians, print_table  # noqa: E402

from idmix.functional import (  # noqa: E402
    discretize_real,
    interdomain_attention,
    interdomain_decode_step,
    log_uniform_dt,
    readout_gram_real,
    s4d_inv_init,
)

B, H, R, D, M = 1, 8, 64, 64, 64


def decays(lead: tuple[int, ...]):
    """(lam_ri, beta_ri): shared (H, M, 2) when lead is (), else (*lead, H, M, 2)."""
    g = torch.Generator().manual_seed(0)
    log_re, im = s4d_inv_init(H, M)
    dt = torch.exp(log_uniform_dt(H, generator=g))
    if lead:
        dt = dt * torch.exp(0.3 * torch.randn(*lead, H, generator=g))
    return discretize_real(dt, log_re, im)


def fwd_bwd(T: int, per_token: bool):
    lam, beta = decays((B, T) if per_token else ())
    G = readout_gram_real(*(torch.randn(2, H, M, M) / M).unbind(0))
    lam, beta = lam.requires_grad_(), beta.requires_grad_()
    q, k, v = (torch.randn(B, T, H, F, requires_grad=True) for F in (R, R, D))
    g = torch.randn(B, T, H, D)

    def run():
        o, _ = interdomain_attention(q, k, v, lam, beta, G, chunk_size=64, output_final_state=True)
        torch.autograd.grad(o, [q, k, v, lam, beta], g)

    return run


def decode_step(per_row: bool):
    lam, beta = decays((B,) if per_row else ())
    G = readout_gram_real(*(torch.randn(2, H, M, M) / M).unbind(0))
    q, k, v = (torch.randn(B, H, F) for F in (R, R, D))
    state = torch.zeros(B, H, R + D, 2 * M)
    return lambda: interdomain_decode_step(q, k, v, lam, beta, G, state, inplace=True)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    lengths = [1024, 2048] if args.quick else [4096, 8192, 16384]
    rows = []
    for T in lengths:
        t = interleaved_medians(
            {"shared": fwd_bwd(T, False), "per_token": fwd_bwd(T, True)}, reps=3 if T < 8192 else 1
        )
        ratio = t["per_token"] / t["shared"]
        rows.append([
            str(T), f"{t['shared'] * 1e3:.0f}", f"{t['per_token'] * 1e3:.0f}", f"{ratio:.2f}×",
            "✓" if ratio <= 1.5 else "✗",
        ])  # fmt: skip
    print_table(
        "Core op forward+backward, ms (B=1, H=8, R=D=M=64, fp32); target per-token ≤ 1.5× shared",
        ["T", "shared", "per-token", "per-token/shared", "target"],
        rows,
    )
    with torch.no_grad():
        t = blocked_medians({"shared": decode_step(False), "per_row": decode_step(True)}, 200)
    ratio = t["per_row"] / t["shared"]
    print_table(
        "Decode step, all heads, µs (eager); target selective ≤ 1.2× shared",
        ["shared", "selective (per-row decays)", "ratio", "target"],
        [
            [
                f"{t['shared'] * 1e6:.0f}",
                f"{t['per_row'] * 1e6:.0f}",
                f"{ratio:.2f}×",
                "✓" if ratio <= 1.2 else "✗",
            ]
        ],  # fmt: skip
    )


if __name__ == "__main__":
    main()
