"""A client of an ortft ONNX export, as a deployment would write it: onnxruntime + tokenizers +
numpy (+ Pillow for images, soundfile for audio) only (run in the clean venv of scripts/consumer-env.sh, never with
ortft importable).

    python consumer_client.py ONNX_DIR INPUTS PREDICTS MAX_NEW

PREDICTS is the task's ``traits.predicts`` (label, tags, answer, fill-mask, generate,
image-label), or image-text-to-text. One JSON line per input on stdout, with the fields ``ortft predict`` gives that a
client can compute. Each text is tokenized alone with the folder's tokenizer.json and run with
an all-ones mask; a sentence-pair input (``text`` and ``text_pair``) is tokenized as one pair,
its type ids fed as ``token_type_ids`` when the graph takes them. For image-label, INPUTS lists
image files (one path a line, relative to it): each is decoded with Pillow, made 8-bit RGB
(alpha over white), run through preprocess.onnx, then model.onnx alone. For transcript, INPUTS lists 16 kHz audio files: each is decoded with
soundfile, down-mixed to mono, run through features.onnx, encoder_model.onnx, then
decoder_model_merged.onnx greedily with generation_config.json's prompt and suppressed tokens. For embedding (a bare
encoder's export), INPUTS lists texts (one a line), run as one batch padded to its longest text
with its attention mask; one ``sentence_embedding`` line per text. For image-text-to-text
(PREDICTS names the task: its predict kind is ``generate``), INPUTS holds JSON lines of an image
file and its chat-templated prompt (the client has no template engine): preprocess.onnx,
vision_encoder.onnx, embed_tokens.onnx, then decoder_model_merged.onnx greedily with its KV
cache; one ``generated``, ``new_tokens`` and ``logits`` (the first step's, at the prompt's last
position) line per row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

ENCODER, DECODER = "encoder_model.onnx", "decoder_model_merged.onnx"  # Optimum's names


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, ids: list[int], types: list[int] | None = None) -> np.ndarray:
    x = np.array([ids], dtype=np.int64)
    feeds = {"input_ids": x, "attention_mask": np.ones_like(x)}
    if "token_type_ids" in {i.name for i in sess.get_inputs()}:  # which text each token is from
        feeds["token_type_ids"] = np.array([types or [0] * len(ids)], dtype=np.int64)
    feeds.update(empty_past(sess))  # a decoder with a KV cache: the first step's past is empty
    return sess.run(None, feeds)[0]


def empty_past(sess: ort.InferenceSession) -> dict[str, np.ndarray]:
    return {
        i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in sess.get_inputs()
        if i.name.startswith("past_key_values")
    }


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def greedy(folder: Path, tok: Tokenizer, config: dict, text: str, max_new: int) -> list[int]:
    """Greedy decoding: with the KV cache when the graph has one, else the whole sequence."""
    if (folder / ENCODER).exists():
        return greedy_seq2seq(folder, tok, config, text, max_new)
    sess = session(folder / "model.onnx")
    ids = tok.encode(text, add_special_tokens=False).ids
    past, new, seen = empty_past(sess), [], 0
    step = ids
    for _ in range(max_new):
        if not past:  # no cache: the whole sequence
            step = ids + new
            seen = 0
        x = np.array([step], dtype=np.int64)
        seen += x.shape[1]
        out = sess.run(
            None, {"input_ids": x, "attention_mask": np.ones((1, seen), np.int64), **past}
        )
        token = int(out[0][0, -1].argmax())
        if token == config.get("eos_token_id"):
            break
        new.append(token)
        if past:
            past, step = dict(zip(past, out[1:], strict=True)), [token]
    return new


def greedy_seq2seq(folder: Path, tok: Tokenizer, config: dict, text: str, max_new: int):
    encoder, decoder = session(folder / ENCODER), session(folder / DECODER)
    ids = np.array([tok.encode(text).ids], dtype=np.int64)
    mask = np.ones_like(ids)
    hidden = encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    past, token, new = empty_past(decoder), config["decoder_start_token_id"], []
    for step in range(max_new):
        feeds = {"input_ids": np.array([[token]], dtype=np.int64), **past}
        feeds.update(encoder_hidden_states=hidden, encoder_attention_mask=mask)
        out = decoder.run(None, {**feeds, "use_cache_branch": np.array([step > 0])})
        token = int(out[0][0, -1].argmax())
        if token == config["eos_token_id"]:
            break
        new.append(token)
        past = next_past(decoder, out, past, step)
    return new


def next_past(decoder: ort.InferenceSession, out: list, past: dict, step: int) -> dict:
    """The presents as the next step's past; the cross-attention's kept from the first step,
    as transformers.js keeps them (later steps only pass them through)."""
    names = [o.name.replace("present", "past_key_values", 1) for o in decoder.get_outputs()]
    new = dict(zip(names[1:], out[1:], strict=True))
    return {k: past[k] if step > 0 and ".encoder." in k else v for k, v in new.items()}


def predict(folder: Path, obj: dict, kind: str, max_new: int) -> dict:
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text())
    labels = config.get("id2label", {})
    if kind == "generate":
        new = greedy(folder, tok, config, obj["text"], max_new)
        if (folder / ENCODER).exists():  # as ortft predict counts a seq2seq output
            spec = json.loads((folder / "tokenizer.json").read_text())
            special = {t["id"] for t in spec["added_tokens"] if t["special"]}
            return {"generated": tok.decode(new), "new_tokens": sum(t not in special for t in new)}
        return {"generated": tok.decode(new), "new_tokens": len(new)}
    sess = session(folder / "model.onnx")
    if kind == "label":
        enc = tok.encode(obj["text"], obj.get("text_pair"))  # a pair: one sequence
        p = softmax(run(sess, enc.ids, enc.type_ids)[0].astype(np.float64))
        return {
            "label": labels[str(p.argmax())],
            "scores": dict(zip(labels.values(), p.tolist(), strict=True)),
        }
    if kind == "tags":
        words = obj.get("tokens") or obj["text"].split()
        enc = tok.encode(words, is_pretokenized=True)
        best = run(sess, enc.ids)[0].argmax(-1)
        tags: list[str | None] = [None] * len(words)
        for pos, word in enumerate(enc.word_ids):
            if word is not None and tags[word] is None:
                tags[word] = labels[str(best[pos])]
        return {"tokens": words, "tags": tags}
    if kind == "answer":
        q, c = obj["question"], obj["context"]
        enc = tok.encode(q, c)
        x = np.array([enc.ids], dtype=np.int64)
        feeds = {"input_ids": x, "attention_mask": np.ones_like(x)}
        start, end = sess.run(["start_logits", "end_logits"], feeds)
        score = start[0].astype(np.float64)[:, None] + end[0].astype(np.float64)[None, :]
        ok = np.array(enc.sequence_ids) == 1
        i, j = np.indices(score.shape)
        score[~((j >= i) & (j - i < 30) & ok[:, None] & ok[None, :])] = -np.inf
        s, e = np.unravel_index(int(score.argmax()), score.shape)
        first, last = enc.offsets[s][0], enc.offsets[e][1]
        return {"answer": c[first:last], "start": first, "end": last}
    assert kind == "fill-mask", kind
    enc = tok.encode(obj["text"])
    logits = run(sess, enc.ids)[0]
    mask = tok.token_to_id("[MASK]")
    tokens = [
        tok.decode([int(logits[i].argmax())]).strip()
        for i in np.flatnonzero(np.array(enc.ids) == mask)
    ]
    return {"masks": [{"token": t} for t in tokens]}


def to_rgb(img):
    """8-bit RGB as ortft (and transformers' processors) convert: 16-bit samples >> 8, float
    clipped to 0..255, a palette's transparency and any alpha composited onto white."""
    from PIL import Image

    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        wide = np.clip(np.asarray(img).astype(np.int64), 0, 65535) >> 8
        img = Image.fromarray(wide.astype(np.uint8))
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8))
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, img.convert("RGBA")).convert("RGB")
    return img.convert("RGB")


def classify_images(folder: Path, inputs: Path) -> None:
    from PIL import Image

    pre, model = session(folder / "preprocess.onnx"), session(folder / "model.onnx")
    labels = json.loads((folder / "config.json").read_text())["id2label"]
    for line in inputs.read_text().splitlines():
        shown = line.strip()
        if not shown:
            continue
        with Image.open(inputs.parent / shown) as img:
            pixels = np.asarray(to_rgb(img), dtype=np.uint8)  # [height, width, 3]
        pixel_values = pre.run(["pixel_values"], {"image": pixels})[0]
        p = softmax(model.run(["logits"], {"pixel_values": pixel_values})[0][0].astype(np.float64))
        order = np.argsort(-p, kind="stable")[:5]
        row = {"input": shown, "label": labels[str(order[0])], "score": float(p[order[0]])}
        row["scores"] = {labels[str(i)]: float(v) for i, v in enumerate(p)}
        row["top_k"] = [[labels[str(i)], float(p[i])] for i in order]
        print(json.dumps(row), flush=True)


def whisper_prompt(gen: dict) -> list[int]:
    """The tokens Whisper's generate starts from: start-of-transcript, the language's token,
    the task's, no-timestamps (generation_config.json's fields)."""
    prompt = [gen["decoder_start_token_id"]]
    if gen.get("language"):
        lang = gen["language"]
        prompt.append(gen["lang_to_id"][lang if lang.startswith("<|") else f"<|{lang}|>"])
    if gen.get("task"):
        prompt.append(gen["task_to_id"][gen["task"]])
    if not gen.get("return_timestamps"):
        prompt.append(gen["no_timestamps_token_id"])
    return prompt


def transcribe(folder: Path, samples: np.ndarray, gen: dict, max_new: int) -> list[int]:
    """features.onnx on the raw 16 kHz samples, the encoder once, then the merged decoder with
    its caches, greedy, with generation_config.json's suppressed tokens (begin_suppress_tokens at
    the first generated position only)."""
    features = session(folder / "features.onnx").run(None, {"samples": samples})[0]
    hidden = session(folder / ENCODER).run(None, {"input_features": features})[0]
    decoder = session(folder / DECODER)
    past, step, new = empty_past(decoder), whisper_prompt(gen), []
    for i in range(max_new):
        feeds = {"input_ids": np.array([step], dtype=np.int64), "encoder_hidden_states": hidden}
        out = decoder.run(None, {**feeds, **past, "use_cache_branch": np.array([i > 0])})
        logits = out[0][0, -1].astype(np.float64)
        logits[gen.get("suppress_tokens") or []] = -np.inf
        if i == 0:
            logits[gen.get("begin_suppress_tokens") or []] = -np.inf
        token = int(logits.argmax())
        if token == gen["eos_token_id"]:
            break
        new.append(token)
        past, step = next_past(decoder, out, past, i), [token]
    return new


def transcribe_files(folder: Path, inputs: Path, max_new: int) -> None:
    import soundfile

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    gen = json.loads((folder / "generation_config.json").read_text())
    for line in inputs.read_text().splitlines():
        shown = line.strip()
        if not shown:
            continue
        samples, rate = soundfile.read(inputs.parent / shown, dtype="float32", always_2d=True)
        assert rate == 16000, f"{shown}: {rate} Hz (this client feeds 16 kHz clips)"
        ids = transcribe(folder, samples.mean(axis=1).astype(np.float32), gen, max_new)
        text = tok.decode(ids, skip_special_tokens=True).strip()
        print(json.dumps({"input": shown, "text": text}), flush=True)


def embed(folder: Path, inputs: Path) -> None:
    """The texts of INPUTS as one padded batch: each row's pooled vector must be the one the
    text gets alone (padded positions do not count)."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text())
    lowercase = json.loads((folder / "export.json").read_text())["pooling"]["lowercase"]
    tok.enable_padding(pad_id=config.get("pad_token_id") or 0)
    lines = [line.strip() for line in inputs.read_text().splitlines() if line.strip()]
    texts = [json.loads(x)["text"] if x.startswith("{") else x for x in lines]  # text or JSONL
    enc = tok.encode_batch([t.lower() for t in texts] if lowercase else texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask}
    (vectors,) = session(folder / "model.onnx").run(["sentence_embedding"], feeds)
    for text, vec in zip(texts, vectors, strict=True):
        print(json.dumps({"text": text, "sentence_embedding": vec.tolist()}), flush=True)


def answer_image(
    folder: Path, image: np.ndarray, prompt: str, max_new: int
) -> tuple[list[int], np.ndarray]:
    """An image-text-to-text export's greedy answer: preprocess.onnx on the decoded pixels,
    the vision encoder, the prompt's tokens (the image token repeated once per image feature)
    through embed_tokens.onnx, the image features written over the image tokens' rows, then
    the merged decoder with its KV cache, one token at a time until end-of-sequence. Returns
    the new tokens and the first step's logits at the prompt's last position."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    image_token = json.loads((folder / "processor_config.json").read_text())["image_token"]
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    eos = set(eos) if isinstance(eos, list) else {eos}
    pre, vision, embed, decoder = (
        session(folder / "onnx" / f"{name}.onnx")
        for name in ("preprocess", "vision_encoder", "embed_tokens", "decoder_model_merged")
    )
    pixel_values = pre.run(["pixel_values"], {"image": image})[0]
    features = vision.run(None, {"pixel_values": pixel_values})[0]
    features = features.reshape(-1, features.shape[-1])
    image_id = tok.token_to_id(image_token)
    ids: list[int] = []
    for t in tok.encode(prompt, add_special_tokens=False).ids:
        ids += [t] * len(features) if t == image_id else [t]
    x = np.array([ids], dtype=np.int64)
    emb = embed.run(None, {"input_ids": x})[0]
    emb[x == image_id] = features
    past, new, seen, first = empty_past(decoder), [], 0, None
    for _ in range(max_new):
        positions = np.arange(seen, seen + emb.shape[1], dtype=np.int64)[None]
        seen += emb.shape[1]
        feeds = {"inputs_embeds": emb, "attention_mask": np.ones((1, seen), np.int64)}
        out = decoder.run(None, {**feeds, "position_ids": positions, **past})
        first = out[0][0, -1] if first is None else first
        token = int(out[0][0, -1].argmax())
        if token in eos:
            break
        new.append(token)
        past = dict(zip(past, out[1:], strict=True))
        emb = embed.run(None, {"input_ids": np.array([[token]], dtype=np.int64)})[0]
    return new, first


def answer_images(folder: Path, inputs: Path, max_new: int) -> None:
    """INPUTS: JSON lines of ``image`` (a path relative to INPUTS) and ``prompt`` (the chat
    template's text up to the answer, its image token once); the image decoded with Pillow and
    made RGB as for image-label."""
    from PIL import Image

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for line in inputs.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        with Image.open(inputs.parent / row["image"]) as img:
            pixels = np.asarray(to_rgb(img), dtype=np.uint8)
        new, logits = answer_image(folder, pixels, row["prompt"], max_new)
        text = tok.decode(new, skip_special_tokens=True).strip()
        row = {"generated": text, "new_tokens": len(new), "logits": logits.tolist()}
        print(json.dumps(row), flush=True)


def main() -> None:
    folder, inputs, kind, max_new = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    if kind == "image-text-to-text":
        answer_images(folder, Path(inputs), max_new)
        return
    if kind == "image-label":
        classify_images(folder, Path(inputs))
        return
    if kind == "transcript":
        transcribe_files(folder, Path(inputs), max_new)
        return
    if kind == "embedding":
        embed(folder, Path(inputs))
        return
    for line in Path(inputs).read_text().splitlines():
        if line.strip():
            obj = json.loads(line) if line.startswith("{") else {"text": line}
            print(json.dumps(predict(folder, obj, kind, max_new)), flush=True)


if __name__ == "__main__":
    main()
