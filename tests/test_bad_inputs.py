"""Adversarial input against the public API beyond the core op's shapes (tests/test_validation.py):
mixed devices, zero sizes, the decode steps, unstable decays, layers, token ids, generation and
backends. Each case asserts the error type and that the message names the argument."""

from __future__ import annotations

import os

import pytest
import torch

from idmix.functional import interdomain_attention, interdomain_decode_step, readout_gram
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
        **{k: v for k, v in over.items() if k in ("reset", "backend")},
    )[0]  # fmt: skip


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
    )  # fmt: skip


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
        a["q"],
        a["k"],
        a["v"],
        a["lam_ri"],
        a["beta_ri"],
        a["G"],
        a["state"],
        inplace=True,
    )[0]  # fmt: skip


def varlen(p, **over):
    a = {**p, **over}
    cu = torch.tensor([0, 2, T])
    return interdomain_attention(
        a["q"][:1],
        a["k"][:1],
        a["v"][:1],
        a["lam"],
        a["beta"],
        a["C"],
        cu_seqlens=cu,
    )[0]  # fmt: skip


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
