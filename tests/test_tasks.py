"""The newer tasks (token classification, masked LM, seq2seq, QA, instruction) and LoRA.

Unit tests of each task's encoding and metrics, then tiny end-to-end runs through the CLI in a
subprocess on both backends (ORTModule needs real stdout/stderr file descriptors).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DEFAULT_BACKEND, write_classification_csv, write_recipe
from helpers import losses, run_cli

from ortft import tasks
from ortft.recipe.schema import DataSection, Recipe

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "recipes" / "data"


def cli(*args: str) -> tuple[int, str, str]:
    res = run_cli(*args, env={"NO_COLOR": "1"}, timeout=600)
    return res.returncode, res.stdout, res.stderr


def tiny(task: dict, data: dict, arch: str, tokenizer: str, **extra: object) -> dict:
    return {
        "model": {
            "from_config": {
                "architecture": arch,
                "hidden_size": 32,
                "num_layers": 2,
                "num_heads": 2,
            },
            "tokenizer": {"train": {"kind": tokenizer, "vocab_size": 300, "min_frequency": 1}},
            "dropout": 0.0,
        },
        "task": task,
        "data": {"max_train_samples": 64, "max_eval_samples": 16, **data},
        "training": {"max_steps": 3, "batch_size": 8, "lr": 1e-3, "log_every": 1},
        **extra,
    }


RECIPES = {
    "token-classification": lambda: tiny(
        {"name": "token-classification"},
        {
            "train": str(DATA / "ner-train.jsonl"),
            "eval": str(DATA / "ner-eval.jsonl"),
            "max_length": 24,
        },
        "bert",
        "wordpiece",
    ),
    "masked-lm": lambda: tiny(
        {"name": "masked-lm", "mlm_probability": 0.3},
        {
            "train": str(DATA / "qa-train.jsonl"),
            "text_column": "context",
            "eval_fraction": 0.2,
            "max_length": 32,
        },
        "bert",
        "wordpiece",
    ),
    "seq2seq": lambda: tiny(
        {"name": "seq2seq", "max_target_length": 8, "generate_samples": 4},
        {
            "train": str(DATA / "numbers-train.jsonl"),
            "eval": str(DATA / "numbers-eval.jsonl"),
            "max_length": 16,
        },
        "t5",
        "wordpiece",
    ),
    "question-answering": lambda: tiny(
        {"name": "question-answering"},
        {
            "train": str(DATA / "qa-train.jsonl"),
            "eval": str(DATA / "qa-eval.jsonl"),
            "max_length": 64,
        },
        "bert",
        "wordpiece",
    ),
    "instruction": lambda: tiny(
        {"name": "instruction"},
        {
            "train": str(DATA / "instructions-train.jsonl"),
            "eval": str(DATA / "instructions-eval.jsonl"),
            "max_length": 48,
        },
        "gpt2",
        "byte-bpe",
    ),
}


def _tokenizer(kind: str, texts: list[str]):
    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.schema import TrainTokenizer

    return train_tokenizer(
        texts,
        TrainTokenizer(kind=kind, vocab_size=200 if kind == "wordpiece" else 500, min_frequency=1),
    )


# --------------------------------------------------------------------------- unit


def test_token_classification_labels_first_subtoken_only() -> None:
    task = tasks.get("token-classification")
    rows = [{"tokens": ["Zanzibarians", "visit", "Oslo"], "tags": ["B-PER", "O", "B-LOC"]}]
    tok = _tokenizer("wordpiece", ["visit oslo", "zanzibar", "ians"])
    names = task.label_names(rows, DataSection(train="x"))
    enc = task.encode(
        rows, tok, DataSection(train="x", max_length=16), {n: i for i, n in enumerate(names)}
    )
    ids, labels = enc.arrays["input_ids"][0], enc.arrays["labels"][0]
    words = tok(["Zanzibarians", "visit", "Oslo"], is_split_into_words=True).word_ids()
    assert words.count(0) > 1  # the first word is split into several sub-tokens
    labelled = [names[x] for x in labels if x != -100]
    assert labelled == ["B-PER", "O", "B-LOC"]  # one label per word, on its first sub-token
    assert labels[0] == -100 and len(ids) == 16  # [CLS] unlabelled, fixed length


def test_entity_f1_counts_exact_spans() -> None:
    """Entity precision / recall / F1 are seqeval's (default mode: a stray I-X starts an entity)."""
    task = tasks.get("token-classification")
    task.id2label = ["B-PER", "I-PER", "O", "B-LOC", "I-ORG"]
    stray = task.metrics(0.0, [np.eye(5)[[0, 1, 2, 3, 2]][None]], [np.array([[0, 1, 2, 3, 4]])])
    # the stray I-ORG is a gold entity: 2 of 3 found, both predictions right
    assert (stray["precision"], stray["recall"]) == (1.0, pytest.approx(2 / 3))
    assert stray["f1"] == pytest.approx(2 * 2 / (3 + 2))
    task.id2label = ["B-PER", "I-PER", "O"]
    gold = np.array([[0, 1, 2, -100]])
    perfect = np.eye(3)[[0, 1, 2, 2]][None]
    wrong_end = np.eye(3)[[0, 2, 2, 2]][None]
    assert task.metrics(0.0, [perfect], [gold])["f1"] == 1.0
    assert task.metrics(0.0, [wrong_end], [gold])["f1"] == 0.0  # a partial span is a miss
    assert task.metrics(0.0, [wrong_end], [gold])["accuracy"] == pytest.approx(2 / 3)
    m = task.metrics(0.0, [np.eye(3)[[0, 1, 2, 0]][None]], [np.array([[0, 1, 2, 0]])])
    assert (m["precision"], m["recall"], m["f1"]) == (1.0, 1.0, 1.0)
    task.id2label = ["NOUN", "VERB", "DET"]  # not BIO: no entities, f1 is the macro-F1 over tags
    m = task.metrics(0.0, [wrong_end], [gold])
    assert m["f1"] == m["f1_macro"] and "precision" not in m


def test_masked_lm_masking_is_seeded_per_epoch_and_80_10_10() -> None:
    task = tasks.get("masked-lm", tasks.options("masked-lm", mlm_probability=0.5))
    tok = _tokenizer("wordpiece", ["the cat sat on a mat while dogs ran"] * 4)
    rows = [{"text": "the cat sat on a mat while dogs ran " * 6}] * 8
    enc = task.encode(rows, tok, DataSection(train="x", max_length=64), None)
    batch = enc.take(np.arange(8))
    a, b = task.collate(batch, 0, 1), task.collate(batch, 0, 1)
    assert np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(
        a["labels"], b["labels"]
    )
    assert not np.array_equal(
        a["labels"], task.collate(batch, 1, 1)["labels"]
    )  # a new epoch: new masking
    picked = a["labels"] != -100
    assert np.all(enc.arrays["labels"][picked] != -100)  # never special tokens or padding
    assert 0.4 < picked.sum() / (enc.arrays["labels"] != -100).sum() < 0.6
    masked = a["input_ids"][picked] == tok.mask_token_id
    assert 0.7 < masked.mean() < 0.9
    assert np.array_equal(a["input_ids"][~picked], batch["input_ids"][~picked])


def test_question_answering_offsets_map_to_the_answer() -> None:
    task = tasks.get("question-answering")
    rows = [json.loads(x) for x in (DATA / "qa-eval.jsonl").read_text().splitlines()[:10]]
    tok = _tokenizer("wordpiece", [f"{r['question']} {r['context']}" for r in rows])
    enc = task.encode(rows, tok, DataSection(train="x", max_length=64), None)
    for row, ids, (s, e) in zip(rows, enc.arrays["input_ids"], enc.arrays["labels"], strict=False):
        assert tok.decode(ids[s : e + 1]).replace(" ", "") == row["answer_text"].lower().replace(
            " ", ""
        )
    # the metrics read the span's text from the context: SQuAD v1.1 EM / F1 after normalization
    first = enc.take(np.arange(1))  # "... Northwind Labs in 2000. The company ..."; answer "2000"
    s, e = first["labels"][0]

    def scores(start: int, end: int) -> dict[str, float]:
        logits = np.zeros((1, 2, 64))
        logits[0, 0, start], logits[0, 1, end] = 9, 9
        return task.metrics(0.0, [logits], [task.metric_labels(first, 1)])

    assert scores(s, e) == {"loss": 0.0, "exact_match": 1.0, "f1": 1.0}
    assert scores(s, e + 1)["exact_match"] == 1.0  # "2000." normalizes to "2000"
    wider = scores(s - 1, e)  # "in 2000": one extra word
    assert wider["exact_match"] == 0.0 and wider["f1"] == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert scores(1, 2)["exact_match"] == 0.0  # a span in the question is never picked


def test_squad_v11_normalization_and_scores() -> None:
    """The official SQuAD v1.1 script's normalize_answer / exact_match_score / f1_score."""
    from ortft.tasks.squad import exact_match, f1, normalize_answer

    assert normalize_answer("The Denver Broncos") == "denver broncos"
    assert normalize_answer("  A  cat, an apple;\tthe END.  ") == "cat apple end"
    assert normalize_answer("theater Anna anthem") == "theater anna anthem"  # whole words only
    assert (
        normalize_answer("New-York's $1,000") == "newyorks 1000"
    )  # punctuation dropped, not split
    assert normalize_answer("\u00abOslo\u00bb") == "\u00aboslo\u00bb"  # only ASCII punctuation
    assert exact_match("Denver Broncos", "the Denver Broncos.") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    # words [cat sat on mat] vs [cat on mat]: precision 3/4, recall 1
    assert f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)
    assert f1("cat cat", "cat") == pytest.approx(2 * 0.5 / 1.5)  # a multiset: one cat shared
    assert f1("", "Oslo") == 0.0 and f1("the", "a") == 0.0  # v1.1: nothing shared is 0
    assert exact_match("the", "a") == 1.0  # both normalize to ""


def test_instruction_masks_prompts_and_packs_whole_examples() -> None:
    task = tasks.get("instruction")
    rows = [{"prompt": f"Add {i} and 2.", "response": f"{i} plus 2 is {i + 2}."} for i in range(12)]
    rows.append(
        {
            "messages": [
                {"role": "user", "content": "Is 3 larger than 2?"},
                {"role": "assistant", "content": "Yes."},
            ]
        }
    )
    tok = _tokenizer("byte-bpe", task.texts(rows, DataSection(train="x")))
    single = task.encode(rows, tok, DataSection(train="x", max_length=96, packing=False), None)
    text = tok.decode(single.arrays["input_ids"][0][single.arrays["attention_mask"][0] == 1])
    assert text.startswith("### Instruction:\nAdd 0 and 2.\n\n### Response:\n")
    learned = tok.decode([t for t in single.arrays["labels"][0] if t != -100])
    assert learned == "0 plus 2 is 2." + tok.eos_token  # only the response (and EOS) is learned
    packed = task.encode(rows, tok, DataSection(train="x", max_length=96, packing=True), None)
    assert len(packed) < len(single)
    # every example is in exactly one block, whole: the learned tokens are all there, in order
    per_example = [[t for t in row if t != -100] for row in single.arrays["labels"]]
    per_block = [t for row in packed.arrays["labels"] for t in row if t != -100]
    assert sum(len(x) for x in per_example) == len(per_block)
    for row in packed.arrays["input_ids"]:
        starts = tok.decode(row).count("### Instruction:") + tok.decode(row).count("### User:")
        assert (
            tok.decode(row).count(tok.eos_token) >= starts
        )  # each started example ends in the block


def test_instruction_reads_the_columns_its_options_name(tmp_path: Path) -> None:
    """task.prompt_column / response_column / messages_column, from a recipe through the jsonl
    reader (which stores only the columns the task names) to the learned tokens."""
    from ortft.data.rows import read_rows

    chat = [{"role": "user", "content": "Is 3 odd?"}, {"role": "assistant", "content": "Yes."}]
    lines = [{"question": "Add 1 and 2.", "answer": "1 plus 2 is 3."}, {"chat": chat}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    recipe = Recipe.model_validate(
        {
            "model": {"name_or_path": "x"},
            "task": {
                "name": "instruction",
                "prompt_column": "question",
                "response_column": "answer",
                "messages_column": "chat",
            },
            "data": {"train": "d.jsonl", "max_length": 64, "packing": False},
        }
    )
    task = tasks.get(recipe.task.name, recipe.task)
    rows = list(read_rows(recipe.data, tmp_path, "d.jsonl", "train", task))
    tok = _tokenizer("byte-bpe", task.texts(rows, recipe.data))
    enc = task.encode(rows, tok, recipe.data, None)
    text = tok.decode(enc.arrays["input_ids"][0][enc.arrays["attention_mask"][0] == 1])
    assert text.startswith("### Instruction:\nAdd 1 and 2.\n\n### Response:\n")
    learned = [tok.decode([t for t in row if t != -100]) for row in enc.arrays["labels"]]
    assert learned == [r + tok.eos_token for r in ("1 plus 2 is 3.", "Yes.")]


def test_token_f1() -> None:
    from ortft.families.generation.seq2seq import token_f1

    assert token_f1("7 3 1", "7 3 1") == 1.0
    assert token_f1("7 3", "7 3 1") == pytest.approx(0.8)
    assert token_f1("", "1") == 0.0


def test_task_options_belong_to_their_task() -> None:
    base = RECIPES["token-classification"]()
    Recipe.model_validate(base)
    bad = {**base, "task": {"name": "token-classification", "mlm_probability": 0.2}}
    with pytest.raises(ValueError, match="task.mlm_probability is an option of masked-lm"):
        Recipe.model_validate(bad)
    t5_cls = {
        **base,
        "model": {**base["model"], "from_config": {"architecture": "t5", "hidden_size": 32}},
    }
    with pytest.raises(ValueError, match="t5 is an encoder-decoder, which fits only seq2seq"):
        Recipe.model_validate(t5_cls)
    lora_auto = {**base, "adapter": {"kind": "lora"}, "backend": {"name": "auto"}}
    with pytest.raises(ValueError, match="backend.name=auto"):
        Recipe.model_validate(lora_auto)


def test_shipped_task_recipes_validate() -> None:
    names = [
        "token-classification",
        "masked-lm",
        "seq2seq",
        "question-answering",
        "instruction",
        "lora",
    ]
    code, out, err = cli("validate", *[str(ROOT / "recipes" / f"{n}.yaml") for n in names])
    assert code == 0, err
    for n in names:
        first = (ROOT / "recipes" / f"{n}.yaml").read_text().splitlines()[:4]
        assert any(f"ortft train recipes/{n}.yaml" in line for line in first)


# --------------------------------------------------------------------------- end to end


@pytest.mark.ort
@pytest.mark.parametrize("name", list(RECIPES))
def test_task_trains_on_both_backends(name: str, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPES[name]())
    runs = {}
    for backend in ("torch", "ort"):
        run = tmp_path / backend
        code, _, err = cli("train", str(recipe), f"backend.name={backend}", "-o", str(run))
        assert code == 0, err[-3000:]
        runs[backend] = json.loads((run / "summary.json").read_text())
        assert (
            runs[backend]["backend"]["used"] == backend and not runs[backend]["backend"]["fallback"]
        )
    assert losses(tmp_path / "ort") == pytest.approx(losses(tmp_path / "torch"), rel=1e-4)
    s = runs["ort"]
    assert s["backend"]["ort_exports"] >= 1
    for metric in (
        "eval_loss",
        *{
            "token-classification": ["eval_accuracy", "eval_f1"],
            "masked-lm": ["eval_perplexity"],
            "instruction": ["eval_perplexity"],
            "seq2seq": ["eval_exact_match", "eval_token_f1"],
            "question-answering": ["eval_exact_match", "eval_f1"],
        }[name],
    ):
        assert metric in s["metrics"]
    assert s["export"]["parity"]["passed"]
    if name in ("seq2seq", "instruction"):  # the KV cache's steps against generate
        assert s["export"]["generation"]["passed"]


def test_lora_trains_only_the_adapter_and_exports_merged(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    recipe = RECIPES["question-answering"]()
    recipe["task"] = "sequence-classification"
    write_classification_csv(tmp_path / "train.csv", n=80)
    recipe["data"] = {"train": "train.csv", "eval_fraction": 0.2, "max_length": 16}
    recipe["adapter"] = {
        "kind": "lora",
        "rank": 4,
        "alpha": 8,
        "target_modules": ["query", "value"],
        "train_head": False,
    }
    recipe["checkpoint"] = {"save_every": 3}
    recipe["training"]["lr"] = 1e-2
    path = write_recipe(tmp_path / "lora.yaml", recipe)
    for backend in dict.fromkeys(("torch", DEFAULT_BACKEND)):  # torch once where it is both
        code, _, err = cli(
            "train", str(path), f"backend.name={backend}", "-o", str(tmp_path / backend)
        )
        assert code == 0, err[-3000:]
    if DEFAULT_BACKEND == "ort":  # the adapter trains on ORT as on torch
        assert losses(tmp_path / "ort") == pytest.approx(losses(tmp_path / "torch"), rel=1e-4)
    run = tmp_path / DEFAULT_BACKEND
    # checkpoints hold the adapter only
    ckpt = load_file(str(run / "step-000003" / "adapter.safetensors"))
    assert ckpt and all("lora_" in k for k in ckpt)
    assert not (run / "step-000003" / "model.safetensors").exists()
    # the base weights are the untouched initial ones (from_config is seeded)
    from transformers import AutoTokenizer

    from ortft.backends.torch import models
    from ortft.recipe import io as recipe_io

    loaded = recipe_io.load(path)
    tok = AutoTokenizer.from_pretrained(run / "tokenizer")
    labels = json.loads((run / "final" / "config.json").read_text())["id2label"]
    fresh = models.build_model(
        loaded,
        "AutoModelForSequenceClassification",
        tok,
        [labels[str(i)] for i in range(len(labels))],
        attn="eager",
    ).state_dict()
    final = load_file(str(run / "final" / "model.safetensors"))
    assert set(final) == set(fresh)
    for k, v in final.items():
        assert torch.equal(v, fresh[k]), k
    assert (run / "final" / "adapter" / "adapter_config.json").exists()
    # the train-time ONNX export is of the merged model: it matches the adapted model
    import onnxruntime as ort
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    base = AutoModelForSequenceClassification.from_pretrained(
        run / "final", attn_implementation="eager"
    ).eval()
    enc = tok(
        ["great fun movie indeed", "terrible plot"],
        padding="max_length",
        max_length=16,
        return_tensors="np",
    )
    feeds = {k: torch.from_numpy(enc[k]) for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        plain = base(**feeds).logits.numpy()
        adapted = PeftModel.from_pretrained(base, str(run / "final" / "adapter")).eval()
        want = adapted(**feeds).logits.numpy()
    assert np.abs(want - plain).max() > 1e-6  # the adapter changed the outputs
    # (the torch run's: an export from a process that ran ORTModule holds ATen nodes that only
    # that process can run; see the report)
    sess = ort.InferenceSession(
        str(tmp_path / "torch" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    got = sess.run(
        ["logits"],
        {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
        },
    )[0]
    assert np.abs(got - want).max() < 1e-4
    # ortft export: refuses an adapter run without --merge-adapters, merges with it
    code, _, err = cli("export", str(run), "-o", str(tmp_path / "x"))
    assert code == 2 and "--merge-adapters" in err
    code, out, err = cli(
        "export", str(run), "--merge-adapters", "-o", str(tmp_path / "merged"), "--json"
    )
    assert code == 0, err[-3000:]
    sess = ort.InferenceSession(
        str(tmp_path / "merged" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    got = sess.run(
        ["logits"],
        {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
        },
    )[0]
    assert np.abs(got - want).max() < 1e-4


def test_lora_target_modules_must_exist(tmp_path: Path) -> None:
    recipe = RECIPES["token-classification"]()
    recipe["adapter"] = {"kind": "lora", "target_modules": ["q_proj"]}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    code, _, err = cli("train", str(path), "backend.name=torch", "-o", str(tmp_path / "run"))
    assert code == 2 and "q_proj matches no module" in err
