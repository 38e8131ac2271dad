"""``idmix-lm-eval``: lm-eval's own command line with idmix's model registered, so that
``--model idmix --model_args checkpoint=runs/x/model_final.pt`` works from the shell (lm-eval
0.4.13 loads no out-of-tree models: no entry points, and ``--include_path`` is for tasks).
Every argument is lm-eval's (``idmix-lm-eval --help``). With the ``hf`` extra installed it also
imports ``idmix.hf`` (its Auto classes) before lm-eval loads anything, so ``--model hf
--model_args pretrained=<dir>`` loads an idmix directory with lm-eval's default
``trust_remote_code=False``: no code from the directory runs."""

from __future__ import annotations

import importlib.util


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_model  # noqa: F401  (registers "idmix")

    if importlib.util.find_spec("transformers") is not None:
        import idmix.hf  # noqa: F401  (registers the Auto classes)
    cli_evaluate()


if __name__ == "__main__":
    main()
