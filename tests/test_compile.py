"""``backend.compile``: the torch backend through torch.compile (dynamic shapes), its checkpoints,
resume across compiled and eager, LoRA, DDP, the recipe rules, and the ``auto`` probe's compiled
candidate.

Inductor's cold compile of even the 2-layer model takes minutes on a busy 2-core machine
(measured 215-230 s), so the compiled runs here use ``ORTFT_COMPILE_BACKEND=aot_eager``: the
same dynamo + AOTAutograd route (graphs, recompiles, DDP, the wrapper's place), without
inductor's C++ code generation; one ``slow`` test runs inductor itself. Every run is a CLI
subprocess; runs are module-scoped and shared across asserts.
"""

from __future__ import annotations

import csv
import json
import os
import random
from pathlib import Path

import pytest
from conftest import WORDS, tiny_classifier, write_recipe
from helpers import losses, run_cli, summary
from safetensors import safe_open

AOT = {"ORTFT_COMPILE_BACKEND": "aot_eager", "NO_COLOR": "1"}
STEPS = 10


def write_varied_csv(path: Path, n: int = 160, seed: int = 0) -> None:
    """Texts of 1-28 words: padded to the longest row (a multiple of 8), batches run at 8 to
    32 tokens, so a compile per length would show."""
    rng = random.Random(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.choice([1, 2, 3, 10, 20, 28]))]
            w.writerow([" ".join(words), rng.choice(["pos", "neg"])])


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compile")
    write_varied_csv(root / "train.csv")
    r = tiny_classifier("train.csv", backend="torch", max_steps=STEPS, batch_size=8)
    r["data"].update(eval_fraction=0.0, max_length=32)
    r["export"] = {"enabled": False}
    r["checkpoint"] = {"save_every": 5, "keep_last": 2}
    write_recipe(root / "r.yaml", r)
    return root


def cache(work: Path) -> dict[str, str]:
    """The module's ORTFT_CACHE (inductor's kernels, compile-times.json): conftest's autouse
    per-session one is set per test, after module fixtures run."""
    return {"ORTFT_CACHE": str(work / "ortft-cache"), "NO_COLOR": "1"}


def train(work: Path, out: str, *overrides: str, env: dict | None = None, launcher=()) -> Path:
    res = run_cli(
        "train", work / "r.yaml", *overrides, "--output-dir", work / out,
        env={**cache(work), **(env or {})}, timeout=900, launcher=launcher,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    (work / out / "stderr.txt").write_text(res.stderr)
    return work / out


@pytest.fixture(scope="module")
def eager(work: Path) -> Path:
    return train(work, "eager")


@pytest.fixture(scope="module")
def compiled_resumed(work: Path, eager: Path) -> Path:
    """Eager's step-5 resumed compiled (aot_eager): steps 6-10, checkpoints at 6, 8, 10 over
    batches of varying length (data.padding longest)."""
    return train(
        work, "e2c", f"checkpoint.resume={eager / 'step-000005'}", "backend.compile=true",
        "checkpoint.save_every=2", env=AOT,
    )  # fmt: skip


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


def weight_keys(folder: Path) -> list[str]:
    files = sorted(folder.rglob("*.safetensors"))
    assert files, f"no safetensors under {folder}"
    keys = []
    for f in files:
        with safe_open(str(f), "pt") as fh:
            keys += list(fh.keys())
    return keys


def _same_steps(run: Path, reference: Path, steps: range) -> None:
    got, full = losses(run, by_step=True), losses(reference, by_step=True)
    assert sorted(got) == list(steps)
    assert [got[s] for s in steps] == pytest.approx([full[s] for s in steps], rel=1e-4)


def test_resume_eager_checkpoint_compiled_is_exact(eager: Path, compiled_resumed: Path) -> None:
    """Steps 6-10 compiled after eager's step 5 are the uninterrupted eager run's, and one
    compile serves batches of every length (dynamic shapes: no compile per length)."""
    _same_steps(compiled_resumed, eager, range(6, STEPS + 1))
    lengths = {n for row in _rows(compiled_resumed) for n in row["batch_lengths"]}
    assert len(lengths) >= 2, lengths  # the lengths did vary (measured: 24 and 32)
    b = summary(compiled_resumed)["backend"]
    assert b["compile"]["compiler"] == "aot_eager" and b["compile"]["dynamic"] is True
    # measured: 5 graphs (graph breaks in BertForSequenceClassification's forward, plus one
    # recompile of the loss part once config.problem_type is set), however many lengths
    assert b["compile"]["graphs"] <= 6
    assert (compiled_resumed / "stderr.txt").read_text().count("torch.compile: the first") == 1


def test_checkpoints_and_final_carry_no_orig_mod_prefix(eager: Path, compiled_resumed: Path):
    for folder in (compiled_resumed / "step-000010", compiled_resumed / "final"):
        keys = weight_keys(folder)
        assert not [k for k in keys if "_orig_mod" in k], folder
        assert sorted(keys) == sorted(weight_keys(eager / folder.name))


def test_resume_compiled_checkpoint_on_eager_is_exact(
    work: Path, eager: Path, compiled_resumed: Path
) -> None:
    """The compiled run's step-8 resumed eagerly: steps 9-10 are the uninterrupted run's."""
    out = train(work, "c2e", f"checkpoint.resume={compiled_resumed / 'step-000008'}")
    _same_steps(out, eager, range(9, STEPS + 1))


@pytest.mark.slow
def test_inductor_losses_equal_eager(work: Path, eager: Path) -> None:
    """The real compiler (inductor's C++ kernels; a cold compile takes minutes on 2 cores):
    fp32 per-step losses are eager's to 1e-4 over 10 steps, and the record says inductor."""
    out = train(work, "inductor", "backend.compile=true")
    _same_steps(out, eager, range(1, STEPS + 1))
    b = summary(out)["backend"]["compile"]
    assert b["compiler"] == "inductor" and b["first_step_s"] > 0 and b["graphs"] <= 6


def test_lora_compiles(work: Path) -> None:
    out = train(
        work, "lora", "adapter.kind=lora", "backend.compile=true", "training.max_steps=3",
        "checkpoint.save_every=3", env=AOT,
    )  # fmt: skip
    assert len(losses(out)) == 3
    assert not [k for k in weight_keys(out / "final") if "_orig_mod" in k]
    assert summary(out)["backend"]["compile"]["graphs"] >= 1


@pytest.mark.parametrize("rank", ["0", "1"])
def test_rank_0_alone_remembers_a_compile_time(
    rank: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchrun every rank times the same compile; rank 0 alone rewrites the file."""
    from ortft.backends.torch import compiled

    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    (tmp_path / "compile-times.json").write_text(json.dumps({"other": 2.0}))
    compiled.remember_compile_s("this", 1.5)
    kept = json.loads((tmp_path / "compile-times.json").read_text())
    assert kept == ({"other": 2.0, "this": 1.5} if rank == "0" else {"other": 2.0})


def test_a_compiled_run_tells_the_next_probe_its_compile_time(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backend.compile=true remembers its first step (the compile) in compile-times.json under
    the probe's key, so a later auto run weighs the measured time, not the 120 s assumed for
    an unmeasured model; inductor's probe does not read the aot_eager run's time."""
    import torch

    from ortft.backends.torch import compiled
    from ortft.recipe import io

    env = {**AOT, "ORTFT_CACHE": str(tmp_path / "cache")}  # empty: nothing measured yet
    out = train(
        work, "remember", "backend.compile=true", "training.max_steps=2",
        "checkpoint.save_every=2", env=env,
    )  # fmt: skip
    first = summary(out)["backend"]["compile"]["first_step_s"]
    recipe = io.load(work / "r.yaml", []).recipe
    monkeypatch.setenv("ORTFT_COMPILE_BACKEND", "aot_eager")  # the key the run wrote under
    key = compiled.route_key(recipe, torch.device("cpu"), "fp32")
    monkeypatch.delenv("ORTFT_COMPILE_BACKEND")
    assert key != compiled.route_key(recipe, torch.device("cpu"), "fp32")  # inductor's
    times = json.loads((tmp_path / "cache" / "compile-times.json").read_text())
    assert times == {key: pytest.approx(first, abs=1e-3)}
    skipped = _auto(work, "remember-auto", env)["summary"]["backend"]["probe"]["backends"]
    assert f"~{first:.0f} s (measured last time)" in skipped["torch+compile"]["skipped"]


def test_ddp_compiles_in_two_processes(work: Path) -> None:
    """torch.compile(DDP(module)) under torchrun (gloo): the losses of one eager process with
    the global batch."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = ("training.max_steps=3", "checkpoint.save_every=3")
    ddp = train(work, "ddp", "backend.compile=true", *args, env=AOT, launcher=launcher)
    single = train(work, "single16", *args, "training.batch_size=16")
    s = summary(ddp)
    assert s["distributed"]["world_size"] == 2 and s["backend"]["compile"]["graphs"] >= 1
    assert losses(ddp) == pytest.approx(losses(single), rel=1e-5)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["backend.name=ort", "backend.compile=true"], "backend.compile=true compiles the torch"),
        (["backend.name=ort-ondevice", "backend.compile=auto"], "backend.compile=auto compiles"),
    ],
)
def test_compile_outside_torch_is_a_validation_error(work: Path, overrides, needle) -> None:
    res = run_cli("train", work / "r.yaml", *overrides, "--output-dir", work / "never")
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_deepspeed_with_compile_is_a_one_line_error(work: Path) -> None:
    r = tiny_classifier("train.csv", backend="torch", max_steps=2, batch_size=8)
    r["deepspeed"] = {"zero_optimization": {"stage": 1}}
    r["backend"]["compile"] = True
    path = write_recipe(work / "ds.yaml", r)
    res = run_cli("train", path, "--output-dir", work / "never-ds")
    assert res.returncode == 2 and "backend.compile=true with deepspeed" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def _auto(work: Path, out: str, env: dict, name: str = "auto") -> dict:
    res = run_cli(
        "train", work / "r.yaml", f"backend.name={name}", "backend.compile=auto",
        "training.max_steps=4", "checkpoint.save_every=4", "--output-dir", work / out, "--json",
        env=env, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return {"summary": json.loads(res.stdout), "stderr": res.stderr}


def test_auto_skips_the_compiled_route_on_a_short_run(work: Path, tmp_path: Path) -> None:
    """No compile time measured yet: 4 steps cannot pay back a compile, so it is not probed."""
    got = _auto(work, "auto-short", {**AOT, "ORTFT_CACHE": str(tmp_path / "cache")})  # empty
    probe = got["summary"]["backend"]["probe"]
    assert set(probe["backends"]) == {"torch", "torch+compile", "ort"}
    assert "too short" in probe["backends"]["torch+compile"]["skipped"]
    assert "torch+compile not probed" in got["stderr"]
    assert probe["route"] in ("torch", "ort") and probe["compile"] is False


def test_auto_probes_the_compiled_route_when_its_compile_is_known_cheap(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compile measured at 1 ms for this model (compile-times.json): the probe times it and
    counts its one-off cost in the estimate, per candidate, in summary.json. backend.name
    torch: the probe weighs eager against compiled (no ORT export to pay here)."""
    from ortft.backends.torch import compiled
    from ortft.recipe import io

    cache = tmp_path / "cache"
    recipe = io.load(work / "r.yaml", ["backend.compile=auto"]).recipe
    import torch

    # precision.dtype fp32 (the default): the compiled route's dtype is fp32 on any device
    monkeypatch.setenv("ORTFT_COMPILE_BACKEND", "aot_eager")  # the probe's compiler
    key = compiled.route_key(recipe, torch.device("cpu"), "fp32")
    cache.mkdir()
    (cache / "compile-times.json").write_text(json.dumps({key: 0.001}))
    got = _auto(work, "auto-known", {**AOT, "ORTFT_CACHE": str(cache)}, name="torch")
    probe = got["summary"]["backend"]["probe"]
    assert set(probe["backends"]) == {"torch", "torch+compile"}
    route = probe["backends"]["torch+compile"]
    assert route["compile"] is True and route["dtype"] == "fp32"
    for b in probe["backends"].values():
        assert b["estimated_total_s"] == pytest.approx(
            b["one_off_s"] + b["median_step_s"] * probe["run_steps"], abs=2e-3
        )
    assert probe["run_steps"] == 4
    # the probe measured the compile and remembered it for the next run
    assert json.loads((cache / "compile-times.json").read_text())[key] == route["one_off_s"]
    assert f"auto chose {probe['route']}" in got["stderr"]


@pytest.mark.parametrize(("compile_", "user_dir"), [("true", None), ("auto", None),
                                                    ("false", None), ("true", "mine")])  # fmt: skip
def test_a_run_that_may_compile_sets_the_inductor_cache_as_it_starts(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compile_: str, user_dir
) -> None:
    """From some torch after 2.6 on, the first ``import torch._dynamo`` (transformers' model
    code makes it) writes torch's default cache folder into TORCHINDUCTOR_CACHE_DIR (seen with
    torch 2.13 on CPU; docs/gpu.md, section 9): ortft's default must be set when the run starts,
    before the model is built, and never over a folder the user named."""
    import torch

    from ortft.backends.torch import engine as torch_engine
    from ortft.recipe import io as recipe_io

    for name in ("TORCHINDUCTOR_CACHE_DIR", "OMP_NUM_THREADS", "DS_ACCELERATOR"):
        monkeypatch.setenv(name, "x")  # recorded, so the test's end restores the original
        monkeypatch.delenv(name)
    if user_dir:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", user_dir)
    monkeypatch.setenv("ORTFT_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    try:
        engine = torch_engine.create(
            recipe_io.load(work / "r.yaml", [f"backend.compile={compile_}"])
        )
        engine.start(engine.recipe)
    finally:
        torch.set_num_threads(threads)
    expected = user_dir or (None if compile_ == "false" else str(tmp_path / "inductor"))
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == expected


def test_a_classifier_s_config_is_not_changed_by_its_first_forward() -> None:
    """transformers' sequence classifier writes config.problem_type in its first forward when
    it is unset, and a compiled forward guards on it: a full recompile at step 2 (seen on an
    H200). The task sets it before the model is wrapped, to the value that forward would set."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ortft import tasks

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=3)  # fmt: skip
    model = BertForSequenceClassification(config)
    tasks.get("sequence-classification").prepare_model(model, None)
    before = model.config.problem_type
    model(input_ids=torch.randint(1, 50, (2, 5)), labels=torch.tensor([0, 2]))
    assert before == model.config.problem_type == "single_label_classification"


def test_a_models_float_attributes_are_traced_once(tmp_path: Path) -> None:
    """A Llama's norm epsilons and attention scaling are traced as constants: torch 2.13 traced
    them as symbols under ``dynamic=True``, then specialized them and restarted the whole trace,
    about half of every compiled run's first step (each shipped recipe, aot_eager)."""
    import torch
    from torch._dynamo.utils import compile_times
    from transformers import LlamaConfig, LlamaForCausalLM

    from ortft.backends.torch import compiled

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 6))
    env = {**AOT, "ORTFT_CACHE": str(tmp_path)}
    with pytest.MonkeyPatch.context() as mp, torch._dynamo.config.patch(specialize_float=False):
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        torch._dynamo.reset()
        forward = compiled.compile_forward(model)
        forward(input_ids=ids, labels=ids).loss.backward()
        names, _ = compile_times(repr="csv")
        torch._dynamo.reset()
    assert "_compile.compile_inner" in names  # it compiled (torch 2.6 names no attempts)
    assert "compile_attempt_1" not in names
