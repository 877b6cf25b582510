"""A bare encoder's export (feature extraction): the token vectors and the pooled sentence
embedding, both checked against PyTorch.

- ``model.onnx``: ``input_ids``, ``attention_mask`` int64 [batch, sequence] (both axes dynamic)
  -> ``last_hidden_state`` float32 [batch, sequence, hidden] and ``sentence_embedding`` float32
  [batch, hidden]. The pooling is the folder's (``pooling``: sentence-transformers'
  ``modules.json`` and ``1_Pooling/config.json``): ``mean`` over the positions where the mask
  is 1, ``cls`` (the first position) or ``max`` (masked positions excluded), L2-normalised when
  ``modules.json`` lists ``Normalize``; mean without normalisation for a plain encoder.
- Parity (export.json's ``parity``, the rule of every fp32 export: ``ortft.export.parity``):
  max |diff| of each output against PyTorch (the encoder, then ``pool``) within the tolerance,
  on the parity rows (held-out rows, else synthetic ones of random lengths, padded at the
  end, so that the mask matters). A failure fails the export as it does for logits.
- The tokenizer has no padding and truncates where sentence-transformers does
  (``max_seq_length``), else at the model's position limit; the model card's snippet pads a
  batch itself and passes its mask.

Only the fp32 graph: ``--optimize``, ``--fp16``, ``--quantize`` and ``--training-artifacts`` are
judged by predicted labels, which an embedding has none of (refused, ``refuse``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortft.core.errors import InputError
from ortft.core.reports import ExportReport, ParityReport
from ortft.export import deploy, generation, js_card, layout, parity, rows
from ortft.export import onnx_tools as tools
from ortft.families.embedding.pooling import Pooling, pool_tokens
from ortft.families.embedding.task import CARD_TEXTS, FEATURE_EXTRACTION, js_call

# export.json's task for an encoder exported without a task (a task that trains embeddings
# passes its own name, with export kind "embedding")
TASK = FEATURE_EXTRACTION
MODEL = "model.onnx"
INPUTS = ("input_ids", "attention_mask")
OUTPUTS = ("last_hidden_state", "sentence_embedding")
AXES = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "last_hidden_state": {0: "batch", 1: "sequence"},
    "sentence_embedding": {0: "batch"},
}


def bare_encoder(config: Any) -> bool:
    """Whether ``config`` is a text encoder without a task head (``BertModel``, ``XLMRobertaModel``
    ...): what ``AutoModel`` builds. Encoder-decoders and models without a vocabulary (vision)
    are not."""
    archs = getattr(config, "architectures", None) or []
    return (
        bool(archs)
        and all(a.endswith("Model") and "For" not in a and "LMHead" not in a for a in archs)
        and not getattr(config, "is_encoder_decoder", False)
        and isinstance(getattr(config, "vocab_size", None), int)
    )


def refuse(task: str, options: Any) -> None:
    """A one-line InputError for what this export does not write (see the module docstring)."""
    asked = [
        flag
        for flag, on in (
            ("--optimize", options.optimize),
            ("--fp16", options.fp16),
            ("--quantize", options.quantize),
            ("--training-artifacts", options.training is not None),
        )
        if on
    ]
    if asked:
        raise InputError(
            f"{task} exports the fp32 graph only: {', '.join(asked)} "
            "(judged by predicted labels) do not apply to embeddings"
        )


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """One vector per row of ``hidden`` [batch, sequence, hidden], as sentence-transformers'
    Pooling and Normalize modules compute it."""
    out = pool_tokens(hidden, mask, pooling.mode)
    return torch.nn.functional.normalize(out, p=2, dim=1) if pooling.normalize else out


class Pooled(torch.nn.Module):
    """The encoder, then ``pool``: (last_hidden_state, sentence_embedding)."""

    def __init__(self, model: torch.nn.Module, pooling: Pooling):
        super().__init__()
        self.model, self.pooling = model, pooling

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        hidden = out.last_hidden_state
        return hidden, pool(hidden, attention_mask, self.pooling)


class EncoderGraph:
    """``build`` fills the staging folder (model.onnx, the clients' tokenizer, config.json, the
    card) and returns export.json's sections; ``runtimes`` lists the runtimes it was checked in
    (``exporter.other_runtimes``, called before the card, which lists them)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        options: Any,
        *,
        task: str,
        opset: int,
        tolerance: float,
        samples: Any,
        n: int,
    ):
        refuse(task, options)
        self.model, self.tokenizer, self.options, self.task = model, tokenizer, options, task
        self.pooling = options.pooling or Pooling()
        self.opset, self.tolerance = opset, tolerance
        self.feeds = rows.parity_feeds(samples, tokenizer, n)
        self.example = rows.tracing_example(self.feeds, tokenizer)
        self.source = rows.samples_source(samples)
        # eval() on the wrapper too: torch.onnx.export restores the wrapper's own mode
        self.wrapper = Pooled(model, self.pooling).eval()

    def build(
        self, tmp: Path, runtimes: Callable[[Path, ExportReport], ExportReport]
    ) -> ExportReport:
        export_s = tools.torch_export(
            self.wrapper, self.example, tmp / MODEL, self.opset, INPUTS, OUTPUTS, AXES
        )
        inputs = {k: self.feeds[k] for k in INPUTS}
        with torch.no_grad():
            want = [t.numpy() for t in self.wrapper(*map(torch.from_numpy, inputs.values()))]
        got = parity.session(tmp / MODEL).run(list(OUTPUTS), inputs)
        self.tokenizer.save_pretrained(tmp)
        generation.save(self.model, tmp)  # config.json
        result: ExportReport = {
            "format_version": parity.EXPORT_FORMAT_VERSION,
            "task": self.task,
            "model_type": getattr(self.model.config, "model_type", None),
            "opset": self.opset,
            "files": {"model": MODEL},
            "bytes": parity.dir_bytes(tmp, MODEL),
            "export_s": round(export_s, 3),
            "inputs": list(INPUTS),
            "outputs": list(OUTPUTS),
            "pooling": self.pooling.describe(),
            "parity": self.parity(got, want),
        }
        return self.deployable(tmp, runtimes(tmp, result))

    def parity(self, got: list[np.ndarray], want: list[np.ndarray]) -> ParityReport:
        """export.json's ``parity``: each output's max |diff| (the largest is gated), the
        embeddings' lowest cosine with PyTorch's and, normalised, their largest |norm - 1|."""
        diffs = {
            k: float(np.max(np.abs(g - w))) for k, g, w in zip(OUTPUTS, got, want, strict=True)
        }
        emb, ref = got[1].astype(np.float64), want[1].astype(np.float64)
        cosine = (emb * ref).sum(1) / np.maximum(
            np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1), 1e-12
        )
        section: ParityReport = {
            "samples": int(len(want[1])),
            "source": self.source,
            "against": f"PyTorch: the encoder, then {self.pooling.mode} pooling"
            + (" and L2 normalisation" if self.pooling.normalize else ""),
            "max_abs_diff": max(diffs.values()),
            "outputs": {k: {"max_abs_diff": v} for k, v in diffs.items()},
            "min_cosine": float(cosine.min()),
            "tolerance": self.tolerance,
        }
        if self.pooling.normalize:
            section["max_norm_error"] = float(np.max(np.abs(np.linalg.norm(emb, axis=1) - 1)))
        section["passed"] = parity.passed("parity", section)
        return section

    def deployable(self, tmp: Path, result: ExportReport) -> ExportReport:
        """The folder made ready for clients, as ``exporter.deployable`` makes a task's: the IR
        version, the tokenizer without training's padding (truncating at ``max_seq_length``),
        the model card."""
        result["ir_version"] = deploy.ir_version(tmp / MODEL)
        limits = [
            n for n in (self.pooling.max_seq_length, deploy.model_limit(self.model.config)) if n
        ]
        result["tokenizer"] = deploy.clean_tokenizer(
            tmp, min(limits) if limits else None, self.options.max_length
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        (tmp / "README.md").write_text(card(result, pad, self.tokenizer.pad_token or "[PAD]"))
        result["files"]["card"] = "README.md"
        return layout.with_links(tmp, result)


# --------------------------------------------------------------------------- the model card

# The card's snippet (tests/test_consumer.py runs it verbatim): a padded batch of two texts and
# its mask, then their cosine similarity
_SNIPPET = """import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tok = Tokenizer.from_file("tokenizer.json")
tok.enable_padding(pad_id={pad_id}, pad_token={pad_token})  # a batch: pad to its longest text
session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
texts = {texts}{lower}
enc = tok.encode_batch(texts)
ids = np.array([e.ids for e in enc], dtype=np.int64)
mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
emb = session.run(["sentence_embedding"], {{"input_ids": ids, "attention_mask": mask}})[0]
emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)  # cosine similarity of the two texts
print(f"{{float(emb[0] @ emb[1]):.4f}}")
"""


def snippet(pad_id: int, pad_token: str, lowercase: bool) -> str:
    return _SNIPPET.format(
        pad_id=pad_id,
        pad_token=json.dumps(pad_token),
        texts=json.dumps(list(CARD_TEXTS)),
        lower="\ntexts = [t.lower() for t in texts]  # sentence_bert_config.json: do_lower_case"
        if lowercase
        else "",
    )


def card(report: ExportReport, pad_id: int, pad_token: str) -> str:
    """README.md of the export folder: what the graph gives and the usage snippet."""
    p = report["pooling"]
    how = {
        "mean": "the mean of the token vectors where `attention_mask` is 1",
        "cls": "the first token's vector",
        "max": "the per-dimension max over the token vectors where `attention_mask` is 1",
    }[p["mode"]]
    runtimes = "; ".join(
        f"{r['package']} {r['version']} ({r['checked']})" for r in report["runtimes"]
    )
    truncation = report["tokenizer"]["truncation"] or "no limit"
    code = snippet(pad_id, pad_token, p["lowercase"])
    call = js_call(report)
    js = js_card.section(*call) if call is not None else ""
    source = p["source"] if p["source"].startswith("default") else f"from {p['source']}"
    return f"""---
library_name: onnxruntime
tags: [ortft, onnx, {report["task"]}, sentence-embeddings]
---
# ONNX export (ortft)

- **Task:** {report["task"]} (the encoder's token vectors and one pooled vector per text)
- **Files:** `{MODEL}`, the tokenizer (`tokenizer.json`), `config.json`, `export.json` (checks)
- **ONNX:** opset {report["opset"]}, IR version {report["ir_version"]}
- **Checked in:** {runtimes}
- **Outputs:** `last_hidden_state` [batch, sequence, hidden] and `sentence_embedding` [batch,
  hidden]: {how}{", L2-normalised" if p["normalize"] else ", not normalised"} ({source}).
- **Tokenizer:** no padding; truncates at {truncation} tokens. Pad a batch and pass its
  attention mask: padded positions do not count.

Usage with `onnxruntime` and `tokenizers` only, run from this folder:

{deploy.CARD_FENCE}
{code}```
{js}"""
