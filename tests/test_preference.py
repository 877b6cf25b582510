"""The preference task end to end: DPO on ORTModule resumes exactly after kill -9 (reading the
reference log-probs its first start cached), exports as a causal LM and generates with
``ortft predict``; ``backend.name: auto`` probes it; its reference log-probs are cached and
recomputed when the weights change; a bad pair is one line naming its file and row (exit 2)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_causal_lm, write_recipe
from helpers import losses, run_cli, start_cli

from ortft.core.errors import InputError
from ortft.families.preference.task import Options, PairRows

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def write_pairs(path: Path, n: int = 24) -> Path:
    """Number words to digits: chosen the right digits, rejected a near miss."""
    rows = []
    for i in range(n):
        k = (i * 37 + 11) % 100
        words = " ".join(DIGITS[int(d)] for d in str(k))
        rows.append(
            {"prompt": f"digits of {words}", "chosen": str(k), "rejected": str((k + 7) % 100)}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train(recipe: Path, run: Path, *overrides: str) -> dict:
    res = run_cli("train", str(recipe), *overrides, "--output-dir", str(run), "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("dpo")
    write_pairs(tmp / "pairs.jsonl")
    # 6 steps: a kill right after step 2's checkpoint leaves steps 3-6 to resume
    r = tiny_causal_lm("pairs.jsonl", backend="ort", max_steps=6, batch_size=4, eval_every=2)
    r["task"] = {"name": "preference", "loss": "dpo", "beta": 0.5}
    r["model"]["dropout"] = 0.1  # ORT's dropout stream must resume too
    r["data"].update(eval_fraction=0.25)
    r["checkpoint"] = {"save_every": 2}
    recipe = write_recipe(tmp / "dpo.yaml", r)
    summary = _train(recipe, tmp / "run")
    return recipe, tmp / "run", summary


@pytest.mark.ort
def test_dpo_on_ort_resumes_exactly_and_exports(dpo_run, tmp_path: Path) -> None:
    recipe, run, summary = dpo_run
    assert summary["backend"]["used"] == "ort" and not summary["backend"]["fallback"]
    share = summary["data"]["share_prefix"]
    assert share["on"] is True and share["why"] is None, share
    metrics = summary["metrics"]
    for name in ("rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin"):
        assert f"eval_{name}" in metrics, metrics
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert all(0 <= r["reward_accuracy"] <= 1 and "reward_margin" in r for r in train), train[0]
    weights = (run / "final" / "model.safetensors").read_bytes()
    assert (run / "onnx" / "model.onnx").exists()  # the causal LM's export
    export = json.loads((run / "onnx" / "export.json").read_text())
    assert export["kv_cache"] and export["generation"]["passed"] and export["passed"]
    (tmp_path / "prompts.txt").write_text("digits of four two\n")
    res = run_cli("predict", str(run / "onnx"), "--input", tmp_path / "prompts.txt", timeout=300)
    assert res.returncode == 0 and res.stdout.strip(), res.stderr[-2000:]
    # ortft eval on the export: the preference metrics, as training's last eval
    res = run_cli("eval", str(run / "onnx"), "--json", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    evaluated = json.loads(res.stdout)["metrics"]
    assert len(evaluated) == 5
    for name, value in evaluated.items():
        assert value == pytest.approx(metrics[f"eval_{name}"], abs=1e-5), name
    cut = tmp_path / "cut"
    with open(tmp_path / "cut.err", "w") as err:
        proc = start_cli("train", recipe, "-o", cut, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 300
    while not (cut / "step-000002" / "manifest.json").exists():
        assert proc.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.002)  # a step takes about 12 ms: the kill lands in step 3 or 4
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    res = run_cli("train", recipe, "-o", cut, "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = int(json.loads(res.stdout)["resumed_from"].rsplit("-", 1)[1])
    assert resumed in (2, 4), resumed  # 4 only if the kill came a step late
    # the reference is the start's, read back, never computed from the checkpoint's weights
    assert "reference log-probs: 18 train pairs (cache hit)" in res.stderr, res.stderr[-3000:]
    assert losses(cut, by_step=True, unique_steps=True) == losses(run, by_step=True)
    assert (cut / "final" / "model.safetensors").read_bytes() == weights  # dropout included


def test_auto_probes_the_preference_loss_and_trains(tmp_path: Path) -> None:
    """backend.name: auto times each route on the preference loss (computed outside the wrapped
    module, as the engine computes it) and trains with the one it picks. At step 1 the policy is
    the reference, so DPO's loss is ln 2 on whichever route."""
    write_pairs(tmp_path / "pairs.jsonl", 16)
    r = tiny_causal_lm("pairs.jsonl", backend="auto", max_steps=2, batch_size=4)
    r["task"] = {"name": "preference", "loss": "dpo"}
    r["precision"] = {"dtype": "fp32"}  # bf16 autocast would move ln 2 by rounding
    r["export"] = {"enabled": False}
    summary = _train(write_recipe(tmp_path / "r.yaml", r), tmp_path / "run")
    probe = summary["backend"]["probe"]
    assert probe["chosen"] == summary["backend"]["used"]
    timed = [b for b in probe["backends"].values() if "median_step_s" in b]
    assert timed and all(b["median_step_s"] > 0 for b in timed), probe
    assert losses(tmp_path / "run")[0] == pytest.approx(np.log(2), abs=1e-5)


def _pairs_and_model(tmp_path: Path, n: int, limit: int) -> tuple:
    """``n`` pairs encoded at ``limit`` tokens and a 1-layer GPT-2, with a tokenizer trained here."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    rows = [
        json.loads(line)
        for line in write_pairs(tmp_path / "p.jsonl", n).read_text().split("\n")
        if line
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(
        [" ".join(r.values()) for r in rows], trainers.BpeTrainer(vocab_size=100)
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="0", eos_token="0")
    encoded = PairRows(Options()).encode(rows, tokenizer, limit)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=len(tokenizer)))
    return encoded, model


def test_reference_is_cached_and_recomputed_when_the_weights_change(tmp_path, monkeypatch):
    import torch

    from ortft.families.preference import reference

    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))
    encoded, model = _pairs_and_model(tmp_path, 6, 24)
    first = reference.WithReference(encoded)
    assert not reference.fill(model, first, "train")  # computed
    again = reference.WithReference(encoded)
    assert reference.fill(model, again, "train")  # read back
    assert np.array_equal(first.reference, again.reference)
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 0.5  # another base model: same data, other weights
    changed = reference.WithReference(encoded)
    assert not reference.fill(model, changed, "train")
    assert not np.array_equal(changed.reference, first.reference)
    np.testing.assert_allclose(changed.reference, reference.compute(model, encoded), rtol=1e-6)


def test_another_attention_kernel_or_padding_computes_its_own_reference(tmp_path, monkeypatch):
    """Each moves the log-probs' last bits: a run never reads an entry that another attention
    kernel or padding computed, so its losses do not depend on which recipe filled the cache."""
    from ortft.data import tokenized
    from ortft.data.batches import Padding
    from ortft.families.preference import reference

    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))
    encoded, model = _pairs_and_model(tmp_path, 6, 24)
    model.set_attn_implementation("sdpa")
    sdpa = reference.WithReference(encoded)
    assert not reference.fill(model, sdpa, "train")
    model.set_attn_implementation("eager")
    eager = reference.WithReference(encoded)
    assert not reference.fill(model, eager, "train")  # its own entry, not sdpa's
    assert reference.fill(model, reference.WithReference(encoded), "train")
    longest = reference.WithReference(encoded, Padding("longest", 24, 8))
    assert not reference.fill(model, longest, "train")
    np.testing.assert_allclose(eager.reference, sdpa.reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(longest.reference, sdpa.reference, rtol=1e-5, atol=1e-5)
    entries = list((tmp_path / "cache" / "tokenized").glob(f"reference-*/{tokenized.META}"))
    kernels = {json.loads(e.read_text())["computed_with"].split("|")[0] for e in entries}
    assert len(entries) == 3 and kernels == {"sdpa", "eager"}, entries


def test_the_reference_pass_pads_as_training_does(tmp_path, monkeypatch):
    """Each chunk of pairs runs at its longest row rounded up to data.pad_to_multiple_of, not at
    data.max_length, and scores every pair as the full-length pass does."""
    from ortft.data.batches import Padding
    from ortft.families.preference import losses, reference

    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path / "cache"))
    encoded, model = _pairs_and_model(tmp_path, 12, 64)
    full = reference.compute(model, encoded)
    widths: list[int] = []
    scores = losses.preference_scores

    def spy(model, batch):
        widths.append(batch["input_ids"].shape[1])
        return scores(model, batch)

    monkeypatch.setattr(losses, "preference_scores", spy)
    split = reference.WithReference(encoded, Padding("longest", 64, 8))
    reference.fill(model, split, "train")
    longest = [int(encoded.arrays["_length"][i : i + 8].max()) for i in (0, 8)]
    assert widths == [-(-n // 8) * 8 for n in longest] and max(widths) < 64, (widths, longest)
    np.testing.assert_allclose(split.reference, full, rtol=1e-5, atol=1e-5)


def test_bad_pairs_are_one_line_naming_the_row() -> None:
    rows = PairRows(Options())
    with pytest.raises(InputError, match="row 1: chosen has an empty response"):
        rows.conversations({"prompt": "p", "chosen": " ", "rejected": "x"}, 0)
    conv = {
        "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        "rejected": [{"role": "user", "content": "z"}, {"role": "assistant", "content": "c"}],
    }
    with pytest.raises(InputError, match="row 3: chosen and rejected do not share"):
        rows.conversations(conv, 2)
    conv["rejected"][0]["content"] = "a"
    assert rows.conversations(conv, 0)[1][-1]["content"] == "c"


@pytest.mark.parametrize("eval_fraction", [0.0, 0.5])
def test_a_bad_pair_names_its_file_and_its_row_there(tmp_path: Path, eval_fraction: float) -> None:
    """The row is the file's, also where data.eval_fraction's shuffle split the rows (the train
    and eval splits number their rows in another order): the tokenizer's texts, a sample of
    them and the tokenized splits all report it so."""
    path = write_pairs(tmp_path / "pairs.jsonl", 12)
    lines = path.read_text().splitlines()
    same = json.loads(lines[5])
    same["rejected"] = same["chosen"]
    lines[5] = json.dumps(same)
    path.write_text("\n".join(lines) + "\n")
    r = tiny_causal_lm("pairs.jsonl", backend="torch")
    r["task"] = {"name": "preference"}
    r["data"]["eval_fraction"] = eval_fraction
    res = run_cli("train", str(write_recipe(tmp_path / "r.yaml", r)), "-o", str(tmp_path / "run"))
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line == "error: pairs.jsonl: row 6: chosen and rejected are the same response"


class _Tok:
    """Whitespace ids (one per character) and a chat template: enough to check the format."""

    pad_token_id, eos_token = 0, "<e>"
    chat_template = "x"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in msgs)
        return text + ("<assistant>" if add_generation_prompt else "")


def test_pairs_use_the_chat_template_and_learn_the_responses_only() -> None:
    row = {
        "chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "42"}],
        "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "7"}],
    }
    enc = PairRows(Options()).encode([row], _Tok(), 40).arrays
    prompt = "<user>hi</><assistant>"
    for prefix, response in (("", "42</>"), ("rejected_", "7</>")):
        n = len(prompt) + len(response)
        ids, labels = enc[f"{prefix}input_ids"][0], enc[f"{prefix}labels"][0]
        assert "".join(map(chr, ids[:n])) == prompt + response
        assert (labels[: len(prompt)] == -100).all() and (labels[n:] == -100).all()
        assert "".join(map(chr, labels[len(prompt) : n])) == response
    assert enc["_length"][0] == len(prompt) + 5  # the longer of the two: a cut keeps both


@pytest.mark.parametrize("truncation, kept", [("keep_end", "se:\n"), ("keep_start", "### ")])
def test_a_long_prompt_keeps_the_end_it_is_told(truncation: str, kept: str) -> None:
    options = Options(max_prompt_length=4, truncation=truncation, template="simple")
    row = {"prompt": "0123456789", "chosen": "a", "rejected": "b"}
    ids = PairRows(options).encode([row], _Tok(), 12).arrays["input_ids"][0]
    text = "".join(map(chr, ids[ids > 0]))
    assert text.startswith(kept) and text[4:] == "a<e>"
    with pytest.raises(InputError, match="row 1: no response token within data.max_length=4"):
        PairRows(options).encode([row], _Tok(), 4)


def test_reward_accuracy_counts_a_rounding_margin_as_a_tie() -> None:
    """Before training the policy is the reference: margins of rounding size score 0."""
    from ortft import tasks

    task = tasks.get("preference")
    rewards = np.array([[1e-7, -1e-7], [-2e-8, 0.0], [0.5, 0.1], [0.0, 0.3]])
    metrics = task.metrics(0.7, [rewards], [])
    assert metrics["reward_accuracy"] == 0.25 and metrics["loss"] == 0.7
    assert metrics["reward_margin"] == pytest.approx(float((rewards[:, 0] - rewards[:, 1]).mean()))
