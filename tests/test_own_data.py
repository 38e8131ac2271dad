"""Your own data and tokenizer from config alone: `text_corpus` over local text/json/csv/parquet
files, the deterministic validation carve-out, the corpus BPE's cache, `from_file`, and the
own-data configs through `tune run` (training on one process and on two local "nodes", then
the evaluation recipes on the result)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from idmix.io import tokenizer as tok
from idmix.io.corpus import held_out, text_corpus

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(Path(sys.executable).with_name("tune"))
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hum old tunes".split()
)


def paragraphs(n: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (n, 40), generator=g).tolist()
    return [
        " ".join(WORDS[i] for i in row[: 20 + k % 20]) + f" {k}." for k, row in enumerate(picks)
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The same 400 documents as text (blank-line paragraphs), json lines, csv and parquet."""
    d = tmp_path_factory.mktemp("own")
    docs = paragraphs(400)
    (d / "notes.txt").write_text("\n\n".join(docs) + "\n")
    (d / "notes.jsonl").write_text(
        "".join(json.dumps({"body": t, "n": i}) + "\n" for i, t in enumerate(docs))
    )
    table = datasets.Dataset.from_dict({"body": docs, "n": list(range(len(docs)))})
    table.to_csv(str(d / "notes.csv"), index=False)
    table.to_parquet(str(d / "notes.parquet"))
    (d / "blank.txt").write_text("\n\n  \n")
    return {"docs": docs, **{p.suffix[1:]: p for p in d.iterdir()}, "blank": d / "blank.txt"}


@pytest.mark.parametrize(
    "source, suffix, extra",
    [("text", "txt", {"sample_by": "paragraph"}), ("json", "jsonl", {"column": "body"}),
     ("csv", "csv", {"column": "body"}), ("parquet", "parquet", {"column": "body"})],
)  # fmt: skip
def test_every_local_format_gives_the_same_documents(files, source, suffix, extra):
    ds = text_corpus(source, data_files=str(files[suffix]), **extra)
    assert ds.column_names == ["text"]
    assert [t.strip() for t in ds["text"]] == files["docs"]


def test_text_lines_drop_blank_documents(files):
    assert list(text_corpus("text", data_files=str(files["txt"]))["text"]) == files["docs"]


def test_globs_lists_and_streaming(files):
    folder = files["txt"].parent
    both = text_corpus("json", data_files=[str(files["jsonl"])] * 2, column="body")
    assert len(both) == 800
    globbed = text_corpus("parquet", data_files=str(folder / "*.parquet"), column="body")
    assert len(globbed) == 400
    stream = text_corpus("json", data_files=str(files["jsonl"]), column="body", streaming=True)
    assert isinstance(stream, datasets.IterableDataset)
    assert [r["text"] for r in stream.take(3)] == files["docs"][:3]


def test_a_saved_dataset_directory(files, tmp_path):
    datasets.Dataset.from_dict({"body": files["docs"]}).save_to_disk(str(tmp_path / "saved"))
    assert list(text_corpus(str(tmp_path / "saved"), column="body")["text"]) == files["docs"]


@pytest.mark.parametrize("fraction", [0.05, 0.3])
def test_validation_carve_out_is_deterministic_disjoint_and_complete(files, fraction):
    kw = dict(data_files=str(files["jsonl"]), column="body", validation_fraction=fraction)
    train = list(text_corpus("json", split="train", **kw)["text"])
    val = list(text_corpus("json", split="validation", **kw)["text"])
    assert not set(train) & set(val) and sorted(train + val) == sorted(files["docs"])
    assert abs(len(val) / 400 - fraction) < 0.06
    assert list(text_corpus("json", split="validation", **kw)["text"]) == val
    other_seed = list(text_corpus("json", split="validation", seed=1, **kw)["text"])
    assert other_seed != val


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=200), fraction=st.floats(0.01, 0.99), seed=st.integers(0, 99))
def test_held_out_is_a_fixed_function_of_the_document(text, fraction, seed):
    assert held_out(text, fraction, seed) == held_out(text, fraction, seed)
    assert held_out(text, fraction, seed) <= held_out(text, min(0.999, fraction + 0.3), seed)


@pytest.mark.parametrize(
    "source, kwargs, error, message",
    [
        ("text", {"data_files": "nope/*.txt"}, FileNotFoundError, "data_files: no file matches"),
        ("text", {}, ValueError, "data_files: the 'text' builder needs files"),
        ("json", {"data_files": "{jsonl}"}, ValueError, "column: 'text' not in .*columns: \\['body', 'n'\\]"),
        ("json", {"data_files": "{jsonl}", "column": "n"}, ValueError, "column: 'n' .* not text"),
        ("text", {"data_files": "{blank}"}, ValueError, "has no non-empty documents"),
        ("json", {"data_files": "{jsonl}", "column": "body", "validation_fraction": 1.5}, ValueError, "validation_fraction: expected a number in \\(0, 1\\)"),
        ("json", {"data_files": "{jsonl}", "column": "body", "split": "validation"}, ValueError, "split: 'validation' is not a split"),
        ("json", {"data_files": "{jsonl}", "sample_by": "paragraph"}, ValueError, "sample_by: expected one of"),
        ("./missing_dir", {}, FileNotFoundError, "source: no such file or directory"),
    ],
)  # fmt: skip
def test_bad_input_is_named(files, source, kwargs, error, message):
    kwargs = {k: v.format(**files) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(error, match=message):
        text_corpus(source, **kwargs)


def test_corpus_bpe_is_cached_and_retrained_when_the_text_changes(files, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(files["txt"].read_text())
    kw = dict(data_files=str(notes), sample_by="paragraph", cache_dir=str(tmp_path / "cache"))
    first = tok.bpe_for_corpus(300, "text", **kw)
    (cached,) = (tmp_path / "cache").iterdir()
    stamp = cached.stat().st_mtime_ns
    again = tok.bpe_for_corpus(300, "text", **kw)
    assert cached.stat().st_mtime_ns == stamp and len(list((tmp_path / "cache").iterdir())) == 1
    text = "the lazy wizards hum 7."
    assert again.encode(text) == first.encode(text) and first.decode(first.encode(text)) == text
    notes.write_text(notes.read_text() + "\n\nan entirely new paragraph about zebras.\n")
    tok.bpe_for_corpus(300, "text", **kw)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    tok.bpe_for_corpus(320, "text", **kw)
    assert len(list((tmp_path / "cache").iterdir())) == 3
    capped = tok.bpe_for_corpus(300, "text", max_documents=50, **kw)
    assert capped.vocab_size <= 300 and len(list((tmp_path / "cache").iterdir())) == 4


def test_from_file_finds_or_takes_the_end_of_document_token(files, tmp_path):
    bpe = tok.bpe_for_corpus(300, "text", data_files=str(files["txt"]), cache_dir=str(tmp_path))
    (path,) = tmp_path.iterdir()
    loaded = tok.from_file(str(path))
    assert loaded.eos_id == bpe.eos_id and loaded.vocab_size == bpe.vocab_size
    assert loaded.encode_batch(["a lazy dog"]) == [bpe.encode("a lazy dog")]
    from tokenizers import Tokenizer, models

    plain = Tokenizer(models.WordLevel({"a": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    plain.save(str(tmp_path / "plain.json"))
    assert tok.from_file(str(tmp_path / "plain.json")).eos_id == 1
    assert tok.from_file(str(tmp_path / "plain.json"), eos_token="a").eos_id == 0
    with pytest.raises(ValueError, match="eos_token: 'zzz' is not a token"):
        tok.from_file(str(tmp_path / "plain.json"), eos_token="zzz")
    with pytest.raises(FileNotFoundError, match="tokenizer path: no such file"):
        tok.from_file(str(tmp_path / "none.json"))
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a tokenizers JSON file"):
        tok.from_file(str(tmp_path / "junk.json"))


# tune run ---------------------------------------------------------------------------------------
QUICK = ["max_steps=3", "seq_len=64", "batch_size=2", "warmup_steps=1", "eval_every_n_steps=3",
         "eval_batches=1", "save_every_n_steps=3", "tokenizer.vocab_size=320"]  # fmt: skip


def tune(*args, env_cache: Path, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "IDMIX_CACHE": str(env_cache)}
    return subprocess.run([TUNE, "run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


def train(run: Path, data: list[str], cache: Path, launch=(), check=True):
    out = tune(*launch, "recipes/pretrain_interdomain.py", "--config",
               "recipes/configs/tiny_own_data.yaml", *data, f"output_dir={run}", *QUICK,
               env_cache=cache)  # fmt: skip
    if check:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory) -> tuple[Path, Path]:
    """The README's command on a local text file: (run dir, tokenizer cache)."""
    tmp = tmp_path_factory.mktemp("trained")
    train(tmp / "run", [f"dataset.data_files={files['txt']}"], tmp / "cache")
    return tmp / "run", tmp / "cache"


def test_readme_command_trains_and_the_model_vocabulary_follows_the_tokenizer(trained):
    run, cache = trained
    history = json.loads((run / "history.json").read_text())
    assert len(history) == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    final = torch.load(run / "model_final.pt", weights_only=True)
    assert final["model"]["output.weight"].shape[0] == 320
    assert len(list(cache.iterdir())) == 1  # the BPE trained once, on the train side


@pytest.mark.parametrize(
    "data",
    [["dataset.source=json", "dataset.column=body", "dataset.sample_by=null"],
     ["dataset.source=parquet", "dataset.column=body", "dataset.sample_by=null"]],
)  # fmt: skip
def test_json_and_parquet_files_train(files, tmp_path, data):
    suffix = "jsonl" if "json" in data[0] else "parquet"
    train(tmp_path / "run", [*data, f"dataset.data_files={files[suffix]}"], tmp_path / "cache")
    assert (tmp_path / "run" / "model_final.pt").is_file()


def test_missing_data_files_is_named(tmp_path):
    out = train(tmp_path / "run", [], tmp_path / "cache", check=False)
    assert (
        out.returncode != 0
        and "data_files" in out.stderr
        and "Missing mandatory value" in out.stderr
    )


def test_two_local_nodes_with_a_rendezvous_endpoint(files, tmp_path):
    """The documented multi-node line, as two 'nodes' of one process each on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
              "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "idmix-test"]  # fmt: skip
    args = [*launch, "recipes/pretrain_interdomain.py", "--config",
            "recipes/configs/tiny_own_data.yaml", f"dataset.data_files={files['txt']}",
            f"output_dir={tmp_path / 'run'}", *QUICK]  # fmt: skip
    env = {**os.environ, "IDMIX_CACHE": str(tmp_path / "cache")}
    nodes = [subprocess.Popen([TUNE, "run", *args], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]  # fmt: skip
    outs = [n.communicate(timeout=600) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(o[1][-2000:] for o in outs)
    assert any("world 2" in o[0] for o in outs)
    assert len(json.loads((tmp_path / "run" / "history.json").read_text())) == 3


def test_evaluation_recipes_take_the_same_corpus_and_tokenizer(trained, files, tmp_path):
    run, cache = trained
    data = f"dataset.data_files={files['txt']}"
    ckpt = run / "model_final.pt"
    out = tune("recipes/evaluate.py", "--config", "recipes/configs/eval_own_data.yaml",
               f"checkpoint={ckpt}", f"perplexity_dataset.data_files={files['txt']}",
               "tokenizer.vocab_size=320", f"output_dir={tmp_path / 'eval'}", env_cache=cache)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert results["corpus_perplexity"]["word_perplexity,none"] > 1
    out = tune("recipes/length_extrapolation.py", "--config",
               "recipes/configs/length_extrapolation_own_data.yaml", data,
               f"checkpoints={{interdomain: {ckpt}}}", "tokenizer.vocab_size=320", "train_seq_len=64",
               "multiples=[1,2]", "num_tokens=256", f"output_dir={tmp_path / 'le'}", env_cache=cache)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert set(
        json.loads((tmp_path / "le" / "length_extrapolation.json").read_text())["perplexity"]
    ) == {"interdomain"}
    out = tune("recipes/quantize_interdomain.py", "--config", "recipes/configs/quantize_own_data.yaml",
               data, f"checkpoint={ckpt}", "tokenizer.vocab_size=320", "seq_len=64", "eval_tokens=256",
               "prompt_len=8", "new_tokens=4", "aoti=false", f"output_dir={tmp_path / 'q'}",
               # one mode is enough for the corpus and tokenizer: every mode, the ExecuTorch
               # lowering included, runs in test_eval_recipes.py::test_quantize_recipe
               "modes=[int8_weight_only]", "executorch=false", env_cache=cache)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list(cache.iterdir())) == 1  # every recipe reused the training run's BPE


@pytest.mark.parametrize(
    "content, message",
    [(b"", "is empty"), (b"\xff\xfe\x00binary" * 50, "is not UTF-8 text"),
     (b"text\x00with a NUL", "is not text \\(it holds NUL bytes\\)")],
)  # fmt: skip
def test_an_empty_or_binary_text_file_is_named(tmp_path, content, message):
    from idmix.io.corpus import text_corpus

    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"data_files: '.*notes.txt' {message}"):
        text_corpus("text", data_files=str(path))


def test_an_unreadable_json_file_is_named(tmp_path):
    from idmix.io.corpus import text_corpus

    path = tmp_path / "rows.json"
    path.write_text('{"text": 1\n')
    with pytest.raises(ValueError, match=r"data_files: the 'json' builder could not read"):
        text_corpus("json", data_files=str(path))
