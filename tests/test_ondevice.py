"""backend.name=ort-ondevice: a tiny BERT classifier trained in onnxruntime.training.api.

Every training run is a `python -m ortft train` subprocess. One run (`trained`, 6 steps, a
checkpoint every 3) is shared by the tests; the others resume from it or check what it wrote.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import helpers
import numpy as np
import pytest
from conftest import (
    tiny_causal_lm,
    tiny_classifier,
    write_classification_csv,
    write_corpus,
    write_recipe,
)
from helpers import run_cli

pytestmark = pytest.mark.ort  # every test trains or runs on onnxruntime.training.api

# torch poisoned before ortft loads: `import torch` fails, and transformers sees no torch
NO_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.argv = ['ortft', *sys.argv[1:]]\n"
    "from ortft.cli.app import main\n"
    "try:\n    main()\nfinally:\n"
    "    loaded = [m for m in sys.modules if m.startswith('torch.') or (m == 'torch' and sys.modules[m])]\n"
    "    print('TORCH_MODULES', len(loaded), file=sys.stderr)\n"
)


def _train(
    recipe: Path, out: Path, *overrides: str, torch: bool = True
) -> subprocess.CompletedProcess:
    return run_cli(
        "train",
        str(recipe),
        *overrides,
        "--output-dir",
        str(out),
        "--json",
        code=None if torch else NO_TORCH,
        timeout=600,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("ondevice")
    write_classification_csv(tmp / "train.csv")
    recipe = tiny_classifier(
        "train.csv", backend="ort-ondevice", max_steps=6, lr=5e-3, eval_every=3
    )
    recipe["checkpoint"] = {"save_every": 3, "keep_last": 2}
    path = write_recipe(tmp / "cls.yaml", recipe)
    res = _train(path, tmp / "run")
    assert res.returncode == 0, res.stderr[-2000:]
    return path, tmp / "run", json.loads(res.stdout)


def test_trains_and_writes_a_run(trained):
    _, run, summary = trained
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert summary["backend"]["used"] == "ort-ondevice" and summary["backend"]["ort_exports"] == 1
    assert summary["backend"]["peak_rss_mb"] > 0
    assert "ORTFT_ORT_SPINNING=0" in summary["backend"]["notes"]  # ORTModule's session defaults
    assert {
        "checkpoint",
        "training_model.onnx",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "artifacts.json",
        "config.json",
    } <= {p.name for p in (run / "ondevice/artifacts").iterdir()}
    assert {p.name for p in run.glob("step-*")} == {"step-000003", "step-000006"}
    assert {"checkpoint", "state.json", "recipe.yaml", "manifest.json"} <= {
        p.name for p in (run / "step-000006").iterdir()
    }
    assert {"model.onnx", "config.json", "tokenizer.json", "recipe.yaml", "README.md"} <= {
        p.name for p in (run / "final").iterdir()
    }
    assert summary["export"]["parity"]["max_abs_diff"] <= 1e-5
    assert "eval_accuracy" in summary["metrics"]


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_gradients_equal_pytorch_for_batches_of_every_shape(arch, tmp_path):
    """Every parameter's gradient from the artifacts' training graph equals PyTorch's, for
    batches of 4-20 rows and 8-24 tokens (padding=longest makes every batch a new shape). Before
    the explicit position ids, BERT's position-embedding gradient wrote past its buffer from
    batch 14 on: the script aborted (heap corruption), hence a subprocess."""
    script = Path(__file__).with_name("ondevice_gradients.py")
    res = subprocess.run([sys.executable, str(script), arch, str(tmp_path / "art")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    worst = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(worst) == 4
    for shape, got in worst.items():
        assert got["loss"] == pytest.approx(got["torch_loss"], rel=1e-5), shape
        assert got["rel_diff"] < 1e-5, (shape, got)


def test_embedding_lookups_broadcast_over_the_batch_are_refused():
    """A parameter gathered by ids made from a constant and a shape (transformers' default
    position ids) is refused; ids computed from input_ids' values pass."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ortft.backends.ondevice.artifacts import check_embedding_indices
    from ortft.core.errors import InputError

    def graph(ids_from_input: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Shape", ["input_ids"], ["shape"], start=1, end=2)]
        if ids_from_input:  # zeros + arange: the batch dimension comes from input_ids
            nodes += [helper.make_node("Mul", ["input_ids", "zero"], ["zeros"]),
                      helper.make_node("Add", ["zeros", "zero"], ["ids"])]  # fmt: skip
        else:  # buffer[:, :sequence], broadcast over the batch later
            nodes += [helper.make_node("Slice", ["buffer", "start", "shape", "one"], ["ids"])]
        nodes += [helper.make_node("Gather", ["weight", "ids"], ["out"])]
        inits = [numpy_helper.from_array(np.zeros((8, 4), np.float32), "weight"),
                 numpy_helper.from_array(np.arange(8, dtype=np.int64)[None], "buffer"),
                 numpy_helper.from_array(np.array([0], np.int64), "start"),
                 numpy_helper.from_array(np.array([1], np.int64), "one"),
                 numpy_helper.from_array(np.array(0, np.int64), "zero")]  # fmt: skip
        ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
        return helper.make_model(helper.make_graph(nodes, "g", [ids], [out], inits))

    check_embedding_indices(graph(ids_from_input=True))
    with pytest.raises(InputError, match="looks up weight by indices broadcast over the batch"):
        check_embedding_indices(graph(ids_from_input=False))


def test_artifacts_with_a_broadcast_lookup_gradient_are_refused(tmp_path):
    """Artifacts built before the fix (or by other tools) hold GatherGrad(shape, (1, seq) ids,
    grad): the engine refuses them with exit code 2 instead of corrupting ORT's heap."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ortft.backends.ondevice.engine import _check_lookup_gradients
    from ortft.core.errors import InputError

    def write(ids_from_input: bool) -> None:
        ids = "input_ids" if ids_from_input else "buffer_ids"
        nodes = [helper.make_node("Shape", ["w"], ["w_shape"]),
                 helper.make_node("Identity", ["buffer"], ["buffer_ids"]),
                 helper.make_node("GatherGrad", ["w_shape", ids, "g"], ["w_grad"],
                                  domain="com.microsoft")]  # fmt: skip
        ins = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
               helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 4]),
               helper.make_tensor_value_info("g", TensorProto.FLOAT, None)]  # fmt: skip
        out = [helper.make_tensor_value_info("w_grad", TensorProto.FLOAT, None)]
        init = [numpy_helper.from_array(np.arange(8, dtype=np.int64)[None], "buffer")]
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", ins, out, init)),
                  tmp_path / "training_model.onnx")  # fmt: skip

    write(ids_from_input=True)
    _check_lookup_gradients(tmp_path)
    write(ids_from_input=False)
    with pytest.raises(InputError, match=r"training_model.onnx: the gradient of w is built"):
        _check_lookup_gradients(tmp_path)


def test_loss_falls(tmp_path):
    write_classification_csv(tmp_path / "train.csv")
    path = write_recipe(
        tmp_path / "cls.yaml",
        tiny_classifier("train.csv", backend="ort-ondevice", max_steps=20, lr=5e-3),
    )
    res = _train(path, tmp_path / "run", "data.eval_fraction=0")
    assert res.returncode == 0, res.stderr[-2000:]
    losses = list(helpers.losses(tmp_path / "run", by_step=True).values())
    # 0.693 -> 0.645 on the last three (torch: 0.641); the 0.05 once asked for was met only
    # with the broadcast position-embedding gradient (tests/ondevice_gradients.py)
    assert len(losses) == 20 and max(losses[-3:]) < losses[0] - 0.03, losses


def test_same_losses_as_pytorch_with_the_same_frozen_set(tmp_path):
    """Only the head and the last layer train; the first step is the same model and batch, so
    the same loss; then ORT's AdamW graph and torch's AdamW agree closely (not bit for bit)."""
    write_classification_csv(tmp_path / "train.csv")
    path = write_recipe(tmp_path / "cls.yaml", tiny_classifier("train.csv", max_steps=4, lr=5e-3))
    got = {}
    for backend in ("ort-ondevice", "torch"):
        res = _train(
            path,
            tmp_path / backend,
            f"backend.name={backend}",
            "data.eval_fraction=0",
            "backend.trainable=[classifier.*,bert.encoder.layer.1.*]",
        )
        assert res.returncode == 0, res.stderr[-2000:]
        got[backend] = list(helpers.losses(tmp_path / backend, by_step=True).values())
        summary = json.loads(res.stdout)
        assert summary["trainable_parameters"] < summary["parameters"]
    assert got["ort-ondevice"][0] == pytest.approx(got["torch"][0], rel=1e-6)
    assert got["ort-ondevice"] == pytest.approx(got["torch"], rel=2e-3)


def test_accumulated_micro_batches_weigh_by_their_real_tokens_as_on_pytorch(tmp_path):
    """Unpacked texts of 8-40 words padded per batch: micro-batches hold different numbers of
    real tokens. The step loss (and its gradient) is the mean over all of them on both engines,
    so even the first step's loss agrees; a mean of per-micro-batch means would not."""
    write_corpus(tmp_path / "corpus.txt")
    path = write_recipe(
        tmp_path / "lm.yaml",
        tiny_causal_lm("corpus.txt", max_steps=3, batch_size=2, gradient_accumulation_steps=2),
    )
    got = {}
    for backend in ("ort-ondevice", "torch"):
        res = _train(path, tmp_path / backend, f"backend.name={backend}", "data.packing=false",
                     "data.eval_fraction=0", "export.enabled=false")  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        got[backend] = list(helpers.losses(tmp_path / backend, by_step=True).values())
    assert got["ort-ondevice"][0] == pytest.approx(got["torch"][0], rel=1e-5)
    assert got["ort-ondevice"] == pytest.approx(got["torch"], rel=2e-3)


def test_inference_model_holds_the_trained_weights(trained):
    import onnx
    import onnxruntime as ort

    from ortft.backends.ondevice.engine import training_api

    _, run, _ = trained
    api = training_api()
    final = onnx.load(str(run / "final/model.onnx"))
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in final.graph.initializer}
    state = api.CheckpointState.load_checkpoint(str(run / "step-000006/checkpoint"))
    start = api.CheckpointState.load_checkpoint(str(run / "ondevice/artifacts/checkpoint"))
    name = "classifier.weight"
    trained_w = state.parameters[name].data
    assert not np.allclose(trained_w, start.parameters[name].data)  # it did train
    np.testing.assert_array_equal(weights[name], trained_w)
    # the same logits as the eval graph with the last checkpoint's weights
    art = run / "ondevice/artifacts"
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    module.eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (4, 16)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    scale = np.array(1.0, dtype=np.float32)  # the artifacts' loss_scale input (format 2)
    _, want = module(ids, mask, np.zeros(4, dtype=np.int64), scale)
    sess = ort.InferenceSession(str(run / "final/model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_resume_auto_continues_at_the_right_step_without_torch(trained, tmp_path):
    """A run dir holding the 3-step checkpoint resumes at step 4 and reproduces the
    uninterrupted run's losses; the artifacts come from model.name_or_path (the edge
    workflow), so the process never loads PyTorch."""
    recipe, run, _ = trained
    shutil.copytree(run / "step-000003", tmp_path / "step-000003")
    res = _train(
        recipe,
        tmp_path,
        "model.from_config=null",
        "model.tokenizer.train=null",
        f"model.name_or_path={run / 'ondevice/artifacts'}",
        torch=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "TORCH_MODULES 0" in res.stderr
    summary = json.loads(res.stdout)
    assert summary["resumed_from"].endswith("step-000003") and summary["steps"] == 6
    assert summary["backend"]["ort_exports"] == 0
    resumed, straight = helpers.losses(tmp_path, by_step=True), helpers.losses(run, by_step=True)
    assert sorted(resumed) == [4, 5, 6]
    assert [resumed[s] for s in (4, 5, 6)] == pytest.approx(
        [straight[s] for s in (4, 5, 6)], rel=1e-5
    )


def test_ortft_eval_and_export_accept_the_onnx_final(trained, tmp_path):
    _, run, summary = trained
    res = run_cli("eval", str(run), "--json", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    ev = json.loads(res.stdout)
    assert ev["runtime"] == "onnxruntime"
    assert ev["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["eval_accuracy"])
    res = run_cli("export", str(run), "-o", str(tmp_path / "onnx"), "--json", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    parity = json.loads((tmp_path / "onnx/export.json").read_text())["parity"]
    # against the eval graph with the last checkpoint, not final/model.onnx itself (0 by design)
    assert parity["independent"] and parity["passed"], parity
    assert "eval_model.onnx" in parity["against"] and "step-000006" in parity["against"]
    assert parity["max_abs_diff"] <= 1e-5


def _export(source: Path, out: Path) -> subprocess.CompletedProcess:
    return run_cli("export", str(source), "-o", str(out), "--json", timeout=300)


def test_export_of_an_onnx_final_without_the_trained_weights_fails(trained, tmp_path):
    """A final/model.onnx whose classifier was changed after training no longer matches the
    eval graph with the last checkpoint: the export's parity check fails (exit 3)."""
    import onnx

    _, run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    model = onnx.load(str(copy / "final/model.onnx"))
    weight = next(i for i in model.graph.initializer if i.name == "classifier.weight")
    weight.CopyFrom(
        onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) + 0.5, weight.name)
    )
    onnx.save(model, str(copy / "final/model.onnx"))
    res = _export(copy, tmp_path / "onnx")
    assert res.returncode == 3, res.stderr[-2000:]
    assert "export check failed: parity" in res.stderr
    parity = json.loads((tmp_path / "onnx.failed/export.json").read_text())["parity"]
    assert parity["independent"] and not parity["passed"] and parity["max_abs_diff"] > 1e-2


def test_export_of_an_onnx_final_says_when_nothing_independent_was_there(trained, tmp_path):
    """Without a checkpoint at the last step there is only final/model.onnx to compare with:
    the export passes and says so (independent: false)."""
    _, run, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "step-000006")
    res = _export(copy, tmp_path / "onnx")
    assert res.returncode == 0, res.stderr[-2000:]
    parity = json.loads((tmp_path / "onnx/export.json").read_text())["parity"]
    assert parity["independent"] is False and "itself" in parity["against"]


def test_the_loop_module_imports_no_torch():
    import ast

    import ortft.backends.ondevice.engine as loop

    tree = ast.parse(Path(loop.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n.split(".")[0] == "torch"}


@pytest.mark.parametrize(
    "override, message",
    [
        ("adapter.rank=4", "does not support adapter"),
        ("precision.dtype=bf16", "precision.dtype=bf16"),
        ("backend.save_onnx=true", "backend.save_onnx"),
        ("task=masked-lm", "task masked-lm"),
    ],
)
def test_unsupported_combinations_are_recipe_errors(tmp_path, override, message):
    from ortft.core.errors import RecipeError
    from ortft.recipe import io as recipe_io

    write_classification_csv(tmp_path / "train.csv")
    path = write_recipe(tmp_path / "cls.yaml", tiny_classifier("train.csv", backend="ort-ondevice"))
    with pytest.raises(RecipeError, match=message):
        recipe_io.load(path, [override])


def test_trainable_pattern_matching_nothing_is_an_input_error(tmp_path):
    write_classification_csv(tmp_path / "train.csv")
    path = write_recipe(tmp_path / "cls.yaml", tiny_classifier("train.csv", backend="ort-ondevice"))
    res = _train(path, tmp_path / "run", "backend.trainable=[clasifier.*]")
    assert res.returncode == 2 and "clasifier.* matches no parameter" in res.stderr


# ---- the on-device backend runs the one lifecycle: what its own copy of the loop used to miss


def _given_artifacts(run: Path) -> list[str]:
    """Overrides that train from the fixture's artifacts (no PyTorch build: seconds)."""
    art = run / "ondevice/artifacts"
    return ["model.from_config=null", "model.tokenizer.train=null", f"model.name_or_path={art}"]


def test_max_time_stops_the_run(trained, tmp_path):
    recipe, run, _ = trained
    res = _train(recipe, tmp_path / "r", *_given_artifacts(run), "training.max_time=0.001")
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert summary["stop_reason"] == "max_time" and summary["status"] == "stopped"
    assert summary["steps"] == 1 and (tmp_path / "r/step-000001").is_dir()  # resumable


def test_threads_and_determinism_reach_the_session(trained, monkeypatch):
    from ortft.backends.ondevice import engine as ondevice
    from ortft.recipe import io as recipe_io

    recipe, run, _ = trained
    overrides = [*_given_artifacts(run), "hardware.threads=1", "training.deterministic=true"]
    engine = ondevice.create(recipe_io.load(recipe, overrides))
    started = engine.start(engine.recipe)
    assert started.threads == 1 and engine.options.intra_op_num_threads == 1
    assert engine.options.use_deterministic_compute
    plain = ondevice.create(recipe_io.load(recipe, _given_artifacts(run)))
    plain.start(plain.recipe)
    assert not plain.options.use_deterministic_compute
    seen = {}
    api = ondevice.training_api()

    class Module(api.Module):  # the options prepare() hands to onnxruntime.training
        def __init__(self, *args, session_options=None, **kwargs):
            seen["threads"] = session_options.intra_op_num_threads
            seen["spinning"] = session_options.get_session_config_entry(
                "session.intra_op.allow_spinning"
            )
            super().__init__(*args, session_options=session_options, **kwargs)

    monkeypatch.setattr(api, "Module", Module)
    engine.tokenizer(engine.loaded, run, None, [], None)
    engine.prepare(engine.loaded, None, None, None, None, run, None, 6)
    assert seen == {"threads": 1, "spinning": "0"}  # ORTModule's session defaults too
    monkeypatch.setenv("ORTFT_ORT_SPINNING", "1")  # the bench's lever, as for ORTModule
    spinning = ondevice.create(recipe_io.load(recipe, _given_artifacts(run)))
    spinning.start(spinning.recipe)
    assert spinning.options.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_a_finished_run_rerun_with_a_gate_gets_a_verdict(trained):
    recipe, run, _ = trained
    res = _train(recipe, run, "--gate", "train.loss<0")
    assert res.returncode == 3, res.stderr[-2000:]
    assert "already holds a finished run" in res.stderr and "gate FAIL" in res.stderr


def test_a_foreign_summary_format_is_refused(trained, tmp_path):
    recipe, run, _ = trained
    (tmp_path / "r").mkdir()
    summary = json.loads((run / "summary.json").read_text())
    (tmp_path / "r/summary.json").write_text(json.dumps({**summary, "format_version": 99}))
    res = _train(recipe, tmp_path / "r", *_given_artifacts(run))
    assert res.returncode == 2
    assert "format_version 99 is not one this ortft reads" in res.stderr
