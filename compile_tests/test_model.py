"""A whole tiny model: training step, shape-dynamic recompiles, per-block frame reuse, decoding
and the generation loop, compiled with fullgraph=True and checked against eager."""

from __future__ import annotations

import pytest
import torch

from compile_tests.golden import check, compiled, counter
from idmix import generate
from idmix.models import cpu_model
from tests.helpers import assert_rel

VOCAB = 4096


def tiny(mixer: str):
    torch.manual_seed(0)
    return cpu_model(mixer, "tiny", max_seq_len=512)


def train_step(model, tokens):
    """Loss and the gradients of every parameter."""
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return [loss.detach(), *(p.grad for p in model.parameters())]


def compile_blocks(model, cnt, dynamic=None):
    """torchtitan/torchtune style: each block compiled on its own with fullgraph=True."""
    for layer in model.layers:
        layer.compile(backend=cnt, fullgraph=True, dynamic=dynamic)


@pytest.mark.parametrize(
    "mixer", ["interdomain", pytest.param("s4d", marks=pytest.mark.slow), "softmax"]
)
def test_training_step_compiles_per_block(mixer):
    """N identical blocks share one compiled frame; loss and every gradient match eager."""
    model = tiny(mixer)
    tokens = torch.randint(0, VOCAB, (2, 97))
    ref = train_step(model, tokens)
    cnt = counter()
    compile_blocks(model, cnt)
    got = train_step(model, tokens)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert_rel(a, b, 3e-4, f"{mixer} tensor {i}")
    assert cnt.frame_count == 1, "the blocks did not reuse one compiled frame"
    check(f"model/{mixer}/train_step", {"frames": cnt.frame_count, "ops": cnt.op_count})


def test_training_step_does_not_recompile_across_lengths():
    """Compiled with dynamic shapes, lengths reuse the graph (no recompile): one graph for
    lengths that are whole chunks, one for ragged ones. (Lengths equal to the model width would
    share its symbol by duck sizing and specialise: the first lengths here avoid d = 128.)"""
    model = tiny("interdomain")
    cnt = counter()
    compile_blocks(model, cnt, dynamic=True)
    train_step(model, torch.randint(0, VOCAB, (2, 257)))  # T = 256: whole chunks
    train_step(model, torch.randint(0, VOCAB, (2, 161)))  # T = 160: a ragged tail
    frames = cnt.frame_count
    torch.compiler.set_stance("fail_on_recompile")
    for T in (320, 448, 200, 77):
        train_step(model, torch.randint(0, VOCAB, (2, T + 1)))
    assert cnt.frame_count == frames
    check("model/interdomain/train_step_dynamic", {"frames": frames, "ops": cnt.op_count})


def decode_setup(model, B=2, prompt=8, total=48):
    model.eval()
    model.setup_caches(batch_size=B, dtype=torch.float32, decoder_max_seq_len=total)
    mask = torch.ones(total, total, dtype=torch.bool).tril()[None].expand(B, -1, -1)
    tokens = torch.randint(0, VOCAB, (B, total))
    with torch.no_grad():
        model(
            tokens[:, :prompt], mask=mask[:, :prompt], input_pos=torch.arange(prompt).expand(B, -1)
        )
    return tokens, mask


@pytest.mark.parametrize(
    "mixer",
    [
        "interdomain",
        pytest.param("s4d", marks=pytest.mark.slow),
        pytest.param("softmax", marks=pytest.mark.slow),
    ],
)
def test_decode_step_compiles_once(mixer):
    """The one-token step compiles once and never recompiles across steps; it matches eager."""
    model = tiny(mixer)
    tokens, mask = decode_setup(model)
    eager_model = tiny(mixer)
    decode_setup(eager_model)
    cnt = counter()
    step = compiled(model, cnt)
    B = tokens.shape[0]
    with torch.no_grad():
        for t in range(8, 16):
            args = (tokens[:, t : t + 1],)
            kw = dict(mask=mask[:, t : t + 1].clone(), input_pos=torch.full((B, 1), t))
            out = step(*args, **kw)
            ref = eager_model(*args, **kw)
            assert_rel(out, ref, 1e-4, f"step {t}")
            if t == 9:  # the first call compiled; the second may specialise nothing new
                torch.compiler.set_stance("fail_on_recompile")
    check(f"model/{mixer}/decode_step", {"frames": cnt.frame_count, "ops": cnt.op_count})


def test_decode_constants_follow_reset_caches():
    """A compiled step reads λ, β and Ĝ from the snapshot setup_caches/reset_caches take (not
    recomputed per token); after the weights change, reset_caches refreshes it in place: the
    step matches eager with the new weights and does not recompile. The snapshot is not saved."""
    model = tiny("interdomain")
    tokens, mask = decode_setup(model)
    eager_model = tiny("interdomain")  # the same weights and (reseeded) the same prompt
    decode_setup(eager_model)
    step = compiled(model, counter())
    B = tokens.shape[0]

    def both(t):
        args = (tokens[:, t : t + 1],)
        kw = dict(mask=mask[:, t : t + 1].clone(), input_pos=torch.full((B, 1), t))
        return step(*args, **kw), eager_model(*args, **kw)

    with torch.no_grad():
        for t in (8, 9):
            assert_rel(*both(t), 1e-4, f"step {t}")
        torch.compiler.set_stance("fail_on_recompile")
        for m in (model, eager_model):
            for layer in m.layers:
                layer.attn.core.C_re.mul_(1.5)
                layer.attn.core.log_dt.add_(0.5)
            m.reset_caches()
        got, want = both(10)
        assert_rel(got, want, 1e-4, "after the weights changed")
    assert not any("decoding_" in k for k in model.state_dict())


def test_generation_loop_compiled_equals_eager():
    """generate(compile=True): greedy tokens equal eager's, across ragged prompts."""
    model = tiny("interdomain").eval()
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    eager = generate(model, prompts, 12, temperature=0)
    torch.compiler.set_stance("default")
    fast = generate(model, prompts, 12, temperature=0, compile=True)
    assert fast == eager
