"""summary.json as a RunSummary: round trip, today's keys, the format_version check, git_dirty.

tests/data/summary_v1_{torch,ondevice}.json were written by `ortft train` before RunSummary
existed (a 5-step torch run with checkpoint.final=best and the export; a 4-step ort-ondevice run).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_classifier, write_classification_csv, write_recipe
from helpers import run_cli

from ortft.core.errors import InputError
from ortft.run import gates, provenance, report
from ortft.run.summary import (
    FORMAT_VERSION,
    BackendReport,
    Precision,
    Provenance,
    RunPaths,
    RunSummary,
)

DATA = Path(__file__).parent / "data"
GOLDEN = ["summary_v1_torch.json", "summary_v1_ondevice.json"]


def _keys(obj: Any, prefix: str = "") -> set[str]:
    """Every key path of the JSON objects in ``obj`` (the export report's own keys included)."""
    if not isinstance(obj, dict):
        return set()
    out = set()
    for k, v in obj.items():
        out.add(prefix + k)
        out |= _keys(v, f"{prefix}{k}.")
    return out


def full_summary() -> RunSummary:
    """Every field set to something other than its default."""
    return RunSummary(
        status="completed",
        error="boom",
        task="sequence-classification",
        max_steps=5,
        parameters=100,
        trainable_parameters=10,
        provenance=Provenance(
            ortft="0.1.0",
            python="3.11.7",
            platform="Linux",
            packages={"torch": "2.6.0", "torch-ort": None},
            recipe_sha256="ab" * 32,
            git_commit="c" * 40,
            git_dirty=True,
            started_at="2026-01-01T00:00:00Z",
            finished_at="2026-01-01T00:01:00Z",
            device="cpu",
            threads=2,
        ),
        paths=RunPaths(
            run_dir="/r",
            final="/r/final",
            recipe="/r.yaml",
            onnx="/r/onnx",
            checkpoints=["/r/step-000002"],
            last_checkpoint="/r/step-000002",
            artifacts="/r/ondevice/artifacts",
        ),
        backend=BackendReport(
            requested="auto",
            used="ort",
            fallback=True,
            fallback_reason="why",
            ort_exports=2,
            pytorch_kernels={"gelu": 2},
            notes=["a note"],
            extra={"probe": {"chosen": "ort"}, "peak_rss_mb": 650.5},
        ),
        export={"parity": {"max_abs_diff": 1e-6}, "passed": True},
        resumed_from="/r/step-000002",
        precision=Precision(dtype="fp16", skipped_steps=1),
        distributed={"world_size": 2, "backend": "gloo"},
        steps=5,
        epochs=0.5,
        samples=40,
        tokens=250,
        metrics={"train_loss": 0.6, "eval_accuracy": 0.9, "eval_f1_macro": None},
        throughput={"samples_per_s": 40.0, "tokens_per_s": 250.0, "first_step_s": 0.1},
        train_time_s=1.0,
        wall_time_s=4.0,
        final="best",
        final_step=2,
        best_metric={"name": "eval_loss", "mode": "min", "value": 0.5, "step": 2},
        stopped_early=True,
        stopped_at_step=5,
        stop_reason="early_stopping",
        gates=[{"gate": "steps>=1", "passed": True}],
        extra={"from_a_newer_ortft": 1},
    )


def test_round_trip_through_a_dict_and_json() -> None:
    s = full_summary()
    assert RunSummary.from_dict(s.to_dict()) == s
    assert RunSummary.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert RunSummary.from_dict(RunSummary().to_dict()) == RunSummary()


@pytest.mark.parametrize("name", GOLDEN)
def test_keys_are_those_todays_runs_write(name: str) -> None:
    golden = json.loads((DATA / name).read_text())
    s = RunSummary.from_dict(golden)
    # every key has a field: nothing went to the catch-all dicts
    assert s.extra == {} and s.provenance.extra == {} and s.paths.extra == {}
    assert s.backend is not None and set(s.backend.extra) <= {"peak_rss_mb", "probe"}
    assert _keys(s.to_dict()) == _keys(golden)
    assert s.to_dict() == golden
    assert s.metrics["train_loss"] == golden["metrics"]["train_loss"]


def _shape(d: dict[str, Any]) -> set[str]:
    """The keys RunSummary's own types fix: the top level and its dataclass blocks."""
    blocks = ("provenance", "paths", "backend", "precision")
    return set(d) | {f"{b}.{k}" for b in blocks for k in (d.get(b) or {})}


def test_a_built_summary_has_the_keys_of_a_torch_run() -> None:
    """A RunSummary built field by field (as the lifecycle will) writes the keys of today's run."""
    golden = json.loads((DATA / "summary_v1_torch.json").read_text())
    s = full_summary()
    s.paths.artifacts = None  # ort-ondevice only
    s.backend.extra = {}  # backend.name=auto / ort-ondevice only
    s.extra = {}
    assert _shape(s.to_dict()) == _shape(golden)


def test_ondevice_summary_omits_what_it_never_had() -> None:
    s = RunSummary(paths=RunPaths(run_dir="/r", artifacts="/a"))
    d = s.to_dict()
    for key in ("precision", "distributed", "backend", "final", "best_metric", "stop_reason"):
        assert key not in d
    assert d["paths"]["artifacts"] == "/a"
    assert "artifacts" not in RunSummary().to_dict()["paths"]


def test_from_dict_tolerates_missing_and_unknown_keys() -> None:
    s = RunSummary.from_dict({"status": "failed", "backend": {"used": "torch", "x": 1}, "new": 2})
    assert s.status == "failed" and s.steps == 0 and s.paths.run_dir == ""
    assert s.backend == BackendReport(requested="", used="torch", extra={"x": 1})
    assert s.extra == {"new": 2} and s.to_dict()["new"] == 2


def test_write_then_read(tmp_path: Path) -> None:
    s = full_summary()
    s.write(tmp_path / "summary.json")
    assert RunSummary.read(tmp_path / "summary.json") == s
    assert not list(tmp_path.glob(".*tmp*"))  # the temp file was renamed into place


def test_read_absent_or_broken_is_none(tmp_path: Path) -> None:
    assert RunSummary.read(tmp_path / "summary.json") is None
    (tmp_path / "summary.json").write_text("{not json")
    assert RunSummary.read(tmp_path / "summary.json") is None


def test_read_refuses_another_format_version(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**RunSummary().to_dict(), "format_version": 99}))
    with pytest.raises(InputError, match=r"format_version 99 .*use another --output-dir") as err:
        RunSummary.read(path)
    assert str(path) in str(err.value)


def test_apply_sets_fields_by_name() -> None:
    s = RunSummary()
    s.apply({"final": "last", "final_step": 3, "stopped_early": False})
    assert (s.final, s.final_step) == ("last", 3)
    with pytest.raises(KeyError, match="nope"):
        s.apply({"nope": 1})


def test_format_version_and_backend_report_are_re_exported() -> None:
    from ortft.backends import BackendReport as FromBackends

    assert FORMAT_VERSION == 1
    assert FromBackends is BackendReport


def test_gates_and_model_card_take_a_run_summary() -> None:
    s = full_summary()
    results = gates.check([gates.parse(g) for g in ["eval.accuracy>=0.9", "paths.x>1"]], s)
    assert [r.passed for r in results] == [True, False]
    assert gates.lookup(s, "precision.skipped_steps") == 1.0  # a dotted path into the JSON
    assert gates.lookup(s, "export.max_abs_diff") == 1e-6

    class R:  # the recipe fields the card reads
        model = type("M", (), {"name_or_path": "tiny"})
        task = type("T", (), {"name": "sequence-classification"})
        data = type("D", (), {"train": "train.csv", "eval": None})
        training = type(
            "Tr",
            (),
            {
                "batch_size": 8,
                "gradient_accumulation_steps": 1,
                "lr": 1e-3,
                "scheduler": "linear",
                "seed": 0,
            },
        )

    card = report.model_card(s, R)
    assert "**Backend:** ort (requested auto; fallback: yes)" in card
    assert "| eval_accuracy | 0.9000 |" in card
    assert report.model_card(s.to_dict(), R) == card  # the lifecycle's dict, until it switches


# --------------------------------------------------------------------------- git_dirty


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_git_dirty_counts_changed_tracked_files_only(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert provenance.git_dirty(repo) is None  # not a repository
    _git(repo, "init", "-q")
    (repo / "r.yaml").write_text("a: 1\n")
    _git(repo, "add", "r.yaml")
    _git(repo, "commit", "-q", "-m", "recipe")
    assert provenance.git_dirty(repo) is False
    (repo / "train.csv").write_text("text,label\n")  # untracked: not dirty
    assert provenance.git_dirty(repo) is False
    (repo / "r.yaml").write_text("a: 2\n")
    assert provenance.git_dirty(repo) is True
    prov = provenance.collect(repo / "r.yaml", "sha")
    assert prov["git_dirty"] is True and prov["git_commit"]
    assert list(prov).index("git_dirty") == list(prov).index("git_commit") + 1


# --------------------------------------------------------------------------- a real run


def test_a_run_summary_reads_what_train_writes(tmp_path: Path) -> None:
    """A tiny torch run (4 steps, ~10 s): summary.json and `--json` read back key for key."""
    write_classification_csv(tmp_path / "train.csv")
    recipe = tiny_classifier("train.csv", backend="torch", max_steps=4, eval_every=2)
    recipe["export"] = {"enabled": False}
    path = write_recipe(tmp_path / "r.yaml", recipe)
    res = run_cli(
        "train",
        str(path),
        "-o",
        str(tmp_path / "run"),
        "--json",
        env={"NO_COLOR": "1"},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    s = RunSummary.read(tmp_path / "run" / "summary.json")
    assert s is not None and s.extra == {} and s.provenance.git_dirty is None
    assert s.to_dict() == written == json.loads(res.stdout)
    golden = json.loads((DATA / "summary_v1_torch.json").read_text())
    # what format_version 1 gained since the golden file was written: the batching block, and
    # the torch backend's unpad record (backend.unpad) and dropout-mask one (backend.dropout_masks)
    assert _shape(written) == _shape(golden) | {"data", "backend.unpad", "backend.dropout_masks"}
    assert set(written["data"]) == {
        "padding",
        "padding_fraction",
        "batch_shapes",
        "rows_at_max_length",
        "streaming",
    }
