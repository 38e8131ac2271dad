"""Triton kernels for idmix, launched only from inside its torch custom ops
(``idmix::chunked_*``, ``idmix::selective_*``, and ``idmix::decode_step_``, registered here).

Installed as ``idmix_kernels``; ``idmix.functional`` imports it only when a Triton backend is
used. Importing it needs triton. On CPU the kernels run only under the Triton interpreter:
set ``TRITON_INTERPRET=1`` before this package is imported.
"""

from .chunk_input_grads import input_grads
from .chunk_intra import intra_chunk_pass1, intra_chunk_pass2
from .chunk_intra_bwd import intra_chunk_pass1_backward, intra_chunk_pass2_backward
from .chunk_output import chunk_output, fits_fused_output
from .chunk_states import Containment, chunk_states, chunk_states_backward
from .decay_tables import decay_tables, decay_tables_backward
from .decode_step import decode_step_triton
from .nonfinite import nonfinite_flags
from .selective_intra import (
    selective_pair_grads,
    selective_pair_sums,
    selective_pass1,
    selective_pass2,
)
from .tiles import block, operand_dtype

__all__ = [
    "Containment",
    "block",
    "chunk_output",
    "chunk_states",
    "chunk_states_backward",
    "decay_tables",
    "decay_tables_backward",
    "decode_step_triton",
    "fits_fused_output",
    "input_grads",
    "intra_chunk_pass1",
    "intra_chunk_pass1_backward",
    "intra_chunk_pass2",
    "intra_chunk_pass2_backward",
    "nonfinite_flags",
    "operand_dtype",
    "selective_pair_grads",
    "selective_pair_sums",
    "selective_pass1",
    "selective_pass2",
]
