"""Which builders a saved model config may name: idmix's own, the dotted names in
$IDMIX_TRUSTED_BUILDERS, and, while a run writes files from the model it has just built, that
run's own. A file's config is data, so it may not choose arbitrary code to run."""

from __future__ import annotations

import os
from contextlib import contextmanager

# Builders a model_final.pt may name: idmix's own, and the dotted names in this variable (your
# own builders, comma-separated). A file's config is data, so it may not choose arbitrary code.
TRUSTED_BUILDERS_ENV = "IDMIX_TRUSTED_BUILDERS"
_TRUSTED_BY_THIS_RUN: set[str] = set()  # while trusting_own_builders runs


@contextmanager
def trusting_own_builders(model_config: dict):
    """Within: the builders a run's own model config names count as trusted, for what the run
    writes from the model it has just built with them (its hf/ directory). Files read later
    still need them in $IDMIX_TRUSTED_BUILDERS."""
    names = set(_components(model_config)) - _TRUSTED_BY_THIS_RUN
    _TRUSTED_BY_THIS_RUN.update(names)
    try:
        yield
    finally:
        _TRUSTED_BY_THIS_RUN.difference_update(names)


def _components(node):
    """Every ``_component_`` value in a (nested) config, and a ``mixer`` given as a dotted
    builder name."""
    if isinstance(node, dict):
        if isinstance(node.get("_component_"), str):
            yield node["_component_"]
        if isinstance(node.get("mixer"), str) and "." in node["mixer"]:
            yield node["mixer"]
        for value in node.values():
            yield from _components(value)
    elif isinstance(node, list):
        for value in node:
            yield from _components(value)


def trusted_builders() -> set[str]:
    """idmix.models' builders, $IDMIX_TRUSTED_BUILDERS and the running run's own."""
    import idmix.models

    names = {f"idmix.models.{n}" for n in idmix.models.__all__}
    names -= {
        "idmix.models.MODEL_BUILDERS",
        "idmix.models.init_weights_",
        "idmix.models.CPU_SCALES",
        "idmix.models.CPU_SSM_DEFAULTS",
    }
    extra = os.environ.get(TRUSTED_BUILDERS_ENV, "")
    return names | _TRUSTED_BY_THIS_RUN | {n.strip() for n in extra.split(",") if n.strip()}
