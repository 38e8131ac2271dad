"""State-dict keys of earlier layouts, upgraded on load.

Two renames: the S4D-only ``mode_weights`` moved into its readout (the composition redesign),
and the mixer's attributes took their constructor's names (the parts redesign: ``branch_a`` ->
``key_branch``, ``ssm`` -> ``core``, …). ``RENAMED_KEYS`` lists every parameter of the
library's parts by its old and new suffix (the DCP resume in ``idmix.io.checkpoint``
maps names with it); ``rename_old_keys`` (a load_state_dict pre-hook of ``SSMMixer``) also moves
the parameters of a user's parts (a feature map inside a branch)."""

from __future__ import annotations

RENAMED_MODULES = {
    "branch_a": "key_branch",
    "branch_b": "value_branch",
    "norm_a": "key_norm",
    "norm_b": "value_norm",
    "ssm": "core",
    "c_out": "head_mix",
    "out_norm": "output_norm",
}
_LEAVES = {  # the parameters each renamed module of the library holds
    "branch_a": ("proj.weight", "conv_weight", "conv_bias"),
    "norm_a": ("norm.weight", "bias"),
    "ssm": ("log_A_real", "A_imag", "log_dt", "C_re", "C_im"),
    "c_out": ("weight",),
    "out_norm": ("weight",),
}
_LEAVES["branch_b"], _LEAVES["norm_b"] = _LEAVES["branch_a"], _LEAVES["norm_a"]
# old suffix -> new suffix
RENAMED_KEYS = {
    "mode_weights": "readout.mode_weights",
    **{
        f"{old}.{leaf}": f"{new}.{leaf}"
        for old, new in RENAMED_MODULES.items()
        for leaf in _LEAVES[old]
    },
}


def upgrade_state_dict(state_dict: dict, expected=None) -> dict:
    """A state dict saved by an earlier layout, with ``RENAMED_KEYS`` moved to their new names
    (any prefix; in place, and returned). Newer state dicts pass unchanged. expected: the keys of
    the model it is for, if known: then only a key the model lacks moves, and only to a key it
    has (a module of another kind may use an old name, e.g. ``out_norm``, as its own)."""
    for key in list(state_dict):
        if expected is not None and key in expected:
            continue
        for old, new in RENAMED_KEYS.items():
            head = key[: -len(old)]
            if key.endswith(old) and not key.endswith(new) and (not head or head.endswith(".")):
                if expected is not None and head + new not in expected:
                    continue
                if head + new not in state_dict:
                    state_dict[head + new] = state_dict.pop(key)
    return state_dict


def rename_old_keys(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook of a mixer: its old keys (under prefix) to their new names."""
    if prefix + "mode_weights" in state_dict and prefix + "readout.mode_weights" not in state_dict:
        state_dict[prefix + "readout.mode_weights"] = state_dict.pop(prefix + "mode_weights")
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name, _, rest = key[len(prefix) :].partition(".")
        if name in RENAMED_MODULES and rest:
            new = f"{prefix}{RENAMED_MODULES[name]}.{rest}"
            if new not in state_dict:
                state_dict[new] = state_dict.pop(key)
