"""torch.export traces through the chunked custom ops; the exported program matches eager on
new inputs of the traced shape."""

from __future__ import annotations

import torch

from idmix.functional import interdomain_attention
from tests.helpers import assert_rel, make_problem


class Core(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        for name in ("lam", "beta", "C"):
            self.register_buffer(name, p[name])

    def forward(self, q, k, v):
        o, (xk, xv) = interdomain_attention(
            q, k, v, self.lam, self.beta, self.C, chunk_size=8, output_final_state=True
        )
        return o, torch.view_as_real(xv)


def test_export_chunked_op():
    p = make_problem(B=2, T=43, H=2, R=4, D=3, M=3, dtype=torch.float32, with_state=False)
    model = Core(p)
    program = torch.export.export(model, (p["q"], p["k"], p["v"]))
    q2, k2 = torch.randn_like(p["q"]), torch.randn_like(p["k"])
    for got, ref in zip(program.module()(q2, k2, p["v"]), model(q2, k2, p["v"]), strict=True):
        assert_rel(got, ref, 1e-6, "exported")
