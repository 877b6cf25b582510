"""image-text-to-text: an image and a conversation in, the assistant's text out (LLaVA-style:
a vision tower, a projector, a language model); loss over the answers, exact match of greedy
answers on held-out rows.

Rows name one image file (``data.image_column``, relative to the data file) and hold either a
conversation (``task.messages_column``: ``[{role, content}]``, a user turn's content a list of
parts, ``{"type": "image"}`` where the image goes and ``{"type": "text", "text": ...}``) or a
question and its answer (``task.question_column``, ``task.answer_column``: the user turn is
the image, then the question). ``encode`` checks each file once (``ortft.data.images``, the
image task's rules and ``data.on_bad_file``), renders the conversation with the processor's
chat template and tokenizes it piece by piece: each assistant turn's text (and its
end-of-sequence) is learned, every other token (the template, the question, the image tokens)
gets label -100. The image token is expanded into one token per image feature, as the
processor does. ``collate`` decodes the batch's images and runs the image processor (PIL).

The model's forward (``forward``) puts the projected image features where the image tokens
are, by a gather (an ONNX ``GatherElements``, whose gradient ORT has), and runs the language
model on the embeddings. With ``task.freeze_vision`` (the default) the vision tower runs before
the wrapped module, under no_grad (``family.VisionLanguage.outside_inputs``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError
from ortft.data import images
from ortft.tasks.base import Encoded, Task, TaskOptions, skip_bad_file

PATH = "_image"  # the encoded column of file paths (bytes); "_": never fed to the model
MODE = images.MODE
START = "_start"  # where the last assistant turn's text starts: exact match generates from here
Positive = Annotated[int, Field(ge=1)]


class Options(TaskOptions):
    name: Literal["image-text-to-text"] = "image-text-to-text"
    messages_column: str = Field(
        "messages",
        description="image-text-to-text: column with a conversation ([{role, content}], a user "
        'turn\'s content a list of parts: {"type": "image"}, {"type": "text", "text": ...}); '
        "used when present.",
    )
    question_column: str = Field(
        "question", description="image-text-to-text: column with the question (no messages)."
    )
    answer_column: str = Field(
        "answer", description="image-text-to-text: column with the answer (no messages)."
    )
    freeze_vision: bool = Field(
        True,
        description="image-text-to-text: the vision tower is frozen and runs before the "
        "trained module, eagerly under no_grad (on ort: outside ORTModule); the projector and "
        "the language model train. false: the vision tower trains too (full fine-tune only).",
    )
    generate_samples: Annotated[int, Field(ge=0)] = Field(
        256,
        description="image-text-to-text: eval rows answered by greedy generate() for "
        "eval_exact_match (0: none).",
    )
    max_new_tokens: Positive = Field(
        16, description="image-text-to-text: tokens an answer may have (eval and predict)."
    )
    image_size: Positive = Field(
        224, description="image-text-to-text, from_config: the vision tower's image side."
    )
    patch_size: Positive = Field(
        14, description="image-text-to-text, from_config: the vision tower's patch side."
    )
    vision_hidden_size: Positive = Field(
        64, description="image-text-to-text, from_config: the vision tower's width."
    )
    vision_layers: Positive = Field(
        2, description="image-text-to-text, from_config: the vision tower's layers."
    )
    vision_heads: Positive = Field(
        2, description="image-text-to-text, from_config: the vision tower's attention heads."
    )


def normalized(text: str) -> str:
    """What exact match compares: lowercase, whitespace collapsed."""
    return " ".join(text.lower().split())


class ImageTextToText(Task):
    name = "image-text-to-text"
    modality = "image"
    reads_modalities = ("image", "text")  # LLaVA's main input is pixel_values, the others' ids
    auto_class = "AutoModelForImageTextToText"
    row_local = True  # each row checked and encoded on its own
    own_columns = True  # messages, or question and answer: checked per row
    is_decoder = True
    shift_labels = True
    predicts = "generate"
    export_kind = "image-text-to-text"  # a label only (ExportsAs); the export lands separately
    eval_metrics = ("eval_loss", "eval_exact_match")
    hf_architectures = (
        "LlavaForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
    )

    def __init__(self, options: Options) -> None:
        self.options = options
        self.processor: Any = None  # bound once the run has loaded it (``bind``)
        self._expansion: list[int] | None = None
        self.llava: Any = None  # the built model (``prepare_model``)

    @property
    def options_key(self) -> str:
        o = self.options
        return f"{o.messages_column}|{o.question_column}|{o.answer_column}"

    @property
    def main_input(self) -> str:
        return "input_ids"

    def columns(self, data) -> list[str]:
        return [data.image_column]  # the rest: messages or question/answer, per row

    def read_columns(self, data) -> list[str]:
        o = self.options
        return [data.image_column, o.messages_column, o.question_column, o.answer_column]

    def file_column(self, data) -> str | None:
        return data.image_column

    def texts(self, rows, data) -> list[str]:
        """Every text of the rows, for a tokenizer trained from them."""
        out = []
        for i, row in enumerate(rows):
            for m in self.messages(row, i):
                out += [p["text"] for p in m["content"] if p["type"] == "text"]
        return out

    def bind(self, processor: Any) -> None:
        self.processor = processor
        self._expansion = None

    def messages(self, row: dict[str, Any], i: int) -> list[dict[str, Any]]:
        """The row's conversation, each content a list of parts (one image part in all)."""
        o = self.options
        raw = row.get(o.messages_column)
        if raw:
            if not isinstance(raw, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in raw
            ):
                raise InputError(
                    f"row {i + 1}: {o.messages_column} must be a list of {{role, content}} objects"
                )
            msgs: list[dict[str, Any]] = [
                {"role": str(m["role"]), "content": _parts(m["content"], i)} for m in raw
            ]
        elif row.get(o.question_column) is not None and row.get(o.answer_column) is not None:
            msgs = [
                {
                    "role": "user",
                    "content": [
                        {"type": "image"},
                        {"type": "text", "text": str(row[o.question_column])},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": str(row[o.answer_column])}],
                },
            ]
        else:
            raise InputError(
                f"row {i + 1}: needs {o.question_column} and {o.answer_column}, or "
                f"{o.messages_column} (has: {', '.join(sorted(map(str, row)))})"
            )
        found = sum(p["type"] == "image" for m in msgs for p in m["content"])
        if found != 1:
            raise InputError(
                f'row {i + 1}: {o.messages_column} has {found} {{"type": "image"}} parts; a row '
                "has one image (its image file), so exactly one image part"
            )
        if msgs[-1]["role"] != "assistant":
            raise InputError(f"row {i + 1}: the conversation must end with an assistant turn")
        return msgs

    def segments(self, msgs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        """The chat template's rendering as (text, learned?) pieces: rendering the chat up to
        each message, with and without the generation prompt, gives the text the template adds
        before an assistant turn (not learned) and the turn itself (learned)."""

        def render(chat: list[dict[str, Any]], opened: bool = False) -> str:
            tok = self.processor.tokenizer  # its special tokens (eos_token) reach the template
            return tok.apply_chat_template(
                chat,
                chat_template=self.processor.chat_template,
                tokenize=False,
                add_generation_prompt=opened,
            )

        out: list[tuple[str, bool]] = []
        done = ""
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                prefix = render(msgs[:k], opened=True)
                if prefix.startswith(done):
                    out.append((prefix[len(done) :], False))
                    done = prefix
            full = render(msgs[: k + 1])
            if not full.startswith(done):
                raise InputError(
                    "the processor's chat template renders a conversation differently when it "
                    "grows; ortft cannot tell the answers from the prompt"
                )
            out.append((full[len(done) :], m["role"] == "assistant"))
            done = full
        return out

    def prompt_ids(self, row: dict[str, Any], i: int, path: str | None = None) -> list[int]:
        """The tokens a row's answer is generated after (``ortft predict``): its conversation up
        to an empty assistant turn, tokenized as in training."""
        o = self.options
        if row.get(o.messages_column):
            msgs = list(row[o.messages_column])
            if msgs and isinstance(msgs[-1], dict) and msgs[-1].get("role") == "assistant":
                msgs = msgs[:-1]  # answered again
            row = {**row, o.messages_column: [*msgs, {"role": "assistant", "content": ""}]}
        else:
            row = {**row, o.answer_column: ""}
        ids, _, start = self.tokens(self.segments(self.messages(row, i)), path)
        return ids[:start]

    def expansion(self, path: str | None = None) -> list[int]:
        """The ids the processor puts where a text has ``path``'s image token (LLaVA: one
        image token per image feature; Idefics3: those between its image markers; Qwen2-VL:
        its grid's, ``archs.Arch.expansion``)."""
        from ortft.families.vision_language import archs

        own = archs.of_processor(self.processor).expansion(self.processor, path)
        if own is not None:
            return own
        if self._expansion is None:
            from ortft.families.vision_language.processor import image_expansion

            self._expansion = image_expansion(self.processor)
        return self._expansion

    def image_tokens(self, path: str | None = None) -> int:
        image_id = self.processor.image_token_id
        return sum(t == image_id for t in self.expansion(path))

    def tokens(
        self, pieces: list[tuple[str, bool]], path: str | None = None
    ) -> tuple[list[int], list[int], int]:
        """(ids, labels, where the last learned piece starts) of rendered pieces; the image
        token expanded as the processor expands it (``expansion`` of ``path``'s image)."""
        tok, image_id = self.processor.tokenizer, self.processor.image_token_id
        expanded = self.expansion(path)
        ids: list[int] = []
        labels: list[int] = []
        start = 0
        for text, learned in pieces:
            piece: list[int] = []
            for t in tok(text, add_special_tokens=False)["input_ids"]:
                piece += expanded if t == image_id else [t]
            if learned:
                start = len(ids)
            ids += piece
            labels += piece if learned else [IGNORE_INDEX] * len(piece)
        return ids, labels, start

    def encode(self, rows, tokenizer, data, label2id) -> Encoded:
        if tokenizer is not None:
            self.bind(tokenizer)
        length = data.max_length
        kept: list[tuple[str, str, list[int], list[int], int]] = []
        for i, row in enumerate(rows):
            path = row.get(data.image_column)
            if not isinstance(path, str) or not path:
                raise InputError(
                    f"row {i + 1}: data.image_column '{data.image_column}' holds "
                    f"{type(path).__name__} {path!r}, not an image file path"
                )
            msgs = self.messages(row, i)
            try:
                mode = images.check(path)
            except images.BadImage as err:
                skip_bad_file(data, i + 1, path, err)
                continue
            ids, labels, start = self.tokens(self.segments(msgs), path)
            if len(ids) > length:
                n = self.image_tokens(path)
                raise InputError(
                    f"row {i + 1}: {len(ids)} tokens ({n} of them the image's) "
                    f"do not fit data.max_length={length}; raise data.max_length"
                )
            kept.append((path, mode, ids, labels, start))
        return _arrays(kept, length, self.processor.tokenizer.pad_token_id)

    def collate(self, batch, epoch, seed) -> dict[str, np.ndarray]:
        """The batch's images decoded and run through the image processor (PIL): the arrays
        its architecture takes (``archs.Arch.pixels``)."""
        if self.processor is None:
            raise RuntimeError("image-text-to-text: collate before bind(processor)")
        decoded = []
        for raw in batch[PATH]:
            path = raw.decode()
            try:
                decoded.append(images.load(path))
            except images.BadImage as err:
                raise InputError(f"{path}: {err} (the file changed since it was checked)") from None
        from ortft.families.vision_language import archs

        return {**batch, **archs.of_processor(self.processor).pixels(self.processor, decoded)}

    def forward(  # type: ignore[override]  # a modality's forward takes its own inputs
        self,
        model,
        input_ids,
        attention_mask,
        labels,
        image_features=None,
        **inputs,
    ) -> tuple[Any, Any]:
        """(loss, logits); ``inputs``: the batch's pixel arrays (``archs.Arch.pixel_keys``)
        and what was computed before the module (``archs.Arch.extra_inputs``)."""
        from ortft.families.vision_language import archs

        arch = archs.of(model)
        return arch.forward(model, input_ids, attention_mask, labels, inputs, image_features)

    def metrics(self, loss, logits, labels) -> dict[str, Any]:
        return {"loss": loss}

    def data_report(self, splits: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
        """summary.json's data.images (``images.split_report``)."""
        return images.split_report(splits)


def _parts(content: Any, i: int) -> list[dict[str, str]]:
    """A message's content as parts: a string is one text part."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(
        isinstance(p, dict) and p.get("type") in ("image", "text") for p in content
    ):
        raise InputError(
            f'row {i + 1}: a message\'s content is a string or a list of {{"type": "image"}} / '
            '{"type": "text", "text": ...} parts'
        )
    return [
        {"type": "image"}
        if p["type"] == "image"
        else {"type": "text", "text": str(p.get("text", ""))}
        for p in content
    ]


def _arrays(
    kept: list[tuple[str, str, list[int], list[int], int]], length: int, pad: int
) -> Encoded:
    n = len(kept)
    ids = np.full((n, length), pad, dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.int64)
    labels = np.full((n, length), IGNORE_INDEX, dtype=np.int64)
    for j, (_, _, row_ids, row_labels, _) in enumerate(kept):
        ids[j, : len(row_ids)], mask[j, : len(row_ids)] = row_ids, 1
        labels[j, : len(row_labels)] = row_labels
    paths = [p.encode() for p, *_ in kept]
    modes = [m.encode() for _, m, *_ in kept]
    return Encoded(
        {
            PATH: np.array(paths, dtype="S") if paths else np.zeros(0, dtype="S1"),
            "input_ids": ids,
            "attention_mask": mask,
            "labels": labels,
            MODE: np.array(modes, dtype="S") if modes else np.zeros(0, dtype="S1"),
            START: np.array([s for *_, s in kept], dtype=np.int64),
        }
    )
