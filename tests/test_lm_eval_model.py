"""The lm-eval model: scores equal a direct forward pass whatever the batching, rolling
perplexity equals whole-text scoring, generation equals idmix.generate, and the offline tasks
run through lm-eval's own evaluator."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from idmix import generate
from idmix.evaluation.lm_eval_model import IdmixLM, _cut
from idmix.evaluation.scoring import continuation_logprobs
from idmix.io.tokenizer import shakespeare_bpe
from tests.helpers import save_tiny_export, tiny_model

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [
    ("To be, or not to be,", " that is the question"),
    ("ROMEO.\nBut soft, what light through yonder window", " breaks?"),
    ("O", " brave new world"),
    ("", "Full fathom five thy father lies;"),
]


@pytest.fixture(scope="module")
def tokenizer():
    return shakespeare_bpe()


def request(kind, args):
    return Instance(kind, {}, args, 0)


def direct_score(model, ctx, cont):
    """Σ log p(cont | ctx) from one unpadded forward pass."""
    ids = torch.tensor([ctx + cont])
    logp = F.log_softmax(model(ids[:, :-1]).float(), -1)[0]
    n = len(cont)
    return logp[-n:].gather(-1, ids[0, -n:, None]).sum().item()


@pytest.mark.parametrize("mixer", ["interdomain", "softmax", "s4d"])
def test_loglikelihood_is_a_direct_forward_pass_whatever_the_batching(mixer, tokenizer):
    model, _ = tiny_model(mixer)
    reqs = [request("loglikelihood", pair) for pair in TEXTS]
    one = IdmixLM(model, tokenizer, batch_size=1).loglikelihood(reqs, disable_tqdm=True)
    three = IdmixLM(model, tokenizer, batch_size=3).loglikelihood(reqs, disable_tqdm=True)
    lm = IdmixLM(model, tokenizer)
    for (a, greedy_a), (b, greedy_b), (ctx, cont) in zip(one, three, TEXTS, strict=True):
        ref = direct_score(model, *lm._pair(ctx, cont))
        assert a == pytest.approx(ref, rel=1e-5, abs=1e-4)
        assert b == pytest.approx(ref, rel=1e-5, abs=1e-4)
        assert greedy_a == greedy_b


def test_is_greedy_marks_exactly_the_argmax_continuation():
    model, _ = tiny_model()
    ctx = [5, 17, 300, 42]
    greedy = generate(model, [ctx], 3, temperature=0)[0]
    other = [greedy[0], greedy[1], (greedy[2] + 1) % 4096]
    (_, yes), (_, no) = continuation_logprobs(model, [(ctx, greedy), (ctx, other)], 512)
    assert yes and not no


def test_rolling_equals_whole_text_scoring_and_windows_cover_every_token(tokenizer):
    model, _ = tiny_model()
    text = "Now is the winter of our discontent\nMade glorious summer by this sun of York;"
    ids = tokenizer.encode(text)
    lm = IdmixLM(model, tokenizer)
    (rolling,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", (text,))], True)
    assert rolling == pytest.approx(direct_score(model, [tokenizer.eos_id], ids), rel=1e-5)
    # windows shorter than the text: the sum of each disjoint window scored on its own
    short = IdmixLM(model, tokenizer, max_length=8)
    (windowed,) = short.loglikelihood_rolling([request("loglikelihood_rolling", (text,))], True)
    windows = [
        make_disjoint_window(w) for w in get_rolling_token_windows(ids, tokenizer.eos_id, 8, 1)
    ]
    assert sum(len(cont) for _, cont in windows) == len(ids)
    assert windowed == pytest.approx(sum(direct_score(model, *w) for w in windows), rel=1e-5)


def test_generate_until_is_greedy_generate_cut_at_the_stop_string(tokenizer):
    model, _ = tiny_model()
    lm = IdmixLM(model, tokenizer, batch_size=2)
    contexts = ["KING.\nWhat say you", "Good morrow, cousin.", "A"]
    reqs = [
        request("generate_until", (c, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}))
        for c in contexts
    ]
    got = lm.generate_until(reqs, disable_tqdm=True)
    for c, text in zip(contexts, got, strict=True):
        ids = generate(model, [tokenizer.encode(c)], 6, temperature=0)[0]
        ids = [t for t in ids if t != tokenizer.eos_id]
        assert text == _cut(tokenizer.decode(ids), ["\n"])
    assert _cut("ab.cd\nef", [".", "\n"]) == "ab" and _cut("abc", ["x"]) == "abc"


def test_create_from_arg_string_and_its_errors(tmp_path):
    path = tmp_path / "model_final.pt"
    save_tiny_export(path)
    lm = IdmixLM.create_from_arg_string(f"checkpoint={path},batch_size=4,max_length=64")
    assert lm.batch_size == 4 and lm.max_length == 64
    with pytest.raises(ValueError, match="checkpoint=PATH"):
        IdmixLM.create_from_arg_string("batch_size=4")
    with pytest.raises(ValueError, match="unknown keys"):
        IdmixLM.create_from_arg_string(f"checkpoint={path},colour=red")
    with pytest.raises(ValueError, match="max_length"):
        IdmixLM(tiny_model()[0], None, max_length=10_000)


def test_offline_tasks_through_lm_eval_equal_scores_computed_directly(tokenizer):
    """lm-eval's numbers for the three offline tasks (3 documents each) equal the same metrics
    computed here from direct forward passes and idmix.generate."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import recipes.eval_tasks.shakespeare_tasks as tasks

    model, _ = tiny_model()
    lm = IdmixLM(model, tokenizer)
    out = simple_evaluate(
        model=lm,
        tasks=["shakespeare_next_line", "shakespeare_scenes", "shakespeare_next_speaker"],
        limit=3,
        task_manager=TaskManager(include_path=str(ROOT / "recipes" / "eval_tasks")),
        log_samples=False,
    )["results"]

    docs = tasks.next_line()["test"].select(range(3))
    hits = [
        max(range(4), key=lambda i: direct_score(model, *lm._pair(d["context"], d["choices"][i])))
        == d["gold"]
        for d in docs
    ]
    assert out["shakespeare_next_line"]["acc,none"] == pytest.approx(sum(hits) / 3)

    log_prob, words = 0.0, 0
    for text in tasks.scenes()["test"].select(range(3))["text"]:
        ids = tokenizer.encode(text)
        windows = get_rolling_token_windows(ids, tokenizer.eos_id, lm.max_length, 1)
        log_prob += sum(direct_score(model, *make_disjoint_window(w)) for w in windows)
        words += len(re.split(r"\s+", text))
    expected = math.exp(-log_prob / words)
    assert out["shakespeare_scenes"]["word_perplexity,none"] == pytest.approx(expected, rel=1e-4)

    matched = 0
    for d in tasks.next_speaker()["test"].select(range(3)):
        ids = generate(model, [tokenizer.encode(d["context"])], 8, temperature=0)[0]
        text = tokenizer.decode([t for t in ids if t != tokenizer.eos_id])
        matched += _cut(text, ["."]).strip() == d["speaker"]
    assert out["shakespeare_next_speaker"]["exact_match,strip"] == pytest.approx(matched / 3)
