"""Quantise a checkpoint's linear layers with torchao, export prefill and decode with
torch.export, save, reload and measure.

    tune run recipes/quantize_interdomain.py --config recipes/configs/quantize_tiny.yaml

For fp32 and each mode (torchao int8_weight_only, int8_dynamic, int8_dynamic_int4; PT2E
x86_int8_dynamic, x86_int8_static, ``idmix.evaluation.pt2e``):
- weight bytes: the whole model's and, for torchao modes, the linear layers' (int4 target:
  ≥ 3.5× smaller than fp32);
- validation perplexity and its change against fp32;
- greedy decode tokens/s (prompt included; the median of TIMING_ROUNDS runs) of the eager model
  (``idmix.generate``; for PT2E the converted programs), of the reloaded torch.export programs,
  (aoti=true) of their AOTInductor-compiled packages (freezing on) and (executorch=true; fp32
  and int8_dynamic_int4) of the decode step lowered to ExecuTorch/XNNPACK
  (``idmix.evaluation.edge``);
- whether each reproduces the eager model: greedy tokens exactly, or teacher-forced top-1
  agreement ≥ 99% and max |Δlogit| ≤ 1e-2 of the logit range;
- the AOTInductor decode speed-up over fp32, marked against the target (≥ 1× at d ≤ 256, ≥ 2×
  wider).
Each quantised model is also saved as {mode}_model.pt (weights_only-loadable, torchao tensor
types allowlisted: ``idmix.evaluation.deploy.load_quantized_model``) and reloaded to check its
logits. Writes {model}_{prefill,decode}.pt2, {model}_{prefill,decode}.aoti.pt2,
{model}_decode.pte, {mode}_model.pt and quantize_report.{md,json} to output_dir.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig
from torchtune import config

from idmix.evaluation.quantize_measure import KEYS, check_config, measure_all, result_names
from idmix.evaluation.quantize_report import report
from idmix.io.files import atomic_write_json, atomic_write_text
from idmix.training.outputs import fresh_outputs

__all__ = ["KEYS", "main"]


@config.parse
def main(cfg: DictConfig) -> None:
    check_config(cfg)
    out = fresh_outputs(cfg.output_dir, [*result_names(cfg), "quantize_report.md"], cfg.overwrite)
    rows, width = measure_all(cfg)
    table = report(cfg, rows, width)
    atomic_write_text(out / "quantize_report.md", table)
    atomic_write_json(out / "quantize_report.json", rows)
    print(table)
    print(f"results: {out / 'quantize_report.md'} and the .pt2 programs in {out}")


if __name__ == "__main__":
    sys.exit(main())
