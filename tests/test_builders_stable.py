"""The composition redesign changed structure, not numbers: every named tiny builder (and each
Table 4 cell at the tiny scale) builds the parameters and logits recorded before it
(tests/data/builder_fingerprints.json, its names moved once to the current layout by
``idmix.io.upgrade``; files written before it: tests/test_old_checkpoints.py)."""

from __future__ import annotations

import json

import pytest

from tests import fingerprints as fp

RECORDED = json.loads(fp.FILE.read_text())


@pytest.mark.parametrize("name", fp.BUILDERS + fp.CELLS)
def test_same_seed_builds_the_same_parameters_and_logits(name):
    got, want = fp.fingerprint(fp.build(name)), RECORDED[name]
    recorded = want["params"]
    assert sorted(got["params"]) == sorted(recorded), "parameter names changed"
    for param, (shape, total, abs_total, samples) in recorded.items():
        g_shape, g_total, g_abs, g_samples = got["params"][param]
        assert g_shape == shape, param
        assert g_samples == pytest.approx(samples, rel=1e-6, abs=1e-7), param
        assert (g_total, g_abs) == pytest.approx((total, abs_total), rel=1e-6, abs=1e-6), param
    total, abs_total, samples = want["logits"]
    assert got["logits"][2] == pytest.approx(samples, rel=1e-5, abs=1e-5)
    assert got["logits"][:2] == pytest.approx([total, abs_total], rel=1e-5, abs=1e-3)
