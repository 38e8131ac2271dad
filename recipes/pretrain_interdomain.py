"""Pretraining recipe for idmix models (Interdomain Attention and its baselines).

    tune run recipes/pretrain_interdomain.py --config recipes/configs/tiny_interdomain.yaml
    tune run --nproc_per_node 2 recipes/pretrain_interdomain.py --config … [key=value …]

The loop, checkpoints, logging and outputs are ``idmix.training.trainer`` (its docstring and
docs/training.md say what a run does); the config's keys and checks are
``idmix.training.pretrain_config``.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig
from torchtune import config

from idmix.training.trainer import train


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    sys.exit(recipe_main())
