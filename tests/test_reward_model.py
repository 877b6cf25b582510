"""The reward-model task end to end on a tiny GPT-2: trains through ORTModule (no fallback),
exports a parity-checked graph of one ``logits`` output of width 1 that ``ortft predict`` and
``ortft eval`` read; killed with kill -9, resumes exactly; its LoRA model is peft's sequence
classifier, whose head trains."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_causal_lm, write_recipe
from helpers import losses, run_cli, start_cli, summary

from ortft.core.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "recipes" / "data"
STEPS = 24


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("reward")
    r = tiny_causal_lm(str(DATA / "preference-train.jsonl"), backend="ort", max_steps=STEPS)
    r["task"] = {"name": "reward-model"}
    r["model"]["dropout"] = 0.1  # ORT's dropout stream must resume too
    r["data"].update(eval=str(DATA / "preference-eval.jsonl"), max_length=48)
    r["training"].update(eval_every=STEPS, lr=3e-3)
    r["checkpoint"] = {"save_every": 4, "keep_last": STEPS // 4}
    recipe = write_recipe(tmp / "reward.yaml", r)
    res = run_cli("train", recipe, "--output-dir", tmp / "run", "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return recipe, tmp / "run", json.loads(res.stdout)


@pytest.mark.ort
def test_reward_model_trains_on_ort_and_its_export_scores(reward_run, tmp_path: Path) -> None:
    import onnxruntime as ort

    from ortft.inference import evaluate, predict

    _, run, result = reward_run
    assert result["backend"]["used"] == "ort" and not result["backend"]["fallback"]
    metrics = result["metrics"]
    # the head starts at zero (every pair a tie: accuracy 0, loss ln 2); 24 steps move it
    assert metrics["eval_accuracy"] > 0 and metrics["eval_loss"] < np.log(2), metrics
    report = json.loads((run / "onnx" / "export.json").read_text())
    assert report["passed"] and report["parity"]["passed"], report
    assert report["outputs"] == ["logits"]
    session = ort.InferenceSession(str(run / "onnx" / "model.onnx"))
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    (logits,) = session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert logits.shape == (1, 1)
    # ortft eval on the export: training's last eval, from the graph
    evaluated = evaluate.run(run / "onnx")["metrics"]
    assert set(evaluated) == {"loss", "accuracy", "margin", "rewards_chosen", "rewards_rejected"}
    for name, value in evaluated.items():
        assert value == pytest.approx(metrics[f"eval_{name}"], abs=1e-5), name
    # ortft predict: a pair's two rewards and the preferred one; one response's reward alone
    prompt = "Write in digits: four two"
    rows = tmp_path / "rows.jsonl"
    lines = [
        {"prompt": prompt, "chosen": "4 2", "rejected": "4 3"},
        {"prompt": prompt, "response": "4 3"},
        {
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": "4 2"},
            ]
        },
    ]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    pair, single, chat = list(predict.run(run / "onnx", str(rows)))
    assert single["reward"] == pytest.approx(pair["reward_rejected"], abs=1e-5)
    assert chat["reward"] == pytest.approx(pair["reward_chosen"], abs=1e-5)
    margin = pair["reward_chosen"] - pair["reward_rejected"]
    assert pair["margin"] == pytest.approx(margin)
    assert pair["preferred"] == ("chosen" if margin > 1e-4 else "rejected")
    rows.write_text(json.dumps({"prompt": prompt, "chosen": "4 2", "rejected": "4 2"}) + "\n")
    with pytest.raises(InputError, match="rows.jsonl:1: chosen and rejected are the same"):
        list(predict.run(run / "onnx", str(rows)))


@pytest.mark.ort
def test_reward_model_resumes_exactly_after_kill_9(reward_run, tmp_path: Path) -> None:
    """A run killed with SIGKILL once step 4's checkpoint is written, resumed: the uninterrupted
    run's losses (no step logged twice) and final weights, bit for bit, dropout included."""
    recipe, full, _ = reward_run
    cut = tmp_path / "run"
    with open(tmp_path / "cut.err", "w") as err:
        args = ("train", recipe, "export.enabled=false", "--output-dir", cut)
        proc = start_cli(*args, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 300
    while not (cut / "step-000004" / "manifest.json").exists():
        assert proc.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    res = run_cli("train", *args[1:], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = int(summary(cut)["resumed_from"].rsplit("-", 1)[1])
    assert resumed in (4, 8), resumed  # 8 only if the kill came a checkpoint late
    got = losses(cut, by_step=True, unique_steps=True)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == losses(full, by_step=True, unique_steps=True)
    weights = (full / "final" / "model.safetensors").read_bytes()
    assert (cut / "final" / "model.safetensors").read_bytes() == weights


def test_reward_model_lora_is_peft_sequence_classifier_with_a_training_head() -> None:
    import torch
    from peft import PeftModelForSequenceClassification
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from ortft import tasks
    from ortft.backends.torch import models
    from ortft.recipe.model import AdapterSection

    task = tasks.get("reward-model")
    torch.manual_seed(0)
    config = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=40, num_labels=1)
    model = GPT2ForSequenceClassification(config)
    model.score.weight.data.normal_()  # a head with weights, so the body gets a gradient
    task.prepare_model(model, type("Tok", (), {"pad_token_id": 0})())
    assert not model.score.weight.any()  # a new head starts at zero: untrained pairs tie
    model.score.weight.data.normal_()
    adapted = models.apply_adapter(model, AdapterSection(rank=4), task)
    assert isinstance(adapted, PeftModelForSequenceClassification)
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert any("score" in n for n in trainable) and any("lora_A" in n for n in trainable)
    assert not any("wte" in n or "mlp" in n for n in trainable)  # the base stays frozen
    mask = torch.ones(1, 4, dtype=torch.long)
    batch = {  # one pair: labels mark the chosen sequence as real (not a padded eval copy)
        "input_ids": torch.tensor([[3, 4, 5, 6]]),
        "attention_mask": mask,
        "labels": torch.tensor([[3, 4, 5, 6]]),
        "rejected_input_ids": torch.tensor([[7, 8, 9, 1]]),
        "rejected_attention_mask": mask,
    }
    loss, _ = task.outside_loss(task.forward(adapted, **task.module_inputs(batch)), batch)
    loss.backward()
    grads = {n: p.grad for n, p in adapted.named_parameters() if p.requires_grad}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "score" in n)
