"""summary.json as one typed record: ``RunSummary``, built by the lifecycle, read by everything else.

summary.json (format_version 1) — written at the end of every run, also failed/interrupted:
  format_version, status ("completed" | "failed" | "interrupted" | "stopped" | "pruned" — the
  last an `ortft hpo` trial ended by the median rule), error (one line or null),
  task, max_steps, parameters, trainable_parameters,
  provenance {ortft, python, platform, packages{}, recipe_sha256, git_commit, git_dirty,
  started_at, finished_at, device, threads, heap},
  paths {run_dir, final, [artifacts: ort-ondevice], recipe (the recipe file, absolute), onnx,
  checkpoints[], last_checkpoint},
  export {parity report, or null}, resumed_from,
  precision {dtype, skipped_steps} and distributed {world_size, ...} (not for ort-ondevice),
  backend {requested, used, fallback, fallback_reason, ort_exports,
  pytorch_kernels {kernel: routed ORT graph nodes} (ort; {} elsewhere), notes, and flat extras:
  with backend.name=auto probe {steps, backends{name: step times}, chosen}; ort-ondevice
  peak_rss_mb; a pretrained model's classification head (sequence- and token-classification,
  torch/ort/auto) head {old_labels, new_labels, action: "kept" | "reordered" (rows permuted to
  the data's label order) | "reinitialised" (other labels: a fresh head) | "new" (the
  checkpoint had none)}},
  steps, epochs, samples, tokens,
  metrics {train_loss, eval_loss, eval_accuracy, eval_f1_macro, eval_perplexity — those that apply;
  the eval metrics are those of the step final/ holds},
  throughput {samples_per_s, tokens_per_s, first_step_s, note}, train_time_s, wall_time_s,
  final ("last" | "best"), final_step, best_metric {name, mode, value, step} or null,
  stopped_early, stopped_at_step (training.early_stopping), stop_reason ("early_stopping" |
  "max_time" | null) — this selection block is absent for ort-ondevice runs,
  gates [{gate, metric, op, threshold, value, passed, reason}].

Readers take a ``RunSummary`` (``RunSummary.read(path)`` or ``RunSummary.from_dict(json)``)
and use its fields; keys this ortft does not know are kept in ``extra`` and written back.
Stdlib only: ort-ondevice runs and the tools read it without PyTorch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortft.backends.report import BackendReport, Precision, split_known
from ortft.core.errors import InputError
from ortft.core.reports import ExportReport

FORMAT_VERSION = 1


@dataclass
class RunPaths:
    run_dir: str
    final: str | None = None
    recipe: str | None = None  # the recipe file, absolute
    onnx: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    last_checkpoint: str | None = None
    artifacts: str | None = None  # ort-ondevice's training artifacts; omitted when None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_dir": self.run_dir, "final": self.final}
        if self.artifacts is not None:
            out["artifacts"] = self.artifacts
        out.update(
            recipe=self.recipe,
            onnx=self.onnx,
            checkpoints=self.checkpoints,
            last_checkpoint=self.last_checkpoint,
        )
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunPaths:
        known, extra = split_known(cls, d)
        known.setdefault("run_dir", "")
        return cls(**known, extra=extra)


@dataclass
class Provenance:
    """Where a run came from: versions, the recipe's hash and git state, times, device."""

    ortft: str | None = None
    python: str = ""
    platform: str = ""
    packages: dict[str, str | None] = field(default_factory=dict)
    recipe_sha256: str = ""
    git_commit: str | None = None
    git_dirty: bool | None = None  # tracked files changed since git_commit; None outside a repo
    started_at: str = ""
    finished_at: str | None = None
    device: str = ""
    threads: int = 0
    heap: str = ""  # hardware.heap as applied: ortft.env.heap.KEPT or "system"
    # ORTFT_* variables that change how the run trains (ortft.core.devenv), as they were set;
    # written only when one was
    developer_overrides: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def collect(
        cls, recipe_path: Path | None, recipe_sha256: str, device: str, threads: int
    ) -> Provenance:
        """This process's provenance, started now (``provenance.collect`` + device, threads)."""
        from ortft.run import provenance

        return cls.from_dict(
            {**provenance.collect(recipe_path, recipe_sha256), "device": device, "threads": threads}
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        if not self.developer_overrides:
            del out["developer_overrides"]
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Provenance:
        known, extra = split_known(cls, d)
        return cls(**known, extra=extra)


# Written only when the run has a selection block (final set): ort-ondevice runs have none.
_SELECTION = ("final", "final_step", "best_metric", "stopped_early", "stopped_at_step")
_NESTED = ("provenance", "paths", "backend", "precision", "extra")


@dataclass
class RunSummary:
    status: str = "running"
    error: str | None = None
    task: str = ""
    max_steps: int = 0
    parameters: int = 0
    trainable_parameters: int = 0
    provenance: Provenance = field(default_factory=Provenance)
    paths: RunPaths = field(default_factory=lambda: RunPaths(run_dir=""))
    backend: BackendReport | None = None
    export: ExportReport | None = None  # the export/parity report (its own schema)
    resumed_from: str | None = None
    precision: Precision | None = None  # None for ort-ondevice: omitted
    distributed: dict[str, Any] | None = None  # {"world_size": 1, ...}; None: omitted
    steps: int = 0
    epochs: float = 0.0
    samples: int = 0
    tokens: int = 0
    data: dict[str, Any] | None = None  # batching: padding mode, padding fraction, shapes
    metrics: dict[str, float | None] = field(default_factory=dict)
    throughput: dict[str, Any] = field(default_factory=dict)
    train_time_s: float = 0.0
    wall_time_s: float = 0.0
    final: str | None = None  # "last" | "best"
    final_step: int | None = None
    best_metric: dict[str, Any] | None = None
    stopped_early: bool = False
    stopped_at_step: int | None = None
    stop_reason: str | None = None
    gates: list[dict[str, Any]] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # keys this ortft does not know

    def to_dict(self) -> dict[str, Any]:
        """summary.json's object, keys in the order the runs have always written them."""
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "status": self.status,
            "error": self.error,
            "task": self.task,
            "max_steps": self.max_steps,
            "parameters": self.parameters,
            "trainable_parameters": self.trainable_parameters,
            "provenance": self.provenance.to_dict(),
            "paths": self.paths.to_dict(),
            "export": self.export,
            "resumed_from": self.resumed_from,
        }
        if self.precision is not None:
            out["precision"] = self.precision.to_dict()
        if self.distributed is not None:
            out["distributed"] = self.distributed
        if self.backend is not None:
            out["backend"] = self.backend.as_dict()
        out.update(
            steps=self.steps,
            epochs=self.epochs,
            samples=self.samples,
            tokens=self.tokens,
        )
        if self.data is not None:
            out["data"] = self.data
        out.update(
            metrics=self.metrics,
            throughput=self.throughput,
            train_time_s=self.train_time_s,
            wall_time_s=self.wall_time_s,
        )
        if self.final is not None:
            out.update({k: getattr(self, k) for k in _SELECTION})
        if self.final is not None or self.stop_reason is not None:
            out["stop_reason"] = self.stop_reason
        out["gates"] = self.gates
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        """Tolerant: missing keys take their defaults; unknown keys land in ``extra``."""
        known, extra = split_known(cls, d)
        for name in _NESTED:
            known.pop(name, None)
        backend, precision = d.get("backend"), d.get("precision")
        return cls(
            **known,
            provenance=Provenance.from_dict(d.get("provenance") or {}),
            paths=RunPaths.from_dict(d.get("paths") or {}),
            backend=BackendReport.from_dict(backend) if backend is not None else None,
            precision=Precision.from_dict(precision) if precision is not None else None,
            extra=extra,
        )

    @classmethod
    def coerce(cls, summary: RunSummary | Mapping[str, Any]) -> RunSummary:
        """A RunSummary from either form (a dict: summary.json as read, or an older caller's)."""
        return summary if isinstance(summary, RunSummary) else cls.from_dict(summary)

    @classmethod
    def read(cls, path: Path) -> RunSummary | None:
        """The summary at ``path``; None when absent or not JSON; InputError for another format."""
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(d, dict):
            return None
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise InputError(
                f"{path}: format_version {version} is not one this ortft reads "
                f"({FORMAT_VERSION}); use another --output-dir"
            )
        return cls.from_dict(d)

    def write(self, path: Path) -> None:
        """Atomically: a reader sees the old summary or the new one, never half of one."""
        from ortft.core import fsutil

        fsutil.write_json_atomic(Path(path), self.to_dict())

    def apply(self, changes: Mapping[str, Any]) -> None:
        """Set fields by name (e.g. ``Selector.report``'s); an unknown name is a KeyError."""
        names = {f.name for f in dataclasses.fields(self)}
        for key, value in changes.items():
            if key not in names:
                raise KeyError(f"RunSummary has no field {key!r}")
            setattr(self, key, value)
