"""idmix.hf: idmix models as transformers models. A save → load round trip through the Auto
classes (``import idmix.hf``, ``trust_remote_code=False``) gives identical logits for every
mixer family; HF ``generate`` gives idmix.generate's greedy tokens on a ragged batch;
``idmix-lm-eval --model hf`` (on a directory with planted code, which never runs) and
``--model idmix`` score as lm-eval does in process; pickles are refused unread; config errors
name the field; what does not apply says so. The attacks: tests/test_hf_security.py."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

from idmix import generate  # noqa: E402
from idmix.hf import IdmixCache, IdmixConfig, IdmixForCausalLM  # noqa: E402
from idmix.hf.convert import convert  # noqa: E402
from idmix.hf.convert import main as convert_main  # noqa: E402
from idmix.io.checkpoint import export_model, load_exported_model  # noqa: E402
from idmix.io.tokenizer import shakespeare_bpe  # noqa: E402
from tests.hf_attacks import plant_code  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FAMILIES = {  # every mixer family: the paper's layer, the baselines, selective, a Table 4 cell
    "interdomain": "interdomain",
    "softmax": "softmax",
    "s4d": "s4d",
    "selective": "selective_interdomain",
    "cell": "dual_kv_linear",
}
TOY = {"num_layers": 2, "vocab_size": 97, "embed_dim": 32, "num_heads": 2, "num_modes": 8}
SEED = torch.Generator().manual_seed
TASKS = "shakespeare_next_line,shakespeare_next_speaker,shakespeare_scenes"


def env(tmp):
    """Offline and on one thread (as the tests here); were a directory's code ever copied to
    run, it would land under tmp."""
    quiet = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    return {**os.environ, **quiet, "OMP_NUM_THREADS": "1", "HF_MODULES_CACHE": str(tmp / "modules")}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Toy sizes on one thread: a second thread only waits for a busy core (100x slower
    decoding on a loaded 2-core machine), and subprocess and in-process results then come
    from the same kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def toy(mixer: str, seed: int = 0) -> IdmixForCausalLM:
    torch.manual_seed(seed)
    config = IdmixConfig(builder="interdomain_tiny", overrides={**TOY, "mixer": mixer})
    return IdmixForCausalLM(config).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (model, its saved directory)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, (family, mixer) in enumerate(FAMILIES.items()):
        model = toy(mixer, seed=i)
        model.save_pretrained(root / family)
        out[family] = (model, root / family)
    return out


@pytest.fixture(scope="module")
def shakespeare_dir(tmp_path_factory):
    """A small model on the embedded corpus's tokenizer: model_final.pt and its hf/ directory
    (written by the converter, as a pretraining run writes it)."""
    root = tmp_path_factory.mktemp("lm")
    torch.manual_seed(0)
    node = {"_component_": "idmix.models.interdomain_tiny", "num_layers": 1}
    from idmix.models import interdomain_tiny

    export_model(root / "model_final.pt", interdomain_tiny(num_layers=1), node)
    convert(root / "model_final.pt", root / "hf", shakespeare_bpe(4096))
    return root


def test_round_trip_through_the_auto_classes_gives_identical_logits(saved):
    """``import idmix.hf`` (this module's) then ``from_pretrained(dir)``: no remote code."""
    tokens = torch.randint(0, TOY["vocab_size"], (2, 11), generator=SEED(1))
    for family, (model, d) in saved.items():
        loaded = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=False)
        assert type(loaded) is IdmixForCausalLM, family
        with torch.no_grad():
            assert torch.equal(loaded(tokens).logits, model(tokens).logits), family


@pytest.mark.parametrize(
    ("builder", "overrides"),
    [("interdomain_125m", {}), ("selective_interdomain_1_3b", {}), ("softmax_350m", {}),
     ("ablation_125m", {"cell": "single_input_query"}),
     ("cpu_model", {"mixer": "s4d", "scale": "small"})],
)  # fmt: skip
def test_the_config_describes_the_paper_and_cpu_sizes(builder, overrides):
    """On the meta device (shapes only): the same parameters as the builder's own model."""
    import idmix.models

    with torch.device("meta"):
        hf = IdmixForCausalLM(IdmixConfig(builder=builder, overrides=overrides))
        own = getattr(idmix.models, builder)(**overrides)
    shapes = {k: v.shape for k, v in own.state_dict().items()}
    assert {k.removeprefix("model."): v.shape for k, v in hf.state_dict().items()} == shapes
    assert hf.config.hidden_size == own.tok_embeddings.embedding_dim
    if builder == "interdomain_125m":
        assert hf.num_parameters() == 135_416_208  # the paper's Table 3


def test_hf_export_is_a_boolean_pretraining_key():
    from omegaconf import OmegaConf

    from idmix.training.pretrain_config import check_pretrain_config

    cfg = OmegaConf.load(ROOT / "recipes" / "configs" / "tiny_interdomain.yaml")
    check_pretrain_config(cfg)  # absent: on
    cfg.hf_export = "yes"
    with pytest.raises(ValueError, match="hf_export: expected true or false"):
        check_pretrain_config(cfg)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_idmix_generate_on_a_ragged_batch(saved, family):
    model, _ = saved[family]
    prompts = [[5, 6, 7, 8, 9], [11, 12], [3, 1, 4, 1, 5, 9, 2]]
    expected = generate(model.model, prompts, 6, temperature=0)
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :], mask[i, P - len(p) :] = torch.tensor(p), 1
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert out[:, P:].tolist() == expected


def test_sampling_beams_and_returned_sequences_run(saved):
    model, _ = saved["interdomain"]
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    torch.manual_seed(0)
    sampled = model.generate(ids, max_new_tokens=5, do_sample=True, top_k=8, top_p=0.9,
                             num_return_sequences=2)  # fmt: skip
    beams = model.generate(ids, max_new_tokens=5, num_beams=3, do_sample=False)
    assert sampled.shape == (4, 8) and beams.shape == (2, 8)
    assert int(sampled.max()) < TOY["vocab_size"]


@pytest.mark.parametrize("family", ["interdomain", "softmax"])
def test_a_returned_cache_continues_the_sequence(saved, family):
    """prefix with use_cache, then the rest token by token on the cache = one forward."""
    model, _ = saved[family]
    tokens = torch.randint(
        0, TOY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        full = model(tokens).logits
        out = model(tokens[:, :7], use_cache=True)
        steps = [out.logits]
        for t in range(7, 12):
            out = model(tokens[:, t : t + 1], cache=out.cache)
            steps.append(out.logits)
    assert isinstance(out.cache, IdmixCache) and out.cache.get_seq_length() == 12
    # measured: max |Δ| ≤ 1.2e-7 at |logits| ≤ 0.4 (fp32 summation order of the two paths)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def planted(shakespeare_dir, tmp_path_factory):
    """(a copy of the hf/ directory with planted code and auto_maps, where that code would
    record having run)."""
    root = tmp_path_factory.mktemp("planted")
    d = Path(shutil.copytree(shakespeare_dir / "hf", root / "hf"))
    plant_code(d, root / "ran")
    return d, root / "ran"


@pytest.fixture(scope="module")
def cli_runs(shakespeare_dir, planted, tmp_path_factory):
    """The two command lines, started together (each on one core; most of their time is
    start-up): name -> a function returning that run's lm-eval results."""
    runs = {}
    for name, program, model, args, tasks in [
        ("hf", "idmix-lm-eval", "hf", f"pretrained={planted[0]}", TASKS),
        ("idmix", "idmix-lm-eval", "idmix", f"checkpoint={shakespeare_dir / 'model_final.pt'}",
         "shakespeare_next_line"),
    ]:  # fmt: skip
        out = tmp_path_factory.mktemp(f"cli_{name}")
        cmd = [str(BIN / program), "--model", model, "--model_args", args, "--tasks", tasks,
               "--include_path", "recipes/eval_tasks", "--limit", "2", "--batch_size", "1",
               "--device", "cpu", "--output_path", str(out / "out")]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(out), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        runs[name] = (proc, out)

    def results(name: str) -> dict:
        proc, out = runs[name]
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        (result,) = (out / "out").rglob("results_*.json")
        return json.loads(result.read_text())["results"]

    yield results
    for proc, _ in runs.values():
        proc.kill()
        proc.communicate()


def _assert_scores_equal(cli, checkpoint: Path, tasks: str) -> None:
    """cli()'s metrics against our lm-eval model "idmix" in process (batch size 1; scored
    while the command line still runs)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from idmix.evaluation.lm_eval_model import IdmixLM

    lm = IdmixLM(load_exported_model(checkpoint), shakespeare_bpe(4096), batch_size=1)
    manager = TaskManager(include_path=str(ROOT / "recipes" / "eval_tasks"))
    ours = simple_evaluate(model=lm, tasks=tasks.split(","), limit=2, task_manager=manager)
    cli = cli()
    for task, metrics in ours["results"].items():
        for name, value in metrics.items():
            if isinstance(value, float) and "stderr" not in name:
                # measured: identical (the same forward passes on the same tokens)
                assert cli[task][name] == pytest.approx(value, rel=1e-6), (task, name)


def test_labels_give_the_shifted_next_token_loss(saved):
    model, _ = saved["selective"]
    tokens = torch.randint(0, TOY["vocab_size"], (2, 9), generator=SEED(3))
    with torch.no_grad():
        out = model(tokens, labels=tokens)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()
    )
    torch.testing.assert_close(out.loss, expected)


def test_idmix_lm_eval_hf_scores_equal_the_in_process_scores(shakespeare_dir, planted, cli_runs):
    """`idmix-lm-eval --model hf --model_args pretrained=<dir> --include_path
    recipes/eval_tasks` (multiple choice, generation and rolling perplexity) on a directory
    with planted code: it loads with trust_remote_code=False and the code never runs."""
    _assert_scores_equal(lambda: cli_runs("hf"), shakespeare_dir / "model_final.pt", TASKS)
    assert not list(planted[1].iterdir())


def test_idmix_lm_eval_runs_the_idmix_model_from_the_shell(shakespeare_dir, cli_runs):
    """`idmix-lm-eval --model idmix --model_args checkpoint=…/model_final.pt`."""
    checkpoint = shakespeare_dir / "model_final.pt"
    _assert_scores_equal(lambda: cli_runs("idmix"), checkpoint, "shakespeare_next_line")


def test_the_saved_tokenizer_loads_with_auto_tokenizer(shakespeare_dir):
    ours, theirs = shakespeare_bpe(4096), AutoTokenizer.from_pretrained(shakespeare_dir / "hf")
    text = "ROMEO.\nBut soft, what light through yonder window breaks?\n\n"
    ids = ours.encode(text)
    assert theirs.encode(text) == ids and theirs.decode(ids) == ours.decode(ids)
    assert theirs.eos_token_id == theirs.pad_token_id == ours.eos_id


def test_convert_command_writes_a_directory_that_loads(shakespeare_dir, tmp_path):
    convert_main([str(shakespeare_dir / "model_final.pt"), str(tmp_path / "hf"),
                  "--tokenizer", "none"])  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ours = load_exported_model(shakespeare_dir / "model_final.pt")
    tokens = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, ours(tokens))
    with pytest.raises(ValueError, match="out_dir"):
        convert(shakespeare_dir / "model_final.pt", tmp_path / "hf")


class _Marker:
    """A pickle whose unpickling creates a file (what a crafted pytorch_model.bin can do)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_crafted_pickle_is_refused_not_run(saved, tmp_path):
    _, source = saved["interdomain"]
    marker, bad = tmp_path / "ran", tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((source / "config.json").read_text())
    (bad / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(marker)))
    for load in (IdmixForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=r"refusing \['pytorch_model.bin'\]"):
            load(bad)
    with pytest.raises(ValueError, match="use_safetensors"):
        IdmixForCausalLM.from_pretrained(source, use_safetensors=False)
    (bad / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    IdmixForCausalLM.from_pretrained(bad)  # beside safetensors the pickle is never read
    assert not marker.exists()
    pickle.loads((bad / "pytorch_model.bin").read_bytes())  # the pickle is live
    assert marker.exists()


def _edited(source: Path, dest: Path, edit) -> Path:
    dest.mkdir()
    for f in source.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    config = json.loads((dest / "config.json").read_text())
    edit(config)
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c["overrides"].update(mixer="nope"), "mixer"),
        (lambda c: c.update(builder="interdomain_huge"), "builder"),
        (lambda c: c.update(builder="os.system"), "builder"),
        (lambda c: c["overrides"].update(mixer={"_component_": "os.system"}), "mixer"),
        (lambda c: c["overrides"].update(embed_dim=64), "embed_dim"),
        (lambda c: c["overrides"].update(vocab_size=100), "vocab_size"),
        (lambda c: c["overrides"].update(num_layers=3), "num_layers"),
        (lambda c: c["overrides"].update(num_layers=10**8), "num_layers"),  # named before a build
        (lambda c: c["overrides"].update(num_modes=4), "num_modes"),
        (lambda c: c["overrides"].update(mixer="s4d"), "mixer"),
        (lambda c: c.update(hidden_size=64), "hidden_size"),
    ],
)
def test_a_config_that_does_not_fit_fails_naming_the_field(saved, tmp_path, edit, field):
    d = _edited(saved["interdomain"][1], tmp_path / "edited", edit)
    with pytest.raises(ValueError, match=rf"^{field}: "):
        AutoModelForCausalLM.from_pretrained(d)


def test_unknown_mixer_in_a_config_fails_naming_mixer(saved):
    with pytest.raises(ValueError, match="^mixer: "):
        IdmixConfig(overrides={"mixer": "nope"})
    d = saved["softmax"][1]
    assert isinstance(AutoConfig.from_pretrained(d), IdmixConfig)


def test_what_does_not_apply_is_refused_clearly(saved):
    model, _ = saved["interdomain"]
    ids = torch.tensor([[1, 2, 3]])
    for kwargs, name in [
        ({"past_key_values": DynamicCache()}, "past_key_values"),
        ({"cache": DynamicCache()}, "cache of type DynamicCache"),
        ({"output_attentions": True}, "output_attentions"),
        ({"output_hidden_states": True}, "output_hidden_states"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}: not supported"):
            model(ids, **kwargs)
    with pytest.raises(ValueError, match="^inputs_embeds: not supported"):
        model(inputs_embeds=torch.zeros(1, 3, TOY["embed_dim"]))
    cache = model(ids, use_cache=True).cache
    with pytest.raises(NotImplementedError, match="fixed-size recurrent state"):
        cache.crop(1)
    with pytest.raises(ValueError, match="stateful"):
        model.generate(ids, assistant_model=model, max_new_tokens=2)
