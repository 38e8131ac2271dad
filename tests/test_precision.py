"""The `precision=` choice: its rounding rules, where it applies, and the error of each choice
against the fp64 reference on the PyTorch path (the CPU emulation of what the GPU computes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from idmix.functional import interdomain_attention
from idmix.functional.interdomain.numerics import (
    GPU_DEFAULT,
    PRECISIONS,
    baddbmm,
    matmul,
    round_tf32,
    rounded,
)
from idmix.functional.interdomain.validation import resolve_precision
from idmix.modules import InterdomainAttention
from tests.helpers import make_problem, rel_rmse


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest_ties_away():
    x = torch.tensor([1.0, 1 + 2**-11, 1 + 2**-10, 1 + 3 * 2**-11, -(1 + 2**-11), 1 + 2**-12])
    # ties (1 + 2^-11, 1 + 3·2^-11) round away from zero; below half an ulp rounds down
    expected = torch.tensor([1.0, 1 + 2**-10, 1 + 2**-10, 1 + 2**-9, -(1 + 2**-10), 1.0])
    assert torch.equal(round_tf32(x), expected)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(10_000, generator=g) * 10 ** torch.randint(-20, 20, (10_000,), generator=g)
    r = round_tf32(y)
    assert torch.equal(round_tf32(r), r), "idempotent"
    assert ((r - y).abs() <= y.abs() * 2**-11 * (1 + 1e-6)).all(), "within half an ulp of 10 bits"
    assert ((r.view(torch.int32) & 0x1FFF) == 0).all(), "the low 13 bits are zero"
    assert torch.isinf(round_tf32(torch.tensor([float("inf")]))).all()


def test_bf16_rounding_is_torchs():
    x = torch.randn(1000, dtype=torch.float32)
    assert torch.equal(rounded(x, "bf16"), x.bfloat16().float())
    assert rounded(x, "ieee") is x


def test_matmul_at_ieee_is_the_plain_product_and_rounds_only_operands():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, 5, 7, generator=g), torch.randn(7, 4, generator=g)
    assert torch.equal(matmul(a, b, "ieee"), a @ b)
    assert torch.equal(matmul(a, b, "bf16"), a.bfloat16().float() @ b.bfloat16().float())
    assert torch.equal(matmul(a, b, "tf32"), round_tf32(a) @ round_tf32(b))
    acc = torch.randn(3, 5, 4, generator=g)
    b3 = b.expand(3, 7, 4)
    assert torch.equal(baddbmm(acc, a, b3, "ieee"), torch.baddbmm(acc, a, b3))
    assert torch.equal(
        baddbmm(acc, a, b3, "bf16"), torch.baddbmm(acc, rounded(a, "bf16"), rounded(b3, "bf16"))
    )


def test_auto_resolves_per_device_and_dtype():
    cpu = SimpleNamespace(dtype=torch.float32, is_cuda=False)
    cuda = SimpleNamespace(dtype=torch.float32, is_cuda=True)
    cuda64 = SimpleNamespace(dtype=torch.float64, is_cuda=True)
    assert resolve_precision("auto", cpu) == "ieee"
    assert resolve_precision("auto", cuda) == GPU_DEFAULT
    assert resolve_precision("auto", cuda64) == "ieee"
    for p in ("ieee", "tf32", "bf16"):
        assert resolve_precision(p, cpu) == p
    assert set(PRECISIONS) == {"auto", "ieee", "tf32", "bf16"}


def test_bad_precision_is_refused_by_name():
    p = make_problem(T=9, dtype=torch.float32)
    args = [p[n] for n in ("q", "k", "v", "lam", "beta", "C")]
    with pytest.raises(ValueError, match="precision: expected one of"):
        interdomain_attention(*args, precision="fp8")[0]
    with pytest.raises(ValueError, match="precision: 'bf16' applies to impl='chunked' only"):
        interdomain_attention(*args, precision="bf16", impl="naive")[0]
    p64 = make_problem(T=9, dtype=torch.float64)
    with pytest.raises(ValueError, match="precision: 'tf32' rounds fp32 products"):
        interdomain_attention(
            *(p64[n] for n in ("q", "k", "v", "lam", "beta", "C")), precision="tf32"
        )[0]
    with pytest.raises(ValueError, match="precision: expected one of"):
        InterdomainAttention(32, 2, precision="half")


def _run(p, precision, dtype=torch.float32):
    leaves = [p[n].to(dtype).requires_grad_() for n in ("q", "k", "v")]
    o = interdomain_attention(
        *leaves,
        p["lam"],
        p["beta"],
        p["C"],
        initial_state=p["initial_state"],
        precision=precision,
        chunk_size=16,
    )[0]
    g = torch.Generator().manual_seed(2)
    w = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
    return [o.detach(), *torch.autograd.grad((o * w).sum(), leaves)]


def test_each_precision_errs_as_measured_against_fp64():
    """The PyTorch path at each precision against the fp64 op, at a small paper-like head
    (R = D = M = 32, T = 300). Bounds are 3x the measured errors (max over o, dq, dk, dv:
    ieee 8.3e-7, tf32 5.4e-4, bf16 4.3e-3), and the ordering is the rounding's."""
    p64 = make_problem(B=1, T=300, H=2, R=32, D=32, M=32, dtype=torch.float64)
    ref = _run(p64, "ieee", torch.float64)

    def single(x):
        return x.to(torch.complex64 if x.is_complex() else torch.float32)

    p32 = {
        k: (tuple(map(single, v)) if isinstance(v, tuple) else single(v)) for k, v in p64.items()
    }
    errs = {}
    for precision in ("ieee", "tf32", "bf16"):
        got = _run(p32, precision)
        errs[precision] = max(rel_rmse(a, b) for a, b in zip(got, ref, strict=True))
    assert errs["ieee"] < 2.5e-6
    assert errs["tf32"] < 1.6e-3
    assert errs["bf16"] < 1.3e-2
    assert errs["ieee"] < errs["tf32"] < errs["bf16"]


def test_the_layer_passes_its_precision_to_the_op(monkeypatch):
    seen = []
    import idmix.modules.readouts as readouts

    real = readouts.whole_sequence

    def spy(*args, **kwargs):
        seen.append(kwargs.get("precision"))
        return real(*args, **kwargs)

    monkeypatch.setattr(readouts, "whole_sequence", spy)  # the op the readout calls
    layer = InterdomainAttention(32, 2, num_modes=8, precision="bf16")
    layer(torch.randn(1, 20, 32))
    assert seen == ["bf16"]
    exact = InterdomainAttention(32, 2, num_modes=8)
    exact.load_state_dict(layer.state_dict())
    x = torch.randn(1, 20, 32)
    gap = rel_rmse(layer(x), exact(x))
    assert 1e-5 < gap < 2e-2, f"bf16 products change the output by {gap:.1e}"


def test_real_entry_point_takes_precision():
    p = make_problem(T=17, dtype=torch.float32)
    from idmix.functional import readout_gram_real

    lam, beta = (torch.view_as_real(p[n]) for n in ("lam", "beta"))
    G = readout_gram_real(p["C"].real, p["C"].imag)
    o1, _ = interdomain_attention(
        p["q"], p["k"], p["v"], lam, beta, G, precision="ieee", output_final_state=True
    )
    o2, _ = interdomain_attention(p["q"], p["k"], p["v"], lam, beta, G, output_final_state=True)
    assert torch.equal(o1, o2), "on CPU 'auto' is 'ieee'"
    o3, _ = interdomain_attention(
        p["q"], p["k"], p["v"], lam, beta, G, precision="bf16", output_final_state=True
    )
    assert not torch.equal(o1, o3)
