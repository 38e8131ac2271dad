"""The error of each `precision=` choice against the fp64 reference, at the paper's head shape
(R = D = M = 64, chunk 64) and T = 4K and 64K: outputs, final states and every gradient.

    python benchmarks/precision_error.py                 # T = 4096 and 65536 (~10 minutes)
    python benchmarks/precision_error.py --lengths 4096 --plot docs/precision_error.png
    TRITON_INTERPRET=1 python benchmarks/precision_error.py --backend triton --lengths 512 \
        --heads 1 --shared-only --runs bf16 "bf16 inputs, bf16"   # the kernels (interpreted)

The inputs are a real layer's: an InterdomainAttention mixer at its init (S4D-Inv decays with
Δ log-uniform in [1e-3, 1e-1], C calibrated to unit output RMS) maps unit-normal token
embeddings to (ξ(q), k̃, ṽ), λ, β and Ĝ; the initial state is random. Those fixed inputs run
the chunked op in fp64 (the reference: itself equal to the per-step recurrence to ~1e-14,
tests/test_reference_ladder.py) and in fp32 at each precision, the TF32/bf16 rounding of every
product's operands emulated on CPU exactly as the Triton kernels round them
(idmix/functional/interdomain/numerics.py). "bf16 inputs" rounds q, k, v to bf16 first: what a
bf16 model hands the op. The loss is a fixed random projection of the output plus one of the
final state, so every gradient is exercised. `--backend triton` runs the same on the Triton
kernels (on CPU under the interpreter: minutes at T = 512), which store the chunk-start states
in bf16 at precision "bf16" where the PyTorch path keeps them in fp32.

Printed per tensor: relative RMSE ||x − x₆₄|| / ||x₆₄||. The shared-decay path and the selective
(per-token decay) path are both measured. The rule that picks precision="auto" on a GPU
(docs/precision.md): per input dtype, the fastest precision whose error on every tensor stays
within 2x of what rounding the inputs to that dtype costs alone (fp32 inputs: within the error
of bf16 inputs, the precision a user chose fp32 over).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import print_table  # noqa: E402

from idmix.functional import discretize_real, interdomain_attention  # noqa: E402
from idmix.modules import InterdomainAttention  # noqa: E402
from idmix.modules.documents import positions_and_resets  # noqa: E402

NAMES = ("o", "state", "dq", "dk", "dv", "dλ", "dβ", "dĜ", "dZ0")
# (name, input rounding, precision): fp32 inputs at each precision, then bf16 and fp16 inputs
# (what a bf16 or fp16 model hands the op) with exact products and at the candidate precisions
RUNS = (
    ("ieee", None, "ieee"),
    ("tf32", None, "tf32"),
    ("bf16", None, "bf16"),
    ("bf16 inputs, ieee", torch.bfloat16, "ieee"),
    ("bf16 inputs, bf16", torch.bfloat16, "bf16"),
    ("fp16 inputs, ieee", torch.float16, "ieee"),
    ("fp16 inputs, tf32", torch.float16, "tf32"),
    ("fp16 inputs, bf16", torch.float16, "bf16"),
)


def layer_inputs(T: int, H: int, selective: bool, seed: int = 0):
    """(q, k, v, lam_ri, beta_ri, G_hat, Z0) in fp64, from a fresh mixer at the paper's head
    shape on unit-normal embeddings; per-token decays (Δ_t around the layer's Δ) if selective."""
    torch.manual_seed(seed)
    mixer = InterdomainAttention(64 * H, H).double()
    x = torch.randn(1, T, 64 * H, dtype=torch.float64)
    pos, reset = positions_and_resets(None, 1, T, x.device)
    with torch.no_grad():
        (q, a, b), _ = mixer._inputs(x, pos, reset)
        lam, beta = mixer.core.discretized_real()
        G = mixer.core.gram("conj")
        if selective:  # Δ_t = Δ · e^{±1}: each token's decay from its own step size
            core = mixer.core
            wobble = torch.exp(torch.rand(1, T, H, dtype=torch.float64) * 2 - 1)
            lam, beta = discretize_real(
                torch.exp(core.log_dt) * wobble, core.log_A_real, core.A_imag
            )
    g = torch.Generator().manual_seed(seed + 1)
    Z0 = 0.1 * torch.randn(1, H, 128, 128, generator=g, dtype=torch.float64)
    return [t.detach().contiguous() for t in (q, a, b, lam, beta, G, Z0)]


def run(inputs, dtype, precision, round_inputs=None, backend="torch"):
    """Output, final state and every gradient of the op at (dtype, precision) on backend, q, k,
    v first rounded to round_inputs (a dtype) if given."""
    leaves = []
    for i, t in enumerate(inputs):
        t = t.to(dtype)
        if round_inputs is not None and i < 3:
            t = t.to(round_inputs).to(dtype)
        leaves.append(t.requires_grad_())
    q, k, v, lam, beta, G, Z0 = leaves
    o, Z = interdomain_attention(
        q, k, v, lam, beta, G, initial_state=Z0, precision=precision, output_final_state=True,
        backend=backend,
    )  # fmt: skip
    g = torch.Generator().manual_seed(7)
    w_o = torch.randn(o.shape, generator=g, dtype=torch.float64).to(dtype)
    w_z = torch.randn(Z.shape, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad((o * w_o).sum() + (Z * w_z).sum(), leaves)
    return [x.detach().double() for x in (o, Z, *grads)]


def rel(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def measure(T: int, H: int, selective: bool, backend="torch", runs=None) -> dict[str, list[float]]:
    """Each run's relative RMSE per tensor (NAMES) against the fp64 PyTorch path; runs: names
    from RUNS (all if None)."""
    inputs = layer_inputs(T, H, selective)
    ref = run(inputs, torch.float64, "ieee")
    out = {}
    for name, inputs_dtype, precision in RUNS:
        if runs is not None and name not in runs:
            continue
        got = run(inputs, torch.float32, precision, inputs_dtype, backend)
        out[name] = [rel(a, b) for a, b in zip(got, ref, strict=True)]
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    for ax, (title, res) in zip(axes.flat, results.items(), strict=False):
        width = 0.8 / len(res)
        for i, (name, errs) in enumerate(res.items()):
            ax.bar([j + i * width for j in range(len(NAMES))], errs, width, label=name)
        ax.set_yscale("log")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(NAMES))], NAMES)
        ax.set_title(title)
        ax.set_ylabel("relative RMSE vs fp64")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--backend", choices=("torch", "triton"), default="torch")
    ap.add_argument("--runs", nargs="+", choices=[r[0] for r in RUNS], help="default: all")
    ap.add_argument("--shared-only", action="store_true", help="skip the per-token decays")
    args = ap.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    results = {}
    for selective in (False,) if args.shared_only else (False, True):
        for T in args.lengths:
            t0 = time.perf_counter()
            res = measure(T, args.heads, selective, args.backend, args.runs)
            path = "selective" if selective else "shared"
            title = f"{path} decays, T={T}, H={args.heads}, R=D=M=64, {args.backend}"
            results[title] = res
            rows = [[name] + [f"{e:.1e}" for e in errs] for name, errs in res.items()]
            print_table(f"{title} ({time.perf_counter() - t0:.0f} s)", ["run", *NAMES], rows)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
