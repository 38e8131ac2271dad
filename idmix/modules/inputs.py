"""The paper's two input paths, as factories ``(SSMArgs, query) -> InputParts`` for
``ssm_mixer`` (query: build the query branch q = φ(SC(W_Q x)), for a readout that reads one).

- ``dual_kv_inputs`` (Interdomain): halves [φ(SC(W_K x)), W_V x];
- ``generic_inputs`` (S4D-only, Table 4's single-input cells): [SC(W_a x), SC(W_b x)].

Both halves go through N+b (``HeadNorm``). RoPE (``use_rope``) acts on q and the key half, at
``rope_position``: "before_feature_map" (Fig. 3: SC -> RoPE -> φ; an absolute code, since SiLU
does not commute with the rotation) or "last" (after φ and N+b: every query-key score depends
on t - s only). φ is ``feature_map``; ``value_conv`` adds a short conv on W_V x.
"""

from __future__ import annotations

from .branches import Branch, HeadNorm
from .parts import InputParts, SSMArgs

ROPE_POSITIONS = ("before_feature_map", "last")


def _parts(args: SSMArgs, *, dual_kv: bool, query: bool) -> InputParts:
    if args.rope_position not in ROPE_POSITIONS:
        raise ValueError(
            f"rope_position: expected one of {ROPE_POSITIONS}, got {args.rope_position!r}"
        )
    d, H, G, d_h = args.embed_dim, args.num_heads, args.groups, args.head_dim
    in_branch = args.use_rope and args.rope_position == "before_feature_map"
    rope = dict(use_rope=in_branch, rope_base=args.rope_base)
    fmap = args.feature_map
    return InputParts(
        query=Branch(d, H, feature_map=fmap, **rope) if query else None,
        key_branch=Branch(d, G, head_dim=d_h, feature_map=fmap if dual_kv else None, **rope),
        value_branch=Branch(
            d, G, head_dim=d_h, conv=not dual_kv or args.value_conv, rope_base=args.rope_base
        ),
        key_norm=HeadNorm(G, d_h, args.norm_eps),
        value_norm=HeadNorm(G, d_h, args.norm_eps),
        rope_last_base=args.rope_base if args.use_rope and args.rope_position == "last" else None,
    )


def dual_kv_inputs(args: SSMArgs, query: bool) -> InputParts:
    """Interdomain Attention's input path."""
    return _parts(args, dual_kv=True, query=query)


def generic_inputs(args: SSMArgs, query: bool) -> InputParts:
    """The generic [SC(W_a x), SC(W_b x)] halves."""
    return _parts(args, dual_kv=False, query=query)
