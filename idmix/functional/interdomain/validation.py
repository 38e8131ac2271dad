"""Argument checks shared by every implementation of the interdomain op."""

from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import torch
import torch.autograd.forward_ad as fwAD

from ...debug import check_values, functorch_transforms
from ..readout import READOUTS
from .numerics import GPU_DEFAULT, PRECISIONS

State = tuple[torch.Tensor, torch.Tensor]
# Every op: "auto" picks triton for CUDA fp32 tensors; "inductor" is "torch" with the chunked
# op's segment math (shared decays) compiled by torch.compile on first use per shape.
BACKENDS = ("auto", "torch", "triton", "inductor")


def check_real_float(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a real floating tensor, got {x.dtype}")


def check_complex(name: str, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_complex():
        raise TypeError(f"{name}: expected a complex tensor, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {what} = {shape}, got {tuple(x.shape)}")


def check_devices(anchor_name: str, anchor: torch.Tensor, **tensors) -> None:
    """Every tensor given (None skipped; tuples checked element-wise) lives on anchor's device."""
    for name, x in tensors.items():
        parts = x if isinstance(x, (tuple, list)) else (x,)
        for i, part in enumerate(parts):
            if isinstance(part, torch.Tensor) and part.device != anchor.device:
                where = f"{name}[{i}]" if isinstance(x, (tuple, list)) else name
                raise ValueError(
                    f"{where}: expected a tensor on {anchor.device} (the device of "
                    f"{anchor_name}), got one on {part.device}"
                )


def check_params(lam, beta, C, H: int, readout: str, BT: tuple[int, int] | None = None) -> int:
    """Check lam, beta: (H, M) complex, or per token (B, T, H, M) when BT = (B, T) is given,
    and C: (H, M, M) complex. Returns M."""
    dims = (2, 4) if BT is not None else (2,)
    if not isinstance(lam, torch.Tensor) or lam.dim() not in dims:
        expected = "(H, M) or per token (B, T, H, M)" if BT is not None else "(H, M)"
        raise ValueError(f"lam: expected shape {expected}, got {getattr(lam, 'shape', lam)}")
    M = lam.shape[-1]
    if M < 1:
        raise ValueError(f"lam: expected at least one mode (M >= 1), got shape {tuple(lam.shape)}")
    shape, text = ((H, M), "(H, M)") if lam.dim() == 2 else ((*BT, H, M), "(B, T, H, M)")
    check_complex("lam", lam, shape, text)
    check_complex("beta", beta, shape, text)
    check_complex("C", C, (H, M, M), "(H, M, M)")
    if readout not in READOUTS:
        raise ValueError(f"readout: expected one of {READOUTS}, got {readout!r}")
    return M


def check_state(state, B: int, H: int, M: int, R: int, D: int, name: str) -> None:
    """state = (Xk: (B, H, M, R) complex, Xv: (B, H, M, D) complex)."""
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"{name}: expected a tuple (Xk, Xv), got {type(state).__name__}")
    check_complex(f"{name}[0] (Xk)", state[0], (B, H, M, R), "(B, H, M, R)")
    check_complex(f"{name}[1] (Xv)", state[1], (B, H, M, D), "(B, H, M, D)")


def check_real_state(state, name: str, shape: tuple[int, ...] | None = None) -> None:
    """An interleaved real state (rows R+D, columns 2M): a real floating tensor, of shape
    ``shape`` when given. A complex one would lose its imaginary part to the op's cast."""
    if not isinstance(state, torch.Tensor) or not state.is_floating_point():
        kind = state.dtype if isinstance(state, torch.Tensor) else type(state).__name__
        raise TypeError(
            f"{name}: expected the interleaved real state, a real floating tensor (a complex "
            f"(Xk, Xv) state goes through state_to_interleaved first), got {kind}"
        )
    if shape is not None and tuple(state.shape) != shape:
        raise ValueError(f"{name}: expected (B, H, R+D, 2M) = {shape}, got {tuple(state.shape)}")


def check_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """q, k: (B, T, H, R), v: (B, T, H, D), one real dtype, T >= 1. Returns (B, T, H, R, D)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_real_float(name, x)
        if x.dim() != 4:
            raise ValueError(
                f"{name}: expected 4 dims (B, T, H, {'D' if name == 'v' else 'R'}), "
                f"got shape {tuple(x.shape)}"
            )
    B, T, H, R = q.shape
    if k.shape != q.shape:
        raise ValueError(
            f"k: expected the shape of q (B, T, H, R) = {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if v.shape[:3] != (B, T, H):
        raise ValueError(
            f"v: expected (B, T, H, D) with (B, T, H) = {(B, T, H)}, got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if T < 1:
        raise ValueError("q: expected at least one time step (T >= 1), got T = 0")
    if 0 in (B, H, R, v.shape[3]):
        raise ValueError(
            f"q, v: expected non-zero B, H, R and D, got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    check_devices("q", q, k=k, v=v)
    return B, T, H, R, v.shape[3]


def check_chunk_size(chunk_size) -> None:
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, int)
        or chunk_size < 1
        or chunk_size & (chunk_size - 1)
    ):
        raise ValueError(f"chunk_size: expected a positive power of two, got {chunk_size!r}")


def check_backend(backend, x: torch.Tensor | None = None) -> None:
    """backend in BACKENDS; "triton" on a CPU tensor needs the Triton interpreter."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if (
        backend == "triton"
        and x is not None
        and x.device.type == "cpu"
        and os.environ.get("TRITON_INTERPRET") != "1"
    ):
        raise ValueError(
            "backend: 'triton' on CPU tensors needs the Triton interpreter (Triton has no CPU "
            "driver): set TRITON_INTERPRET=1 before idmix is imported, or use 'auto' or 'torch'"
        )


def check_precision(precision) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")


def resolve_precision(precision: str, x: torch.Tensor) -> str:
    """The concrete precision ("ieee", "tf32" or "bf16") for inputs like x."""
    check_precision(precision)
    if x.dtype == torch.float64:
        if precision not in ("auto", "ieee"):
            raise ValueError(
                f"precision: {precision!r} rounds fp32 products; fp64 inputs compute in fp64 "
                "(use 'auto' or 'ieee')"
            )
        return "ieee"
    if precision == "auto":
        return GPU_DEFAULT if x.is_cuda else "ieee"
    return precision


def check_reset(reset, B: int, T: int) -> None:
    if reset is not None and not isinstance(reset, torch.Tensor):
        raise TypeError(
            f"reset: expected a bool tensor of shape (B, T) = {(B, T)} or None, got "
            f"{type(reset).__name__}"
        )
    if reset is not None and (reset.dtype != torch.bool or tuple(reset.shape) != (B, T)):
        raise ValueError(
            f"reset: expected a bool tensor of shape (B, T) = {(B, T)}, "
            f"got {reset.dtype} {tuple(reset.shape)}"
        )


def check_real_params(
    lam_ri, beta_ri, G_hat, H: int, lead: tuple[int, ...] | None = None,
    names: tuple[str, str, str] = ("lam_ri", "beta_ri", "G_hat"),
) -> int:  # fmt: skip
    """lam_ri, beta_ri: (H, M, 2) real, or (*lead, H, M, 2) when lead is given (per token
    (B, T) or per row (B,)); G_hat: (H, 2M, 2M) real; names: the caller's names for the three.
    Returns M."""
    n_lam, n_beta, n_G = names
    for name, x in zip(names, (lam_ri, beta_ri, G_hat), strict=True):
        check_real_float(name, x)
    shared = lam_ri.dim() == 3
    ok = lam_ri.shape[-3:-2] == (H,) and lam_ri.shape[-1] == 2
    if not shared:
        ok = ok and lead is not None and tuple(lam_ri.shape[:-3]) == tuple(lead)
    if not ok:
        expected = "(H, M, 2)" + ("" if lead is None else f" or {(*lead, 'H', 'M', 2)}")
        raise ValueError(f"{n_lam}: expected {expected} with H = {H}, got {tuple(lam_ri.shape)}")
    M = lam_ri.shape[-2]
    if beta_ri.shape != lam_ri.shape:
        raise ValueError(f"{n_beta}: expected {tuple(lam_ri.shape)}, got {tuple(beta_ri.shape)}")
    if M < 1:
        raise ValueError(f"{n_lam}: expected at least one mode (M >= 1), got {tuple(lam_ri.shape)}")
    if tuple(G_hat.shape) != (H, 2 * M, 2 * M):
        raise ValueError(
            f"{n_G}: expected (H, 2M, 2M) = {(H, 2 * M, 2 * M)}, got {tuple(G_hat.shape)}"
        )
    return M


# The dtypes a decode state may have: the step accumulates in the state's own dtype, and the
# states of the ops (their final states, the layers' caches) are fp32, or fp64 for fp64 inputs.
# Differentiation of the chunked path (the shared-decay custom op and the selective
# autograd.Function): one hand-written backward, nothing else. Every other impl is plain PyTorch
# and takes every transform.
_TRANSFORMS = {
    "Jvp": "forward-mode AD (torch.func.jvp, jacfwd)",
    "Vmap": "torch.func.vmap",
    "Grad": "torch.func.grad (vjp, jacrev, hessian)",
}
DOUBLE_BACKWARD = (
    "double backward (backward through a gradient taken with create_graph=True) is not "
    "supported by the chunked path (impl='chunked'): its backward is written out by hand and "
    "is not itself differentiable; use "
    "interdomain_attention(..., impl='naive') (or 'closed_form', 'recurrent')"
)


# What the ops' refusals of a transform on the chunked path name and suggest
CHUNKED_PATH = "impl='chunked'"
PLAIN_IMPLS = (
    "use impl='naive' (or 'closed_form', 'recurrent': plain PyTorch, every transform runs)"
)


def check_transforms(op: str, path: str, remedy: str, *tensors) -> None:
    """Refuse the autograd transforms the chunked path cannot run: ``torch.func`` transforms
    (they would fail deep inside it, or, for jvp, return a zero tangent) and forward-mode AD
    dual tensors (a missing tangent). tensors: the differentiable inputs (None and tuples
    allowed). Python metadata only; skipped in a compiled graph (Dynamo runs transforms itself).
    """
    if torch.compiler.is_compiling():
        return
    active = functorch_transforms() if torch._C._are_functorch_transforms_active() else ()
    for name in active:
        if name in _TRANSFORMS:
            raise NotImplementedError(
                f"{op}: {_TRANSFORMS[name]} is not supported by {path}; {remedy}"
            )
    for x in tensors:
        for part in x if isinstance(x, (tuple, list)) else (x,):
            if isinstance(part, torch.Tensor) and fwAD.unpack_dual(part).tangent is not None:
                raise NotImplementedError(
                    f"{op}: forward-mode AD (torch.autograd.forward_ad dual tensors) is not "
                    f"supported by {path}; {remedy}"
                )


class _NotTwice(torch.autograd.Function):
    """The identity on a backward's gradients (copied), whose own backward raises
    ``DOUBLE_BACKWARD``; its inputs include the tensors the gradients depend on, so that a
    second backward meets it whatever it differentiates against."""

    @staticmethod
    def forward(ctx, n: int, *tensors):
        return tuple(t.clone() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(DOUBLE_BACKWARD)


def refuse_double_backward(grads, anchors):
    """grads (a sequence: tensors and None) as they are, unless the backward runs with
    create_graph=True: then each tensor passes through a ``_NotTwice`` node tied to anchors (the
    saved inputs and incoming gradients), so that a backward through them raises a named error
    instead of failing on an op without autograd, or of yielding no gradient at all."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return grads
    where = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    ties = [a for a in anchors if isinstance(a, torch.Tensor) and a.requires_grad]
    if not ties and not any(grads[i].requires_grad for i in where):
        return grads  # nothing upstream is differentiable: no second backward can start here
    out = list(grads)
    tied = _NotTwice.apply(len(where), *(grads[i] for i in where), *ties)
    for i, g in zip(where, tied, strict=True):
        out[i] = g
    return tuple(out) if isinstance(grads, tuple) else out


def warn_if_unstable(name: str, lam: torch.Tensor, stacklevel: int = 3) -> None:
    """Warn (once per call site) when a decay has |λ| > 1: the state then grows without bound.
    lam: complex, or real pairs (..., 2). A value check, so only where
    ``idmix.debug.check_values`` allows a host sync (nothing is computed elsewhere)."""
    if check_values(lam):
        lam = lam.detach()
        modulus = lam.abs() if lam.is_complex() else torch.linalg.vector_norm(lam, dim=-1)
        worst = float(modulus.max())
        if worst > 1 + 1e-6:
            warnings.warn(
                f"{name}: |λ| reaches {worst:.6g} > 1, an unstable decay: the state grows "
                "geometrically (discretize a complex A with Re A < 0 for |λ| < 1)",
                RuntimeWarning,
                stacklevel=stacklevel,
            )


def check_cu_seqlens(cu_seqlens, total: int) -> list[int]:
    """cu_seqlens: (N+1,) integer tensor, 0 = c_0 < c_1 < … < c_N = total. Returns it as a list."""
    if (
        not isinstance(cu_seqlens, torch.Tensor)
        or cu_seqlens.dim() != 1
        or cu_seqlens.dtype not in (torch.int32, torch.int64)
        or cu_seqlens.numel() < 2
    ):
        raise ValueError("cu_seqlens: expected a 1-d int32/int64 tensor of N+1 offsets, N >= 1")
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != total or any(b <= a for a, b in zip(cu, cu[1:], strict=False)):
        raise ValueError(
            f"cu_seqlens: expected strictly increasing offsets from 0 to the packed length "
            f"{total} (no empty sequence), got {cu}"
        )
    return cu


IMPLS = ("chunked", "naive", "closed_form", "recurrent")


class Call(NamedTuple):
    """What a checked call runs with: which parameter form; its readout (the complex form's,
    "conj" by default; None for the real form); cu_seqlens as a list (or None); the resolved
    precision ("ieee", "tf32" or "bf16")."""

    complex_form: bool
    readout: str | None
    cu: list[int] | None
    precision: str


def check_arguments(
    q, k, v, lam, beta, C, *, readout, cu_seqlens, initial_state, reset, chunk_size, impl,
    backend, precision,
) -> Call:  # fmt: skip
    """Every argument of ``interdomain_attention``, in either parameter form, each error
    naming its argument. Returns what the call runs with."""
    B, T, H, R, D = check_qkv(q, k, v)
    complex_form = isinstance(lam, torch.Tensor) and lam.is_complex()
    others = [
        n for n, x in (("beta", beta), ("C", C)) if isinstance(x, torch.Tensor) and x.is_complex()
    ]
    if not complex_form and others and isinstance(lam, torch.Tensor):
        raise TypeError(
            f"lam: expected a complex tensor like {' and '.join(others)} (the complex form), or "
            f"the real form throughout (lam, beta (…, M, 2), Ĝ for C), got {lam.dtype}"
        )
    if complex_form:
        readout = readout or "conj"
        M = check_params(lam, beta, C, H, readout, (B, T))
    else:
        if readout is not None:
            raise ValueError(
                f"readout: real-form parameters carry the readout in Ĝ (readout_gram); pass "
                f"readout only with complex C, got {readout!r}"
            )
        M = check_real_params(lam, beta, C, H, lead=(B, T), names=("lam", "beta", "C"))
    cu = None
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"q: expected a packed batch of 1 row with cu_seqlens, got B={B}")
        if reset is not None:
            raise ValueError(
                "reset: cu_seqlens already marks the sequence starts; pass cu_seqlens or "
                "reset, not both"
            )
        cu = check_cu_seqlens(cu_seqlens, T)
    N = B if cu is None else len(cu) - 1
    if initial_state is not None and complex_form:
        check_state(initial_state, N, H, M, R, D, "initial_state")
    elif initial_state is not None:
        check_real_state(initial_state, "initial_state", (N, H, R + D, 2 * M))
    check_chunk_size(chunk_size)
    check_reset(reset, B, T)
    check_backend(backend, q)
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl != "chunked" and precision not in ("auto", "ieee"):
        raise ValueError(f"precision: {precision!r} applies to impl='chunked' only, got {impl!r}")
    precision = resolve_precision(precision, q)
    tensors = {"lam": lam, "beta": beta, "C": C, "initial_state": initial_state, "reset": reset}
    check_devices("q", q, **tensors)
    if impl == "chunked":
        check_transforms(
            "interdomain_attention", CHUNKED_PATH, PLAIN_IMPLS, q, k, v, lam, beta, C,
            initial_state,
        )  # fmt: skip
    warn_if_unstable("lam", lam, stacklevel=4)  # the caller of interdomain_attention
    return Call(complex_form, readout, cu, precision)
