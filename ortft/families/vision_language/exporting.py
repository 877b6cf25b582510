"""The exporter's side of the vision-language export: ``ortft train`` (``export.enabled``) and
``ortft export`` call ``export_builder``, whose builder the exporter publishes as it publishes
every family's (``parity.publish``: staged, swapped in as OUT, or kept as OUT.failed when a
gate fails). The graphs and their checks are ``export._Build``'s; this module turns the run's
held-out rows into the checks' images and prompts, adds the feeds another onnxruntime is
checked on (``--check-runtime``), and the model card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError, RunError, first_line
from ortft.core.reports import ExportReport

# held-out rows the checks run on: each one is traced through the three graphs and generated
# from in numpy against generate, so a few keep the export's time small
CHECK_ROWS = 4
QUESTION = "Which digit is this?"  # the card's example (an image.png beside it)


def samples_of(task: Any, encoded: Any) -> list[Any] | None:
    """The first ``CHECK_ROWS`` held-out rows as the checks' (image, prompt): the image file
    decoded, the prompt the row's tokens before its last answer with the image's expansion
    (``task.expansion`` of the row's image) folded back to the one image token the processor expands; None: no
    rows (synthetic ones are used)."""
    from ortft.data import images
    from ortft.families.vision_language.export import Sample
    from ortft.families.vision_language.task import PATH, START

    if encoded is None or not len(encoded):
        return None
    tok, image_id = task.processor.tokenizer, task.processor.image_token_id
    out = []
    for j in range(min(CHECK_ROWS, len(encoded))):
        ids = encoded.column("input_ids")[j, : int(encoded.column(START)[j])].tolist()
        path = encoded.column(PATH)[j].decode()
        folded = fold(ids, task.expansion(path), image_id)  # a Qwen2-VL image's own grid
        prompt = tok.decode(folded, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        image = images.load(path)
        out.append(Sample(image, prompt))
    return out


def fold(ids: list[int], expansion: list[int], image_id: int) -> list[int]:
    """``ids`` with each run of ``expansion`` replaced by ``image_id``."""
    out, k, n = [], 0, len(expansion)
    while k < len(ids):
        if ids[k : k + n] == expansion:
            out.append(image_id)
            k += n
        else:
            out.append(ids[k])
            k += 1
    return out


def export_builder(
    task: Any, model: Any, processor: Any, opset: int, tolerance: float, samples: Any, options: Any
) -> Any:
    """vision_encoder.onnx, embed_tokens.onnx and decoder_model_merged.onnx (``export``), each
    checked against PyTorch and by generating, then in the other runtimes the options name."""
    from ortft.export.exporter import finished
    from ortft.export.parity import wanted
    from ortft.families.vision_language import export

    if wanted(options.optimize, options.fp16, options.quantize) or options.training is not None:
        raise InputError(
            f"{task.name} exports the vision, embedding and decoder graphs only: --optimize, "
            "--fp16, --quantize and --training-artifacts are for single-graph models"
        )
    task.bind(processor)
    rows = samples_of(task, samples)
    job = export.builder(model, processor, opset=opset, tolerance=tolerance, samples=rows)

    def build(tmp: Path) -> ExportReport:
        try:
            result = job.build(tmp)
        except RuntimeError as err:  # the tracer's failures
            raise RunError(f"ONNX export (opset {opset}) failed: {first_line(err)}") from err
        feeds = runtime_feeds(job)
        config, length = job.model.config, options.max_length
        return finished(
            tmp, result, feeds, tolerance, options, task.name, processor, config, length
        )

    return build


def runtime_feeds(job: Any) -> dict[str, np.ndarray]:
    """The feeds ``--check-runtime`` runs each graph on (``deploy.graph_feeds`` picks each
    graph's): the first row's pixels and prompt, its embeddings and positions, its decoded
    image (preprocess.onnx's ``image``)."""
    import torch

    from ortft.families.vision_language import vlm_graphs as graphs

    x = job.inputs[0]
    ids = x["input_ids"]
    with torch.no_grad():
        embeds = graphs.EmbedTokens(job.model).eval()(ids).numpy()
    mask = x["attention_mask"].numpy().astype(np.int64)
    return {
        **job.layout.vision_feeds(x),
        "input_ids": ids.numpy(),
        "attention_mask": mask,
        "inputs_embeds": embeds,
        "position_ids": graphs.positions_of(mask, mask.shape[1]),
        "image": np.asarray(job.rows[0].image.convert("RGB"), dtype=np.uint8),
    }


def card(report: ExportReport) -> tuple[str, str, str, str]:
    """The card's (snippet, what else the folder holds, the inputs line, what the snippet
    needs): ``deploy.write_card``."""
    holds = (
        "the processor (`processor_config.json`, `preprocessor_config.json`: the image "
        "processor; the tokenizer files and the chat template), `generation_config.json`"
    )
    g = report.get("generation", {})
    inputs = (
        "- **Graphs:** `onnx/vision_encoder.onnx` (`pixel_values` → `image_features`), "
        "`onnx/embed_tokens.onnx` (`input_ids` → `inputs_embeds`), "
        "`onnx/decoder_model_merged.onnx` (`inputs_embeds`, `attention_mask`, `position_ids` "
        "and the KV cache → `logits`); the image features replace the image tokens' "
        f"embeddings in order. Parity max |diff| {report['parity']['max_abs_diff']:.2e}; "
        f"greedy generation equal to PyTorch's: {g.get('passed')}."
    )
    inputs += "\n" + _preprocess_line(report.get("preprocess") or {})
    from ortft.families.vision_language import archs

    code = archs.of_type(report.get("model_type")).card().format(question=QUESTION)
    return (
        code,
        holds,
        inputs,
        "`onnxruntime`, `numpy`, `Pillow` and `transformers` (the processor)",
    )


def _preprocess_line(pre: dict[str, Any]) -> str:
    """The card's line on ``onnx/preprocess.onnx``, or on why the export has none."""
    from ortft.families.vision_language.vlm_graphs import PREPROCESS

    if not pre.get("exported"):
        return (
            f"- **Preprocessing:** no `{PREPROCESS}` ({pre.get('reason')}): run the image "
            'processor, loaded with `backend="pil"` (what training used), for `pixel_values`.'
        )
    return (
        f"- **Preprocessing:** `{PREPROCESS}` takes the decoded RGB image (`image`, uint8 "
        "[height, width, 3], any size) and gives the vision encoder's `pixel_values` "
        f"({pre['output'].split(': ', 1)[1]}) as the image processor does: checked on "
        f"{pre['images']} images, max |diff| {pre['max_abs_diff']:.2e} (at most one pixel "
        f"step: {pre['tolerance']:.2e}). With it, a client needs onnxruntime, numpy, Pillow "
        "and tokenizers alone: tokenize the chat-templated prompt (`tokenizer.json`), repeat "
        "the image token once per image feature, then the loop below."
    )


class OnnxVisionLanguage:
    """The export's three graphs as ``ortft predict`` and ``ortft eval`` run them: greedy
    answers through ``ortft.export.generation`` (the loop the export's generation check runs
    against ``generate``), and teacher-forced logits of a collated batch."""

    def __init__(self, folder: Path, config: Any):
        from transformers import GenerationConfig

        from ortft.families.vision_language import archs
        from ortft.families.vision_language import vlm_graphs as graphs

        self.config = config
        self.arch = archs.of_type(getattr(config, "model_type", None))
        self.sessions = graphs.Sessions(folder, int(config.image_token_id))
        self.gc = GenerationConfig.from_pretrained(folder)
        text = config.get_text_config()
        self.positions = getattr(text, "max_position_embeddings", None)

    def sequences(self, ids: np.ndarray, vision: dict[str, np.ndarray], max_new: int) -> np.ndarray:
        """``generate``'s sequences (prompt, then the answer) of prompts of one length, on the
        rows' image arrays (``archs.Arch.pixels``; the vision graph's feeds and the decoding
        steps of the architecture: ``archs.Arch.onnx_feeds``, ``onnx_steps``)."""
        import copy

        from ortft.export import generation as gen

        gc = copy.deepcopy(self.gc)
        gc.update(max_new_tokens=max_new, do_sample=False, num_beams=1)
        p = gen.plan(gc, ids.shape[1], encoder_decoder=False, max_positions=self.positions)
        feeds = self.arch.onnx_feeds(vision)
        steps = self.arch.onnx_steps(self.sessions, self.config, feeds)
        seq, _ = gen.generate(steps, np.asarray(ids, dtype=np.int64), p)
        return seq

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """A right-padded batch's logits: its image features at its image tokens, an empty
        past."""
        from ortft.export import parity
        from ortft.families.vision_language import vlm_graphs as graphs

        s, ids = self.sessions, batch["input_ids"].astype(np.int64)
        mask = batch["attention_mask"].astype(np.int64)
        vision = self.arch.onnx_feeds({k: batch[k] for k in self.arch.pixel_keys if k in batch})
        features = s.image_features(**vision)
        positions = self.arch.onnx_positions(ids, mask, vision, self.config)
        feeds = {
            "inputs_embeds": graphs.merge(s.embeds(ids), ids, features, s.image_token),
            "attention_mask": mask,
            "position_ids": positions,
            **parity.empty_past(s.decoder, len(ids)),
        }
        return s.decoder.run(["logits"], feeds)[0]
