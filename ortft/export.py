"""ONNX export with an always-on parity check against PyTorch.

The folder it writes is self-contained: ``model.onnx`` (inputs ``input_ids`` and
``attention_mask`` with dynamic batch and sequence axes, output ``logits``), the tokenizer,
the model config and ``export.json`` (the parity report).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.errors import GateError, InputError

log = logging.getLogger("ortft")

EXPORT_FORMAT_VERSION = 1
PARITY_SAMPLES = 16


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, is_decoder: bool):
        super().__init__()
        self.model, self.is_decoder = model, is_decoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kw = {"use_cache": False} if self.is_decoder else {}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True,
                          **kw).logits


def _samples(samples: Any, tokenizer: Any, n: int) -> dict[str, np.ndarray]:
    if samples is not None and len(samples):
        idx = np.arange(min(n, len(samples)))
        batch = samples.take(idx)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    # synthetic: random ids of modest length
    rng = np.random.default_rng(0)
    ids = rng.integers(0, len(tokenizer), size=(4, 32), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _tracing_example(feeds: dict[str, np.ndarray], tokenizer: Any) -> tuple[torch.Tensor, ...]:
    """Two rows, the second partly padded.

    The exporter traces one path through the model: transformers skips building the attention
    mask when a batch has no padding, and a graph traced that way would ignore
    ``attention_mask`` for good. A padded row keeps the masking in the graph.
    """
    ids = feeds["input_ids"][:2].copy()
    mask = feeds["attention_mask"][:2].copy()
    if len(ids) < 2:
        ids, mask = np.concatenate([ids, ids]), np.concatenate([mask, mask])
    cut = max(1, ids.shape[1] // 2)
    mask[1, cut:] = 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids[1, cut:] = pad
    return torch.from_numpy(ids), torch.from_numpy(mask)


def export_model(model: torch.nn.Module, tokenizer: Any, task: str, out_dir: Path, *, opset: int,
                 tolerance: float, samples: Any = None) -> dict[str, Any]:
    """Export ``model`` to ``out_dir/model.onnx``, check parity, write export.json."""
    import onnx
    import onnxruntime as ort

    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.eval().to("cpu")
    is_decoder = task == "causal-lm"
    # eval() on the wrapper itself: torch.onnx.export restores the wrapper's own mode after
    # exporting, and a wrapper left in training mode would switch dropout back on.
    wrapper = _LogitsOnly(model, is_decoder).eval()
    feeds = _samples(samples, tokenizer, PARITY_SAMPLES)
    example = _tracing_example(feeds, tokenizer)
    path = out_dir / "model.onnx"
    tmp = out_dir / f".model.onnx.tmp-{os.getpid()}"
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(
            wrapper, example, str(tmp), input_names=["input_ids", "attention_mask"],
            output_names=["logits"], opset_version=opset, do_constant_folding=True, dynamo=False,
            dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                          "attention_mask": {0: "batch", 1: "sequence"},
                          "logits": {0: "batch", 1: "sequence"} if is_decoder else {0: "batch"}},
        )
    os.replace(tmp, path)
    export_s = time.perf_counter() - t0
    onnx.checker.check_model(str(path))

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], feeds)[0]
    wrapper.eval()
    with torch.no_grad():
        want = wrapper(torch.from_numpy(feeds["input_ids"]),
                       torch.from_numpy(feeds["attention_mask"])).numpy()
    diff = float(np.max(np.abs(got - want)))
    if is_decoder:
        mask = feeds["attention_mask"].astype(bool)
        agree = float(np.mean(got.argmax(-1)[mask] == want.argmax(-1)[mask]))
    else:
        agree = float(np.mean(got.argmax(-1) == want.argmax(-1)))
    parity = {"samples": int(len(feeds["input_ids"])), "max_abs_diff": diff,
              "prediction_agreement": agree, "tolerance": tolerance,
              "passed": bool(diff <= tolerance)}
    tokenizer.save_pretrained(out_dir)
    model.config.save_pretrained(out_dir)
    result = {"format_version": EXPORT_FORMAT_VERSION, "model": str(path), "task": task,
              "opset": opset, "bytes": path.stat().st_size, "export_s": round(export_s, 3),
              "inputs": ["input_ids", "attention_mask"], "outputs": ["logits"], "parity": parity}
    (out_dir / "export.json").write_text(json.dumps(result, indent=2) + "\n")
    log.info("exported %s (parity: max |diff| %.2e, agreement %.3f)", path, diff, agree)
    return result


def _task_of(config: Any) -> str:
    archs = " ".join(getattr(config, "architectures", None) or [])
    if "SequenceClassification" in archs:
        return "sequence-classification"
    if "CausalLM" in archs or "LMHead" in archs:
        return "causal-lm"
    raise InputError(f"cannot tell the task of a {archs or 'model without architectures'}")


def export_source(source: Path, output: Path | None, *, opset: int, tolerance: float) -> dict[str, Any]:
    """``ortft export``: SOURCE is a run dir (uses final/), a checkpoint or an HF model dir."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from ortft import checkpoint

    if not source.exists():
        raise InputError(f"{source}: not found")
    model_dir = source / "final" if (source / "final").is_dir() else source
    weights_dir = model_dir
    if (model_dir / checkpoint.MANIFEST).exists():  # a checkpoint: config/tokenizer from its run
        problem = checkpoint.verify(model_dir, deep=True)
        if problem:
            raise InputError(f"{model_dir}: not a usable checkpoint: {problem}")
        model_dir = model_dir.parent / "final"
        if not model_dir.is_dir():
            raise InputError(f"{source}: exporting a checkpoint needs its run's final/ for the config")
    if not (model_dir / "config.json").exists():
        raise InputError(f"{model_dir}: no config.json (not a saved Hugging Face model)")
    config = AutoConfig.from_pretrained(model_dir)
    task = _task_of(config)
    auto = getattr(transformers, "AutoModelForSequenceClassification" if task ==
                   "sequence-classification" else "AutoModelForCausalLM")
    model = auto.from_pretrained(model_dir, attn_implementation="eager")
    if weights_dir != model_dir:
        from safetensors.torch import load_model

        load_model(model, str(weights_dir / "model.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = output or (source / "onnx")
    result = export_model(model, tokenizer, task, out, opset=opset, tolerance=tolerance)
    if not result["parity"]["passed"]:
        raise GateError(f"parity check failed: max |diff| {result['parity']['max_abs_diff']:.2e} "
                        f"> {tolerance:g} (report: {out / 'export.json'})")
    return result
