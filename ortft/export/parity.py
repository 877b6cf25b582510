"""export.json: run an exported model on the parity samples, judge it against its reference,
and build the report, with one set of pass rules for every export.

The reference is PyTorch's fp32 logits (``export_model``), or the trained ONNX model itself
when there is no PyTorch model (an ``ort-ondevice`` run's final/). The rules:

- ``parity`` (``model.onnx``) and ``optimize`` (``model.opt.onnx``) keep the reference's
  precision: they pass when max |logits - reference| <= the tolerance (``--tolerance``,
  ``export.tolerance``; 1e-4 by default).
- ``fp16`` and ``int8`` are reduced precision, judged by predictions, not by max |diff| (their
  logits move by 1e-4 .. 1e-1 on a healthy model): the agreement of their predictions with the
  reference's must reach ``min_agreement`` and, when the samples have labels, their accuracy
  may fall by at most ``max_accuracy_drop`` below the reference's (``THRESHOLDS``). Without
  labels the accuracy is measured against the reference's predictions, which is the agreement
  again, so only the agreement is gated.
- ``training`` (``--training-artifacts``): the loss falls over three steps on one batch.

- ``preprocess`` (an image export's ``preprocess.onnx``): its pixel_values within its own
  tolerance of the image processor's (``ortft.families.vision.graphs``).

The export passes when every section it has passes; ``failures`` holds one line per section
that did not. ``publish`` writes export.json and swaps the folder in as OUT when it passed,
else as OUT.failed. Torch-free: ONNX Runtime and the converters are imported when used.

Over 450 lines: one set of pass rules for every export and every variant, applied where the
report is built; split, the rules and the report that applies them would read each other's keys.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from ortft.core import fsutil
from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.core.reports import ExportReport, ParityReport, Section
from ortft.export import onnx_tools as tools  # the converters

# 3: a question-answering graph gives start_logits and end_logits (2: one stacked logits), and
# encoder-decoders are encoder_model.onnx + decoder_model_merged.onnx with a cross-attention cache
EXPORT_FORMAT_VERSION = 3
THRESHOLDS = {
    "fp16": {"min_agreement": 0.99, "max_accuracy_drop": 0.01},
    "int8": {"min_agreement": 0.90, "max_accuracy_drop": 0.02},
    # int4 moves near-tied logits further: 0.875 on the task matrix's 2-step tiny Llama, 0.98
    # on a 29.3M one (docs/export.md); swapped nibbles gave 0.012
    "int4": {"min_agreement": 0.80, "max_accuracy_drop": 0.02},
}
QUANTIZE_CHOICES = ("int8", "int4")
# kind: (file, export.json "files" key); the order is the report's and the latency table's
VARIANTS = {
    "optimize": ("model.opt.onnx", "optimized"),
    "fp16": ("model.fp16.onnx", "fp16"),
    "int8": ("model.int8.onnx", "int8"),
    "int4": ("model.int4.onnx", "int4"),
}
LATENCY_BATCH, LATENCY_REPEATS = 8, 10


# --------------------------------------------------------------------------- running and judging


def session(path: Path, threads: int = 0) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def empty_past(sess: Any, batch: int) -> dict[str, np.ndarray]:
    """A decoder's past with 0 positions, one per past input (``ortft.export.decoder``): the
    graph then runs on the whole sequence. Empty for a graph without a KV cache."""
    return {
        i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
        for i in sess.get_inputs()
        if i.name.startswith("past_key_values")
    }


def session_feeds(sess: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What ``sess`` takes of ``feeds``, with an empty past for a decoder with a KV cache."""
    names = {i.name for i in sess.get_inputs()}
    out = {k: v for k, v in feeds.items() if k in names}
    return {**out, **empty_past(sess, len(next(iter(out.values()))))}


def run(
    path: Path, feeds: dict[str, np.ndarray], outputs: Sequence[str] = ("logits",)
) -> np.ndarray:
    return graph_logits(session(path), feeds, outputs, str(path)).astype(np.float32)


def graph_logits(
    sess: Any,
    feeds: dict[str, np.ndarray],
    outputs: Sequence[str] = ("logits",),
    where: str = "the ONNX graph",
) -> np.ndarray:
    """A graph's logits: its ``outputs``, several stacked on axis 1 (a question-answering
    export's start_logits and end_logits: [batch, 2, sequence], as ``protocols.ReadsOutput``
    stacks the model's). A graph of format 2 gave that stack as one ``logits`` output: it is
    read as it is. A graph with neither is an input error (``where``: the graph's file)."""
    have = [o.name for o in sess.get_outputs()]
    if not set(outputs) <= set(have) and "logits" in have:  # format 2: stacked in the graph
        outputs = ("logits",)
    if not set(outputs) <= set(have):
        raise InputError(
            f"{where} gives {', '.join(have)}, not {', '.join(outputs)}: "
            "re-export it with `ortft export RUN`"
        )
    got = sess.run(list(outputs), session_feeds(sess, feeds))
    return got[0] if len(got) == 1 else np.stack(got, axis=1)


def predictions(
    logits: np.ndarray, feeds: dict[str, np.ndarray], positions: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """(predicted ids, labels or None) at the positions that count.

    ``positions``: "row" (one prediction per row: classification), "token" (every position with a
    label, else every unpadded one) or "next-token" (causal LM: the prediction at t against the
    label at t + 1, where that label is real).
    """
    labels = feeds.get("labels")
    if positions == "row":
        return logits.argmax(-1), labels
    if positions == "token":
        keep = feeds["attention_mask"].astype(bool)
        if labels is not None:
            keep &= labels != IGNORE_INDEX
        return logits.argmax(-1)[keep], (labels[keep] if labels is not None else None)
    pred = logits[:, :-1].argmax(-1)
    target = labels[:, 1:] if labels is not None else feeds["input_ids"][:, 1:]
    keep = feeds["attention_mask"][:, 1:].astype(bool) & (target != IGNORE_INDEX)
    return pred[keep], (target[keep] if labels is not None else None)


def judge(
    got: np.ndarray, ref: np.ndarray, feeds: dict[str, np.ndarray], positions: str
) -> dict[str, Any]:
    """Prediction agreement with ``ref`` and the accuracy delta, against labels when there are
    any, else against ``ref``'s predictions (then the delta is just agreement - 1)."""
    p_got, labels = predictions(got, feeds, positions)
    p_ref, _ = predictions(ref, feeds, positions)
    if labels is not None and labels.shape != p_ref.shape:  # labels of another kind (e.g. spans)
        labels = None
    truth = labels if labels is not None else p_ref
    acc_got, acc_ref = float(np.mean(p_got == truth)), float(np.mean(p_ref == truth))
    return {
        "max_abs_diff": float(np.max(np.abs(got - ref))),
        "prediction_agreement": float(np.mean(p_got == p_ref)),
        "accuracy": round(acc_got, 6),
        "accuracy_fp32": round(acc_ref, 6),
        "accuracy_delta": round(acc_got - acc_ref, 6),
        "accuracy_against": "labels" if labels is not None else "fp32 predictions",
    }


def latency_ms(
    paths: dict[str, Path], feeds: dict[str, np.ndarray], repeats: int = 20
) -> dict[str, dict[str, float]]:
    """Median ms per batch ("run") and session creation ms ("load"), the models taken in turn
    (interleaved) on one thread so that a busy machine slows them alike.

    Sessions use ORT's default options, as a user's would: ORT then applies its online graph
    optimizations to every model, so an offline-optimized file mostly saves load time.
    """
    load: dict[str, float] = {}
    sessions = {}
    for k, p in paths.items():
        t0 = time.perf_counter()
        sessions[k] = session(p, threads=1)
        load[k] = round((time.perf_counter() - t0) * 1e3, 1)
    inputs = {k: session_feeds(s, feeds) for k, s in sessions.items()}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for i in range(repeats + 2):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, inputs[k])
            if i >= 2:  # the first runs allocate
                times[k].append((time.perf_counter() - t0) * 1e3)
    run_ms = {k: round(statistics.median(v), 3) for k, v in times.items()}
    return {"run": run_ms, "load": load}


def dir_bytes(path: Path, stem: str) -> int:
    """A model's size: its .onnx file plus any external data written next to it."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file() and f.name.startswith(stem))


# --------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Reference:
    """What every model file of one export is judged against."""

    feeds: dict[str, np.ndarray]  # the model's inputs, and labels when the samples have them
    logits: np.ndarray  # the reference model's output on ``feeds``
    positions: str  # see ``predictions``
    tolerance: float  # max |diff| for the full-precision files
    source: str  # where the samples come from: "eval data" | "synthetic"
    names: tuple[str, ...] = (
        "input_ids",
        "attention_mask",
    )  # the graph's inputs (images: pixel_values)
    outputs: tuple[str, ...] = ("logits",)  # the graph's, stacked as ``logits`` (graph_logits)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        return {k: self.feeds[k] for k in self.names}

    def judge(self, path: Path) -> dict[str, Any]:
        got = run(path, self.inputs, self.outputs)
        return judge(got, self.logits, self.feeds, self.positions)


def wanted(optimize: bool, fp16: bool, quantize: str | None) -> list[str]:
    """The variants asked for, in ``VARIANTS`` order; an unknown ``quantize`` is an input error."""
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise InputError(f"--quantize {quantize}: choose one of {', '.join(QUANTIZE_CHOICES)}")
    asked = {
        "optimize": optimize,
        "fp16": fp16,
        "int8": quantize == "int8",
        "int4": quantize == "int4",
    }
    return [kind for kind in VARIANTS if asked[kind]]


def passed(kind: str, rep: Mapping[str, Any]) -> bool:
    """The pass rule of one section (see the module docstring)."""
    limit = THRESHOLDS.get(kind)
    if limit is None:  # full precision: parity, optimize
        return bool(rep["max_abs_diff"] <= rep["tolerance"])
    return bool(
        rep["prediction_agreement"] >= limit["min_agreement"]
        and (
            rep["accuracy_against"] != "labels"
            or rep["accuracy_delta"] >= -limit["max_accuracy_drop"]
        )
    )


def teacher_forced(
    got: np.ndarray, want: np.ndarray, labels: np.ndarray, tolerance: float, source: str
) -> ParityReport:
    """export.json's ``parity`` of an encoder-decoder (seq2seq, speech): the ONNX decoder's
    teacher-forced logits against PyTorch's, judged on the label positions."""
    targets = {"attention_mask": (labels != IGNORE_INDEX).astype(np.int64), "labels": labels}
    j = judge(got, want, targets, "token")
    section: ParityReport = {
        "samples": int(len(labels)),
        "source": source,
        "against": "teacher-forced logits",
        "max_abs_diff": j["max_abs_diff"],
        "prediction_agreement": j["prediction_agreement"],
        "tolerance": tolerance,
    }
    section["passed"] = passed("parity", section)
    return section


def failures(result: ExportReport) -> list[str]:
    """One line per section of ``result`` that did not pass, in report order."""
    out = []
    for kind in ("parity", *VARIANTS):
        rep = cast("Section | None", result.get(kind))  # parity or a variant's section
        if rep is None or rep["passed"]:
            continue
        if kind in THRESHOLDS:
            limit = THRESHOLDS[kind]
            out.append(
                f"{kind}: agreement {rep['prediction_agreement']:.3f} (min {limit['min_agreement']}), "
                f"accuracy delta {rep['accuracy_delta']:+.3f} (max drop {limit['max_accuracy_drop']})"
            )
        else:
            out.append(f"{kind}: max |diff| {rep['max_abs_diff']:.2e} > {rep['tolerance']:g}")
    generation = result.get("generation")
    if generation is not None and not generation["passed"]:
        out.append(
            f"generation with the KV cache: {generation['mismatches']} prompt(s) diverged from "
            f"PyTorch's generate, max |diff| {generation['max_abs_diff']:.2e} "
            f"({generation['steps_compared']} steps compared)"
        )
    for rt in result.get("runtimes", []):
        if not rt.get("passed", True):
            out.append(
                f"onnxruntime {rt['version']}: outputs differ from this build's by "
                f"{rt['max_abs_diff']:.2e}"
            )
    pre = result.get("preprocess")  # an image export's preprocess.onnx (families/vision)
    if pre is not None and not pre.get("passed", True):
        why = pre.get("problem") or f"max |diff| {pre['max_abs_diff']:.2e} > {pre['tolerance']:.2e}"
        out.append(f"preprocess.onnx: {why} from the image processor's pixel_values")
    # a speech export's features.onnx (``ortft.families.speech.graphs``)
    feats = result.get("features")
    if feats is not None and not feats.get("passed", True):
        out.append(
            f"features.onnx: max |diff| {feats['max_abs_diff']:.2e} > {feats['tolerance']:.0e} "
            "from the feature extractor's input_features"
        )
    training = result.get("training")
    if training is not None and not training["check"]["passed"]:
        out.append(f"training artifacts: loss did not fall {training['check']['losses']}")
    return out


def finish(result: ExportReport) -> ExportReport:
    result["failures"] = failures(result)
    result["passed"] = not result["failures"]
    return result


# --------------------------------------------------------------------------- the report


def build_report(
    folder: Path,
    ref: Reference,
    *,
    task: str,
    model_type: str | None,
    opset: int,
    kinds: Sequence[str] = (),
    export_s: float | None = None,
    against: str | None = None,
    independent: bool | None = None,
) -> ExportReport:
    """export.json for ``folder/model.onnx``: its parity section, then one section per variant
    in ``kinds`` (each written next to it) and their latency. ``finish`` adds the verdict."""
    path = folder / "model.onnx"
    j = ref.judge(path)
    parity: ParityReport = {"samples": int(len(ref.logits)), "source": ref.source}
    if against:
        parity["against"] = against
    if independent is not None:  # ort-ondevice source: was the reference computed apart?
        parity["independent"] = independent
    parity["max_abs_diff"] = j["max_abs_diff"]
    parity["prediction_agreement"] = j["prediction_agreement"]
    parity["tolerance"] = ref.tolerance
    parity["passed"] = passed("parity", parity)
    result: ExportReport = {
        "format_version": EXPORT_FORMAT_VERSION,
        "task": task,
        "model_type": model_type,
        "opset": opset,
        "files": {"model": path.name},
        "bytes": dir_bytes(folder, path.name),
    }
    if export_s is not None:
        result["export_s"] = round(export_s, 3)
    result["inputs"], result["outputs"] = list(ref.names), list(ref.outputs)
    result["parity"] = parity
    files = {kind: _variant(kind, folder, ref, result["bytes"]) for kind in kinds}
    for kind, file in files.items():
        cast("dict[str, Section]", result)[kind] = file.pop("report")  # a VARIANTS key
        result["files"][VARIANTS[kind][1]] = file["path"].name
    if files:
        result["latency"] = _latency(
            {"fp32": path, **{VARIANTS[k][1]: f["path"] for k, f in files.items()}}, ref
        )
    return result


def _variant(kind: str, folder: Path, ref: Reference, fp32_bytes: int) -> dict[str, Any]:
    """Write one variant of ``folder/model.onnx`` and judge it: {"path", "report"}."""
    import onnx

    from ortft.export import int4

    convert = {
        "optimize": tools.optimize,
        "fp16": tools.to_fp16,
        "int8": tools.quantize_int8,
        "int4": int4.quantize,
    }
    dst = folder / VARIANTS[kind][0]
    rep = convert[kind](folder / "model.onnx", dst)
    onnx.checker.check_model(str(dst))
    rep.update(ref.judge(dst))
    size = dir_bytes(folder, dst.name)
    rep.update(
        THRESHOLDS.get(kind, {"tolerance": ref.tolerance}),
        bytes=size,
        size_ratio=round(size / fp32_bytes, 3),
    )
    rep["passed"] = passed(kind, rep)
    return {"path": dst, "report": rep}


def _latency(paths: dict[str, Path], ref: Reference) -> dict[str, Any]:
    small = {k: v[:LATENCY_BATCH] for k, v in ref.inputs.items()}
    timing = latency_ms(paths, small, repeats=LATENCY_REPEATS)
    ms = timing["run"]
    return {
        "batch": list(small[ref.names[0]].shape),
        "threads": 1,
        "method": f"median of {LATENCY_REPEATS} interleaved runs, default session options",
        "ms": ms,
        "session_load_ms": timing["load"],
        "speedup_vs_fp32": {k: round(ms["fp32"] / v, 3) for k, v in ms.items() if k != "fp32"},
    }


# --------------------------------------------------------------------------- the folder


def check_output(out: Path) -> None:
    """OUT must be creatable and, if it exists, an earlier export (it gets replaced)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "export.json").exists():
        raise InputError(f"{out}: exists and is not an ortft export folder; choose another -o")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{out}: cannot create its parent folder ({err.strerror})") from None
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot write in {out.parent} (permission denied)")


def _staging(out: Path) -> Path:
    check_output(out)
    tmp = fsutil.temp_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as err:
        raise InputError(f"{out}: cannot write there ({err.strerror})") from None
    return tmp


def publish(out: Path, build: Callable[[Path], ExportReport]) -> ExportReport:
    """Fill a staging folder beside OUT with ``build`` (which returns the report), write
    export.json, then swap the folder in as OUT when every check passed, else as OUT.failed
    (OUT is then left as it was). An earlier OUT is replaced only once the new one is whole."""
    tmp = _staging(out)
    failed = out.with_name(out.name + ".failed")
    try:
        result = finish(build(tmp))
        (tmp / "export.json").write_text(json.dumps(result, indent=2) + "\n")
        final = out if result["passed"] else failed
        fsutil.promote(tmp, final)
        if result["passed"]:
            shutil.rmtree(failed, ignore_errors=True)  # an earlier attempt's leftovers
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result["dir"] = str(final)
    result["model"] = str(final / next(iter(result["files"].values())))
    return result
