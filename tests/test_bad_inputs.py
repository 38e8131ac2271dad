"""Bad input against the public API, in one table: the core op's arguments one by one, mixed
devices, zero sizes, the decode steps and their dtypes, complex states given to the real form,
backends; then unstable decays, layers, decoding caches, token ids, generation, the short convs
and the other primitives. Each case asserts the error type and that the message names the
argument. (Autograd transforms the chunked path refuses: tests/test_autograd_transforms.py.)"""

from __future__ import annotations

import os

import pytest
import torch

from idmix.functional import (
    discretize,
    interdomain_attention,
    interdomain_decode_step,
    readout_gram,
    short_conv,
    short_conv_step,
    short_conv_with_resets,
)
from idmix.functional.interdomain import empty_state
from idmix.generation import generate
from idmix.modules import InterdomainAttention, S4DMixer, SoftmaxAttention
from tests.helpers import make_problem, tiny_model

B, T, H, R, D, M = 2, 5, 2, 3, 4, 3


@pytest.fixture(scope="module")
def p():
    return make_problem(B=B, T=T, H=H, R=R, D=D, M=M, dtype=torch.float32)


def meta(x):
    return x.to("meta")


def core(p, **over):
    a = {**p, **over}
    return interdomain_attention(
        a["q"],
        a["k"],
        a["v"],
        a["lam"],
        a["beta"],
        a["C"],
        initial_state=a.get("initial_state"),
        **{
            k: v
            for k, v in over.items()
            if k in ("reset", "backend", "readout", "chunk_size", "impl")
        },
    )[0]


def real_args(p):
    lam_ri = torch.view_as_real(p["lam"]).contiguous()
    beta_ri = torch.view_as_real(p["beta"]).contiguous()
    return lam_ri, beta_ri, readout_gram(p["C"], "conj").float()


def real(p, **over):
    lam_ri, beta_ri, G = real_args(p)
    a = {"lam_ri": lam_ri, "beta_ri": beta_ri, "G_hat": G, **p, **over}
    return interdomain_attention(
        a["q"],
        a["k"],
        a["v"],
        a["lam_ri"],
        a["beta_ri"],
        a["G_hat"],
        initial_state=a.get("Z0"),
        reset=a.get("reset"),
        backend=a.get("backend", "auto"),
        output_final_state=True,
    )


def step(p, **over):
    G = readout_gram(p["C"], "conj").float()
    a = {"q": p["q"][:, 0], "k": p["k"][:, 0], "v": p["v"][:, 0], "lam": p["lam"],
         "beta": p["beta"], "G": G, "state": empty_state(B, H, M, R, D), **over}  # fmt: skip
    return interdomain_decode_step(a["q"], a["k"], a["v"], a["lam"], a["beta"], a["G"],
                                   a["state"], backend=a.get("backend", "auto"))  # fmt: skip


def step_real(p, **over):
    lam_ri, beta_ri, G = real_args(p)
    a = {"q": p["q"][:, 0], "k": p["k"][:, 0], "v": p["v"][:, 0], "lam_ri": lam_ri,
         "beta_ri": beta_ri, "G": G, "state": torch.zeros(B, H, R + D, 2 * M), **over}  # fmt: skip
    return interdomain_decode_step(
        a["q"], a["k"], a["v"], a["lam_ri"], a["beta_ri"], a["G"], a["state"], inplace=True
    )[0]


def varlen(p, **over):
    a = {**p, **over}
    cu = torch.tensor([0, 2, T])
    return interdomain_attention(
        a["q"][:1], a["k"][:1], a["v"][:1], a["lam"], a["beta"], a["C"], cu_seqlens=cu
    )[0]


RESET = r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\) or None, got"
REAL_STATE = r"initial_state: expected the interleaved real state, a real floating tensor"
COMPLEX_Z0 = torch.zeros(2, 2, 7, 6, dtype=torch.complex64)
MIXED = r"q, k, v: expected one dtype, got torch.float64, torch.float32, torch.float16"
STATE_DTYPE = r"state: expected a decode state in one of \('torch.float32', 'torch.float64'\)"

CASES = {
    # mixed devices: named, with both devices
    "core lam on meta": (lambda p: core(p, lam=meta(p["lam"])), ValueError, r"lam: expected a tensor on cpu .*got one on meta"),
    "core C on meta": (lambda p: core(p, C=meta(p["C"])), ValueError, r"C: expected a tensor on cpu"),
    "core v on meta": (lambda p: core(p, v=meta(p["v"])), ValueError, r"v: expected a tensor on cpu"),
    "core reset on meta": (lambda p: core(p, reset=torch.zeros(B, T, dtype=torch.bool, device="meta")), ValueError, r"reset: expected a tensor on cpu"),
    "core state on meta": (lambda p: core(p, initial_state=tuple(map(meta, p["initial_state"]))), ValueError, r"initial_state\[0\]: expected a tensor on cpu"),
    "real G_hat on meta": (lambda p: real(p, G_hat=meta(real_args(p)[2])), ValueError, r"C: expected a tensor on cpu"),
    "real lam_ri on meta": (lambda p: real(p, lam_ri=meta(real_args(p)[0])), ValueError, r"lam: expected a tensor on cpu"),
    "varlen C on meta": (lambda p: varlen(p, C=meta(p["C"])), ValueError, r"C: expected a tensor on cpu"),
    "step lam on meta": (lambda p: step(p, lam=meta(p["lam"])), ValueError, r"lam: expected a tensor on cpu"),
    "step state on meta": (lambda p: step(p, state=tuple(map(meta, empty_state(B, H, M, R, D)))), ValueError, r"state\[0\]: expected a tensor on cpu"),
    "step_real state on meta": (lambda p: step_real(p, state=torch.zeros(B, H, R + D, 2 * M, device="meta")), ValueError, r"state: expected a tensor on cpu"),
    # zero sizes
    "core B = 0": (lambda p: core(p, q=p["q"][:0], k=p["k"][:0], v=p["v"][:0], initial_state=None), ValueError, r"q, v: expected non-zero B, H, R and D"),
    "core H = 0": (lambda p: core(p, q=p["q"][:, :, :0], k=p["k"][:, :, :0], v=p["v"][:, :, :0], lam=p["lam"][:0], beta=p["beta"][:0], C=p["C"][:0], initial_state=None), ValueError, r"q, v: expected non-zero"),
    "core M = 0": (lambda p: core(p, lam=p["lam"][:, :0], beta=p["beta"][:, :0], C=p["C"][:, :0, :0], initial_state=None), ValueError, r"lam: expected at least one mode"),
    "real M = 0": (lambda p: real(p, lam_ri=real_args(p)[0][:, :0], beta_ri=real_args(p)[1][:, :0], G_hat=torch.zeros(H, 0, 0)), ValueError, r"lam: expected at least one mode"),
    # varlen: rank before the batch-of-one rule, parameters before indexing
    "varlen 3-dim q": (lambda p: interdomain_attention(p["q"][0], p["k"][0], p["v"][0], p["lam"], p["beta"], p["C"], cu_seqlens=torch.tensor([0, T]))[0], ValueError, r"q: expected 4 dims"),
    "varlen bad lam": (lambda p: varlen(p, lam=p["lam"][:1]), ValueError, r"lam: expected shape \(H, M\)"),
    # the decode steps
    "step (B, 1, H, R) query": (lambda p: step(p, q=p["q"][:, :1]), ValueError, r"q: expected \(B, H, R\) = \(2, 2, 3\) or \(B, H, r, R\)"),
    "step int query": (lambda p: step(p, q=p["q"][:, 0].long()), TypeError, r"q: expected a real floating tensor"),
    "step k wrong shape": (lambda p: step(p, k=p["k"][:, 0, :1]), ValueError, r"k: expected \(B, H, R\)"),
    "step v wrong shape": (lambda p: step(p, v=p["v"][:, 0, :, :2]), ValueError, r"v: expected \(B, H, D\)"),
    "step real lam": (lambda p: step(p, lam=p["lam"].real), TypeError, r"lam: expected a complex tensor"),
    "step G_hat wrong shape": (lambda p: step(p, G=torch.zeros(H, M, M)), ValueError, r"G_hat: expected \(H, 2M, 2M\)"),
    "step state not a tuple": (lambda p: step(p, state=torch.zeros(B, H, M, R)), TypeError, r"state: expected a tuple"),
    "step bad backend": (lambda p: step(p, backend="cuda"), ValueError, r"backend: expected one of \('auto', 'torch', 'triton', 'inductor'\)"),
    "step_real int query": (lambda p: step_real(p, q=p["q"][:, 0].long()), TypeError, r"q: expected a real floating tensor"),
    "step_real (B, 1, H, R) query": (lambda p: step_real(p, q=p["q"][:, :1]), ValueError, r"q: expected \(B, H, R\)"),
    "step_real complex state": (lambda p: step_real(p, state=torch.zeros(B, H, R + D, M, dtype=torch.complex64)), ValueError, r"state: expected a contiguous \(B, H, R\+D, 2M\) real"),
    "step_real state of other M": (lambda p: step_real(p, state=torch.zeros(B, H, R + D, 2 * M + 2)), ValueError, r"state: expected \(B, H, R\+D, 2M\) with M = 3"),
    # backends: one vocabulary, and triton on CPU names the interpreter
    "core bad backend": (lambda p: core(p, backend="cuda"), ValueError, r"backend: expected one of \('auto', 'torch', 'triton', 'inductor'\)"),
    "real bad backend": (lambda p: real(p, backend=None), ValueError, r"backend: expected one of"),
    "layer bad backend": (lambda p: InterdomainAttention(8, 2, backend="cuda"), ValueError, r"backend: expected one of"),
    "linear readout backend": (lambda p: S4DMixer(8, 2, backend="inductor"), ValueError, r"backend: the linear readout runs on PyTorch only"),
    # the core op's arguments, one by one
    "core 3-dim q": (lambda p: core(p, q=p["q"][0]), ValueError, r"q: expected 4 dims \(B, T, H, R\)"),
    "core k of other R": (lambda p: core(p, k=p["k"][..., :2]), ValueError, r"k: expected the shape of q"),
    "core v of other T": (lambda p: core(p, v=p["v"][:, :4]), ValueError, r"v: expected \(B, T, H, D\)"),
    "core mixed dtypes": (lambda p: core(p, q=p["q"].double()), TypeError, r"q, k, v: expected one dtype"),
    "core int q": (lambda p: core(p, q=p["q"].long()), TypeError, r"q: expected a real floating tensor"),
    "core T = 0": (lambda p: core(p, q=p["q"][:, :0], k=p["k"][:, :0], v=p["v"][:, :0]), ValueError, r"T >= 1"),
    "core real lam": (lambda p: core(p, lam=p["lam"].real), TypeError, r"lam: expected a complex tensor"),
    "core lam of other H": (lambda p: core(p, lam=p["lam"][:1]), ValueError, r"lam: expected shape \(H, M\)"),
    "core beta of other M": (lambda p: core(p, beta=p["beta"][:, :2]), ValueError, r"beta: expected shape \(H, M\)"),
    "core C of other M": (lambda p: core(p, C=p["C"][:, :2]), ValueError, r"C: expected shape \(H, M, M\)"),
    "core state not a tuple": (lambda p: core(p, initial_state=p["initial_state"][0]), TypeError, r"initial_state: expected a tuple"),
    "core Xk of other B": (lambda p: core(p, initial_state=(p["initial_state"][0][:1], p["initial_state"][1])), ValueError, r"initial_state\[0\] \(Xk\): expected shape \(B, H, M, R\)"),
    "core real Xv": (lambda p: core(p, initial_state=(p["initial_state"][0], p["initial_state"][1].real)), TypeError, r"initial_state\[1\] \(Xv\): expected a complex tensor"),
    "core chunk_size 48": (lambda p: core(p, chunk_size=48), ValueError, r"chunk_size: expected a positive power of two"),
    "core chunk_size 0": (lambda p: core(p, chunk_size=0), ValueError, r"chunk_size"),
    "core chunk_size True": (lambda p: core(p, chunk_size=True), ValueError, r"chunk_size"),
    "core bad readout": (lambda p: core(p, readout="hermitian"), ValueError, r"readout: expected one of"),
    "core bad impl": (lambda p: core(p, impl="fast"), ValueError, r"impl: expected one of"),
    "core reset of other T": (lambda p: core(p, reset=torch.zeros(2, 4, dtype=torch.bool)), ValueError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\)"),
    "core float reset": (lambda p: core(p, reset=torch.zeros(2, 5)), ValueError, r"reset: expected a bool tensor"),
    # reset that is not a tensor (was: AttributeError 'list' object has no attribute 'dtype')
    "core reset list": (lambda p: core(p, reset=[[False] * 5] * 2), TypeError, RESET + r" list"),
    "core reset ndarray": (lambda p: core(p, reset=torch.zeros(2, 5, dtype=torch.bool).numpy()), TypeError, RESET + r" ndarray"),
    "real reset list": (lambda p: real(p, reset=[[False] * 5] * 2), TypeError, RESET + r" list"),
    # a complex initial state given to the real form (was: its imaginary part dropped)
    "real complex initial_state": (lambda p: real(p, Z0=COMPLEX_Z0), TypeError, REAL_STATE + r".*got torch.complex64"),
    "real form with complex C": (lambda p: real(p, G_hat=p["C"]), TypeError, r"lam: expected a complex tensor like C \(the complex form\)"),
    "real list initial_state": (lambda p: real(p, Z0=[0.0]), TypeError, REAL_STATE + r".*got list"),
    "varlen_real complex initial_state": (lambda p: interdomain_attention(p["q"][:1], p["k"][:1], p["v"][:1], *real_args(p), cu_seqlens=torch.tensor([0, 2, T]), initial_state=COMPLEX_Z0), TypeError, REAL_STATE),
    # the decode steps: one dtype for q, k, v; an fp32/fp64 state (was: accepted, or
    # view_as_complex failing on bf16)
    "step mixed dtypes": (lambda p: step(p, q=p["q"][:, 0].double(), v=p["v"][:, 0].half()), TypeError, MIXED),
    "step_real mixed dtypes": (lambda p: step_real(p, q=p["q"][:, 0].double(), v=p["v"][:, 0].half()), TypeError, MIXED),
    "step_real bf16 state": (lambda p: step_real(p, state=torch.zeros(2, 2, 7, 6, dtype=torch.bfloat16)), TypeError, STATE_DTYPE + r".*got torch.bfloat16"),
    "step_real fp16 state": (lambda p: step_real(p, state=torch.zeros(2, 2, 7, 6, dtype=torch.float16)), TypeError, STATE_DTYPE + r".*got torch.float16"),
    "step complex32 state": (lambda p: step(p, state=tuple(x.to(torch.complex32) for x in empty_state(2, 2, 3, 3, 4))), TypeError, r"state\[0\]: expected a decode state in one of \('torch.complex64', 'torch.complex128'\)"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_named(p, case):
    call, exc, pattern = CASES[case]
    with pytest.raises(exc, match=pattern):
        call(p)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter is on")
@pytest.mark.parametrize("entry", [core, real, step])
def test_triton_on_cpu_without_the_interpreter_says_how(p, entry):
    with pytest.raises(
        ValueError, match=r"backend: 'triton' on CPU tensors needs .*TRITON_INTERPRET=1"
    ):
        entry(p, backend="triton")


def test_unstable_decay_warns(p):
    with pytest.warns(RuntimeWarning, match=r"lam: \|λ\| reaches 1.5 > 1, an unstable decay"):
        core(p, lam=p["lam"] / p["lam"].abs() * 1.5)
    lam_ri = real_args(p)[0]
    with pytest.warns(RuntimeWarning, match=r"lam: \|λ\| reaches 2 > 1"):
        real(p, lam_ri=lam_ri / torch.linalg.vector_norm(lam_ri, dim=-1, keepdim=True) * 2)


def test_stable_layers_do_not_warn(recwarn):
    model, _ = tiny_model("interdomain")
    model(torch.randint(0, 64, (1, 16)))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.fixture(scope="module")
def layers():
    return {"ssm": InterdomainAttention(16, 2, num_modes=4), "softmax": SoftmaxAttention(16, 2)}


LAYER_CASES = {
    "2-D x": (lambda: torch.randn(5, 16), {}, ValueError, r"x: expected \(B, T, 16\), got \(5, 16\)"),
    "4-D x": (lambda: torch.randn(1, 2, 5, 16), {}, ValueError, r"x: expected \(B, T, 16\)"),
    "wrong width": (lambda: torch.randn(1, 5, 8), {}, ValueError, r"x: expected \(B, T, 16\), got \(1, 5, 8\)"),
    "T = 0": (lambda: torch.randn(1, 0, 16), {}, ValueError, r"x: expected B >= 1 and T >= 1"),
    "int x": (lambda: torch.ones(1, 5, 16, dtype=torch.long), {}, TypeError, r"x: expected a floating tensor"),
    "float input_pos": (lambda: torch.randn(1, 5, 16), {"input_pos": torch.arange(5.0)}, TypeError, r"input_pos: expected an integer tensor"),
    "negative input_pos": (lambda: torch.randn(1, 5, 16), {"input_pos": torch.arange(5) - 2}, ValueError, r"input_pos: expected positions >= 0, got -2"),
}  # fmt: skip


@pytest.mark.parametrize("kind", ["ssm", "softmax"])
@pytest.mark.parametrize("case", LAYER_CASES)
def test_layers_name_bad_input(layers, kind, case):
    make_x, kw, exc, pattern = LAYER_CASES[case]
    with pytest.raises(exc, match=pattern):
        layers[kind](make_x(), **kw)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"chunk_size": 48}, r"chunk_size: expected a positive power of two, got 48"),
        ({"readout_convention": "adjoint"}, r"readout_convention: expected one of \('conj', 'product'\)"),
        ({"num_modes": 0}, r"num_modes: expected a positive int, got 0"),
        ({"dt_min": 0.2, "dt_max": 0.1}, r"dt_min, dt_max: expected 0 < dt_min <= dt_max"),
    ],
)  # fmt: skip
def test_layer_construction_checks(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        InterdomainAttention(16, 2, **{"num_modes": 4, **kwargs})


def test_token_ids_outside_the_vocabulary_are_named():
    model, _ = tiny_model("interdomain")
    V = model.tok_embeddings.num_embeddings
    with pytest.raises(ValueError, match=rf"tokens: id {V} is outside the vocabulary \[0, {V}\)"):
        model(torch.tensor([[1, 2, V]]))
    with pytest.raises(ValueError, match=r"tokens: id -1 is outside the vocabulary"):
        model(torch.tensor([[1, -1]]))
    with pytest.raises(TypeError, match=r"tokens: expected integer token ids"):
        model(torch.ones(1, 3))


@pytest.mark.parametrize(
    "prompts, kwargs, exc, pattern",
    [
        ([[1, 2]], {"top_k": 0}, ValueError, r"top_k: expected None or an int >= 1, got 0"),
        ([[1, 2]], {"temperature": float("nan")}, ValueError, r"temperature: expected a finite number >= 0, got nan"),
        ([[1, 2]], {"temperature": -1.0}, ValueError, r"temperature: expected a finite number >= 0"),
        ([[1, 2]], {"top_p": 0.0}, ValueError, r"top_p: expected None or a number in \(0, 1\]"),
        ([[1, 2]], {"max_new_tokens": 2.5}, ValueError, r"max_new_tokens: expected an int >= 1, got 2.5"),
        ([[1, 2]], {"max_new_tokens": 0}, ValueError, r"max_new_tokens: expected an int >= 1, got 0"),
        (torch.tensor([[1, 2]]), {}, TypeError, r"prompts: expected a list of token-id lists, got Tensor"),
        ([[1, 2], []], {}, ValueError, r"prompts\[1\]: expected a non-empty list of token ids"),
        ([[1, 9999]], {}, ValueError, r"prompts\[0\]: token id 9999 is outside the vocabulary \[0, 4096\)"),
        ([[1.5]], {}, TypeError, r"prompts\[0\]: expected int token ids"),
        ([], {}, ValueError, r"prompts: expected a non-empty list"),
    ],
)  # fmt: skip
def test_generate_names_bad_arguments(prompts, kwargs, exc, pattern):
    model, _ = tiny_model("interdomain")
    with pytest.raises(exc, match=pattern):
        generate(model, prompts, kwargs.pop("max_new_tokens", 2), **kwargs)


def test_bf16_inputs_with_an_fp32_state_still_decode(p):
    """The state contract is on the state: q, k, v of one lower precision are fine."""
    lo = {n: p[n][:, 0].bfloat16() for n in ("q", "k", "v")}
    o = step_real(p, **lo)
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()


# Decoding against the cache: batch size, and the softmax cache's length


@pytest.fixture(params=["ssm", "softmax"])
def layer(request):
    torch.manual_seed(0)
    if request.param == "ssm":
        mixer = InterdomainAttention(16, 2, num_modes=4)
    else:
        mixer = SoftmaxAttention(16, 2)
    mixer.setup_cache(2, torch.float32, 4)
    return mixer


@pytest.mark.parametrize("rows, T_in", [(3, 1), (1, 1), (3, 3)])
def test_decoding_a_batch_the_cache_does_not_hold_is_named(layer, rows, T_in):
    """Was: torch.cat / index_copy_ size errors, or the short conv's cache shape."""
    pattern = rf"x: batch size {rows} does not match the decoding cache's batch size 2"
    with pytest.raises(ValueError, match=pattern):
        layer(torch.randn(rows, T_in, 16))


def test_softmax_decoding_past_its_cache_length_is_named():
    """Was: IndexError from index_copy_ (a device assert on CUDA). Filling it exactly is fine;
    the recurrent cache has no length, so the SSM mixer decodes on."""
    torch.manual_seed(0)
    attn = SoftmaxAttention(16, 2)
    attn.setup_cache(2, torch.float32, 4)
    attn(torch.randn(2, 3, 16))
    attn(torch.randn(2, 1, 16))  # 4 of 4
    with pytest.raises(
        ValueError,
        match=r"x: 1 more position\(s\) would go past the KV cache's max_seq_len = 4 \(4 filled\)",
    ):
        attn(torch.randn(2, 1, 16))
    attn.reset_cache()
    with pytest.raises(
        ValueError, match=r"x: 6 positions do not fit the KV cache's max_seq_len = 4"
    ):
        attn(torch.randn(2, 6, 16))


# The short-conv step and reset variants check what the full short conv checks

C_, W_ = 3, 4


def _full(x, w, b, cache):
    return short_conv(x, w, b, cache)


def _resets(x, w, b, cache):
    return short_conv_with_resets(x, w, b, torch.zeros(*x.shape[:2], dtype=torch.bool), cache)


def _step_conv(x, w, b, cache):
    return short_conv_step(x[:, 0], w, b, cache)


CONV_ENTRIES = {
    "short_conv": _full,
    "short_conv_with_resets": _resets,
    "short_conv_step": _step_conv,
}
GOOD = dict(
    x=torch.randn(2, 5, C_),
    w=torch.randn(C_, W_),
    b=torch.randn(C_),
    cache=torch.randn(2, W_ - 1, C_),
)
CONV_CASES = {
    "x wrong rank": (dict(x=torch.randn(2, 5, 1, C_)), ValueError, r"x(_t)?: expected \(B, (T, )?C\), got shape"),
    "weight 1-d": (dict(w=torch.randn(C_)), ValueError, r"weight: expected \(C, W\), got shape \(3,\)"),
    "channels": (dict(w=torch.randn(C_ + 1, W_), b=None), ValueError, r"x(_t)?: last dim 3 does not match weight channels 4"),
    "bias shape": (dict(b=torch.randn(C_ + 1)), ValueError, r"bias: expected \(3,\), got \(4,\)"),
    "cache window": (dict(cache=torch.randn(2, W_ - 2, C_)), ValueError, r"cache: expected \(2, 3, 3\) = \(B, W-1, C\), got \(2, 2, 3\)"),
    "cache batch": (dict(cache=torch.randn(1, W_ - 1, C_)), ValueError, r"cache: expected \(2, 3, 3\) = \(B, W-1, C\), got \(1, 3, 3\)"),
    "cache not a tensor": (dict(cache=[0.0]), TypeError, r"cache: expected a \(2, 3, 3\) tensor, got list"),
}  # fmt: skip


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("entry", CONV_ENTRIES)
def test_short_conv_entries_share_their_checks(entry, case):
    """Was: the step and reset variants skipped these (raw size errors deep inside)."""
    over, exc, pattern = CONV_CASES[case]
    a = {**GOOD, **over}  # the step takes x[:, 0]: (B, C), or 3 dims for "x wrong rank"
    with pytest.raises(exc, match=pattern):
        CONV_ENTRIES[entry](a["x"], a["w"], a["b"], a["cache"])


@pytest.mark.parametrize(
    "reset, exc, pattern",
    [
        ([[False] * 5] * 2, TypeError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\) or None, got list"),
        (torch.zeros(2, 5), ValueError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\), got torch.float32"),
        (torch.zeros(2, 4, dtype=torch.bool), ValueError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\)"),
        (None, TypeError, r"reset: expected a bool tensor of shape \(B, T\) = \(2, 5\), got None"),
    ],
)  # fmt: skip
def test_short_conv_with_resets_names_a_bad_reset(reset, exc, pattern):
    with pytest.raises(exc, match=pattern):
        short_conv_with_resets(GOOD["x"], GOOD["w"], GOOD["b"], reset, GOOD["cache"])


def test_short_conv_step_without_a_cache_is_named():
    with pytest.raises(TypeError, match=r"cache: expected the \(B, W-1, C\) history"):
        short_conv_step(GOOD["x"][:, 0], GOOD["w"], GOOD["b"], None)


def test_primitive_errors():
    with pytest.raises(ValueError, match=r"x: expected \(B, T, C\)"):
        short_conv(torch.randn(4, 3), torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"cache: expected \(2, 3, 3\)"):
        short_conv(torch.randn(2, 5, 3), torch.randn(3, 4), cache=torch.randn(2, 2, 3))
    with pytest.raises(ValueError, match=r"x: last dim 3 does not match weight channels 5"):
        short_conv(torch.randn(2, 5, 3), torch.randn(5, 4))
    with pytest.raises(TypeError, match=r"A: expected a complex tensor"):
        discretize(torch.ones(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"method: expected 'zoh' or 'bilinear'"):
        discretize(torch.ones(2), torch.ones(2, 3, dtype=torch.complex64), "euler")
    with pytest.raises(ValueError, match=r"C: expected \(H, M, M\)"):
        readout_gram(torch.ones(2, 3, 4, dtype=torch.complex64))
