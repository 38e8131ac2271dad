"""Inductor fuses the input path and the discretisation into few kernels (CPU C++ codegen,
counted in the generated source): a change that splits them shows up here."""

from __future__ import annotations

import torch

from compile_tests.golden import check, kernels
from idmix.modules import InterdomainAttention


def layer():
    return InterdomainAttention(128, 4, num_modes=16)


def test_input_path_is_one_kernel_after_the_projection():
    """W x (a GEMM), then conv + bias + RoPE + ξ (SiLU, L2) + head RMSNorm + bias: one kernel."""
    mixer = layer()

    def key_path(x, pos):
        h, _ = mixer.key_branch(x, pos, None)
        return mixer.key_norm(h)

    x, pos = torch.randn(2, 100, 128), torch.arange(100).expand(2, -1)
    with torch.no_grad():
        out, counts = kernels(torch.compile(key_path, fullgraph=True), x, pos)
        torch.testing.assert_close(out, key_path(x, pos), rtol=1e-5, atol=1e-5)
    assert counts == {"fused": 1, "extern": 1}, counts
    check("fusion/key_input_path", counts)


def test_discretisation_and_gram_are_few_kernels():
    """λ, β from (log Re A, Im A, log Δ) in one kernel; Ĝ = Ĉᵀ(±)Ĉ in one batched GEMM."""
    ssm = layer().core

    def parameters():
        return ssm.discretized_real(), ssm.gram("conj")

    with torch.no_grad():
        out, counts = kernels(torch.compile(parameters, fullgraph=True))
        ref = parameters()
    for a, b in zip(out[0] + (out[1],), ref[0] + (ref[1],), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert counts["fused"] <= 2 and counts["extern"] == 1, counts
    check("fusion/discretisation_and_gram", counts)
