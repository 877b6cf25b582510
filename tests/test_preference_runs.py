"""Preference runs beyond one process on full weights: DPO and the reward model under torchrun
(2 processes on CPU) give one process's losses and metrics, and a LoRA run's reference is the
base model's own log-probs (computed before the adapter and ORTModule, never through ORTModule's
graph)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tiny_causal_lm, write_recipe
from helpers import losses, run_cli
from test_preference import write_pairs

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
REWARDS = ("rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin")


def _rows(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


# each task's metrics of the pairs, which a step gathers from every rank
METRICS = {
    "preference": REWARDS,
    "reward-model": ("rewards_chosen", "rewards_rejected", "accuracy", "margin"),
}


@pytest.mark.parametrize(
    "task", [{"name": "preference", "loss": "dpo", "beta": 0.5}, {"name": "reward-model"}],
    ids=lambda t: t["name"],
)  # fmt: skip
def test_two_processes_give_one_process_losses_and_metrics(tmp_path: Path, task) -> None:
    """torch backend: 2 x 4 pairs a step against one process with 8. The train rows' metrics
    are the global batch's (gathered from both ranks, not rank 0's half), the eval covers every
    eval pair, and (DPO) both ranks read one reference entry that the single run reads back."""
    write_pairs(tmp_path / "pairs.jsonl", 30)
    r = tiny_causal_lm("pairs.jsonl", backend="torch", max_steps=3, batch_size=4)
    r["task"] = task
    r["data"].update(eval_fraction=0.2)  # 6 eval pairs: 2 batches of 4 per rank, 1 of 8
    r["export"] = {"enabled": False}
    recipe = write_recipe(tmp_path / "r.yaml", r)
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    res = run_cli("train", recipe, "-o", ddp, launcher=TORCHRUN, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("train", recipe, "training.batch_size=8", "-o", single, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    if task["name"] == "preference":  # the same base weights and pairs: one reference entry
        assert "reference log-probs: 24 train pairs (cache hit)" in res.stderr, res.stderr[-3000:]
    names = METRICS[task["name"]]
    a, b = _rows(ddp, "train"), _rows(single, "train")
    assert [x["step"] for x in a] == [x["step"] for x in b] == [1, 2, 3]
    # The rewards are differences of log-prob sums: another batch split rounds those sums in
    # another order, an absolute float32 error (1.2e-7 seen on an AMD EPYC) however small the
    # difference; half the batch's rewards (no gather) were 2e-2 off.
    for x, y in zip(a, b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        for name in names:
            assert x[name] == pytest.approx(y[name], rel=1e-5, abs=1e-6), (name, x, y)
    (ea,), (eb,) = _rows(ddp, "eval"), _rows(single, "eval")
    for name in ("loss", *names):
        assert ea[name] == pytest.approx(eb[name], rel=1e-5, abs=1e-6), (name, ea, eb)
    assert a[-1][names[0]] != a[0][names[0]]  # the metrics moved: the check compares something


def _splits(cache: Path) -> dict[str, tuple[Any, np.ndarray]]:
    """{split: (its token arrays, its reference log-probs)} of a cache that one run filled."""
    from ortft.data import tokenized

    arrays, refs = {}, {}
    for entry in (cache / "tokenized").iterdir():
        if not (entry / tokenized.META).exists():
            continue
        source = json.loads((entry / tokenized.META).read_text())["source"]
        if source.startswith("reference log-probs of the "):
            refs[source.split()[-2]] = np.load(entry / "reference.npy")
        else:
            arrays["eval" if source.endswith("(held out)") else "train"] = tokenized._load(entry)
    assert sorted(arrays) == sorted(refs) == ["eval", "train"], (arrays, refs)
    return {name: (arrays[name], refs[name]) for name in arrays}


@pytest.mark.ort
def test_a_lora_runs_reference_is_the_base_models_own(tmp_path: Path) -> None:
    """LoRA on ort: the reference is the base model with no adapter, computed in eager
    PyTorch before the adapter and ORTModule. A resume that lost the cache computes it again
    from the base (not from the checkpoint's adapted policy, nor through ORTModule's graph):
    both runs' reference log-probs equal the base model's own, loaded without the adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ortft.families.preference import reference

    write_pairs(tmp_path / "pairs.jsonl", 24)
    r = tiny_causal_lm("pairs.jsonl", backend="ort", max_steps=2, batch_size=4, lr=1e-2)
    r["task"] = {"name": "preference", "loss": "dpo", "beta": 0.5}
    r["adapter"] = {"kind": "lora", "rank": 4, "alpha": 8}
    r["data"].update(eval_fraction=0.25)
    r["checkpoint"] = {"save_every": 1}
    r["export"] = {"enabled": False}
    recipe, run = write_recipe(tmp_path / "r.yaml", r), tmp_path / "run"
    first, again = tmp_path / "cache-1", tmp_path / "cache-2"
    res = run_cli("train", recipe, "-o", run, env={"ORTFT_CACHE": str(first)})
    assert res.returncode == 0, res.stderr[-3000:]
    full = losses(run, by_step=True)
    for name in ("step-000002", "final", "summary.json"):  # as if killed after step 1
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    # ... and the cache lost: the resume computes the reference again
    res = run_cli("train", recipe, "-o", run, "--json", env={"ORTFT_CACHE": str(again)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["resumed_from"].endswith("step-000001")
    assert "reference log-probs: 18 train pairs (computed" in res.stderr, res.stderr[-3000:]
    assert losses(run, by_step=True) == full
    # final/ holds the frozen base model and, in adapter/, the trained adapter
    base = AutoModelForCausalLM.from_pretrained(run / "final", attn_implementation="eager")
    own = {}
    for cache in (first, again):
        for name, (encoded, ref) in _splits(cache).items():
            own.setdefault(name, (encoded, reference.compute(base, encoded)))
            np.testing.assert_allclose(ref, own[name][1], rtol=0, atol=1e-5, err_msg=name)
    policy = PeftModel.from_pretrained(base, run / "final" / "adapter")
    moved = reference.compute(policy, own["train"][0]) - own["train"][1]
    assert np.abs(moved).max() > 1e-3  # the adapter trained: the comparison can tell them apart
