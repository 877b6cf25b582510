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
CARD = """import numpy as np
import onnxruntime as ort
from PIL import Image
from transformers import AutoProcessor  # the image processor, the chat template

processor = AutoProcessor.from_pretrained(".")
vision, embed, decoder = (
    ort.InferenceSession(f"onnx/{{n}}.onnx")
    for n in ("vision_encoder", "embed_tokens", "decoder_model_merged")
)
image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
messages = [{{"role": "user", "content": [{{"type": "image"}}, {{"type": "text", "text": "{question}"}}]}}]
prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
x = processor(images=[Image.open("image.png").convert("RGB")], text=[prompt], return_tensors="np")
ids = x["input_ids"]
emb = embed.run(None, {{"input_ids": ids}})[0]
features = vision.run(None, {{"pixel_values": x["pixel_values"].astype(np.float32)}})[0]
emb[ids == image_token] = features.reshape(-1, emb.shape[-1])  # the image tokens, in order
past = {{
    i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    for i in decoder.get_inputs() if i.name.startswith("past_key_values")
}}
answer, mask = [], np.ones((1, 0), np.int64)
for _ in range(16):  # greedy
    mask = np.ones((1, mask.shape[1] + emb.shape[1]), np.int64)
    pos = np.arange(mask.shape[1] - emb.shape[1], mask.shape[1])[None]
    out = decoder.run(None, {{"inputs_embeds": emb, "attention_mask": mask, "position_ids": pos, **past}})
    past = dict(zip(past, out[1:]))
    token = int(out[0][0, -1].argmax())
    if token == processor.tokenizer.eos_token_id:
        break
    answer.append(token)
    emb = embed.run(None, {{"input_ids": np.array([[token]])}})[0]
print(processor.tokenizer.decode(answer, skip_special_tokens=True))
"""


def samples_of(task: Any, encoded: Any) -> list[Any] | None:
    """The first ``CHECK_ROWS`` held-out rows as the checks' (image, prompt): the image file
    decoded, the prompt the row's tokens before its last answer with the expanded image tokens
    folded back to the one the processor expands; None: no rows (synthetic ones are used)."""
    from ortft.data import images
    from ortft.families.vision_language.export import Sample
    from ortft.families.vision_language.task import PATH, START

    if encoded is None or not len(encoded):
        return None
    tok, image_id = task.processor.tokenizer, task.processor.image_token_id
    out = []
    for j in range(min(CHECK_ROWS, len(encoded))):
        ids = encoded.column("input_ids")[j, : int(encoded.column(START)[j])].tolist()
        folded = [t for k, t in enumerate(ids) if t != image_id or k == 0 or ids[k - 1] != t]
        prompt = tok.decode(folded, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        image = images.load(encoded.column(PATH)[j].decode())
        out.append(Sample(image, prompt))
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
    graph's): the first row's pixels and prompt, its embeddings and positions."""
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
    from ortft.families.vision_language import qwen2vl_graphs

    qwen2vl = report.get("model_type") == "qwen2_vl"  # the grid and the 3-D positions
    code = (qwen2vl_graphs.CARD if qwen2vl else CARD).format(question=QUESTION)
    return (
        code,
        holds,
        inputs,
        "`onnxruntime`, `numpy`, `Pillow` and `transformers` (the processor)",
    )


class OnnxVisionLanguage:
    """The export's three graphs as ``ortft predict`` and ``ortft eval`` run them: greedy
    answers through ``ortft.export.generation`` (the loop the export's generation check runs
    against ``generate``), and teacher-forced logits of a collated batch."""

    def __init__(self, folder: Path, config: Any):
        from transformers import GenerationConfig

        from ortft.families.vision_language import vlm_graphs as graphs

        self.config = config
        self.sessions = graphs.Sessions(folder, int(config.image_token_id))
        self.gc = GenerationConfig.from_pretrained(folder)
        text = config.get_text_config()
        self.positions = getattr(text, "max_position_embeddings", None)

    def sequences(self, ids: np.ndarray, vision: dict[str, np.ndarray], max_new: int) -> np.ndarray:
        """``generate``'s sequences (prompt, then the answer) of prompts of one length, on the
        rows' image arrays (``processor.vision_inputs``)."""
        import copy

        from ortft.export import generation as gen
        from ortft.families.vision_language import qwen2vl_graphs
        from ortft.families.vision_language import vlm_graphs as graphs

        gc = copy.deepcopy(self.gc)
        gc.update(max_new_tokens=max_new, do_sample=False, num_beams=1)
        p = gen.plan(gc, ids.shape[1], encoder_decoder=False, max_positions=self.positions)
        if "image_grid_thw" in vision:  # Qwen2-VL: the grid, and its 3-D positions
            feeds = _qwen2vl_feeds(vision)
            steps: Any = qwen2vl_graphs.Steps(self.sessions, self.config, **feeds)
        else:
            steps = graphs.Steps(self.sessions, vision["pixel_values"].astype(np.float32))
        seq, _ = gen.generate(steps, np.asarray(ids, dtype=np.int64), p)
        return seq

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """A right-padded batch's logits: its image features at its image tokens, an empty
        past."""
        from ortft.export import parity
        from ortft.families.vision_language import qwen2vl_graphs
        from ortft.families.vision_language import vlm_graphs as graphs

        s, ids = self.sessions, batch["input_ids"].astype(np.int64)
        mask = batch["attention_mask"].astype(np.int64)
        if "image_grid_thw" in batch:
            feeds = _qwen2vl_feeds(batch)
            features = s.image_features(**feeds)
            grid = feeds["grid_thw"]
            positions = qwen2vl_graphs.rope_index(ids, mask, grid, self.config)[0]
        else:
            features = s.image_features(batch["pixel_values"])
            positions = graphs.positions_of(mask, mask.shape[1])
        feeds = {
            "inputs_embeds": graphs.merge(s.embeds(ids), ids, features, s.image_token),
            "attention_mask": mask,
            "position_ids": positions,
            **parity.empty_past(s.decoder, len(ids)),
        }
        return s.decoder.run(["logits"], feeds)[0]


def _qwen2vl_feeds(vision: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A Qwen2-VL export's vision feeds of the padded rows: the flat patches and the grid."""
    grid = np.asarray(vision["image_grid_thw"], dtype=np.int64)
    counts = grid.prod(axis=1)
    flat = [row[:n] for row, n in zip(vision["pixel_values"], counts, strict=True)]
    return {"pixel_values": np.concatenate(flat).astype(np.float32), "grid_thw": grid}
