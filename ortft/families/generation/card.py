"""The model card's code of a generation export (``deploy.write_card`` adds the tokenizer line):
onnxruntime and tokenizers only, run from inside the folder (``tests/test_consumer.py`` runs it
verbatim). A decoder generates greedily from the example prompt (an instruction model's
template around it), with its KV cache (the prompt once, then one token a step; the past
starts empty) or without (the whole sequence each step); a seq2seq export runs the encoder
once and the decoder with its cache, from the decoder start token.
"""

from __future__ import annotations

import json

from ortft.export import deploy

# a decoder with a KV cache: the prompt once, then one token a step; past starts empty
CACHE = """ids = tok.encode({text}, add_special_tokens=False).ids
past = {{i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in session.get_inputs() if i.name.startswith("past_key_values")}}
new, seen = [], 0
for _ in range(32):
    x = np.array([ids], dtype=np.int64)
    seen += x.shape[1]
    out = session.run(None, {{"input_ids": x, "attention_mask": np.ones((1, seen), np.int64), **past}})
    ids = [int(out[0][0, -1].argmax())]
    if ids[0] == config["eos_token_id"]:
        break
    new.append(ids[0])
    past = dict(zip(past, out[1:]))  # present.* come in the order of past_key_values.*
print(tok.decode(new))
"""
NO_CACHE = """ids = tok.encode({text}, add_special_tokens=False).ids
new = []
for _ in range(32):  # no KV cache: the whole sequence each step
    x = np.array([ids + new], dtype=np.int64)
    logits = session.run(["logits"], {{"input_ids": x, "attention_mask": np.ones_like(x)}})[0]
    if int(logits[0, -1].argmax()) == config["eos_token_id"]:
        break
    new.append(int(logits[0, -1].argmax()))
print(tok.decode(new))
"""
SEQ2SEQ = """enc = tok.encode({text})
ids = np.array([enc.ids], dtype=np.int64)
mask = np.ones_like(ids)
hidden = encoder.run(None, {{"input_ids": ids, "attention_mask": mask}})[0]
past = {{i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in decoder.get_inputs() if i.name.startswith("past_key_values")}}
token, new = config["decoder_start_token_id"], []
for step in range(32):  # the first step computes the cross-attention cache, later ones read it
    feeds = {{"input_ids": np.array([[token]], dtype=np.int64), "encoder_hidden_states": hidden}}
    feeds["use_cache_branch"] = np.array([step > 0])
    out = decoder.run(None, {{**feeds, "encoder_attention_mask": mask, **past}})
    token = int(out[0][0, -1].argmax())
    if token == config["eos_token_id"]:
        break
    new.append(token)
    fresh = dict(zip(past, out[1:]))  # later steps give the cross-attention's empty: keep them
    past = {{k: past[k] if step > 0 and ".encoder." in k else v for k, v in fresh.items()}}
print(tok.decode(new))
"""
SEQ2SEQ_SESSIONS = (
    'encoder = ort.InferenceSession("encoder_model.onnx", providers=["CPUExecutionProvider"])\n'
    'decoder = ort.InferenceSession("decoder_model_merged.onnx", providers=["CPUExecutionProvider"])'
)


def example() -> str:
    """The text the snippets run on (what the consumer test feeds ``ortft predict``)."""
    return deploy.EXAMPLE["generate"]


def decoder(prompt: str, cache: bool | None) -> str:
    """A decoder's snippet on ``prompt`` (the example, formatted as the task's prompt), with
    its KV cache or without (``cache``: export.json's ``kv_cache``)."""
    body = CACHE if cache else NO_CACHE
    return deploy.head() + body.format(text=json.dumps(prompt, ensure_ascii=False))


def seq2seq() -> str:
    """A seq2seq export's snippet: encoder_model.onnx once, then decoder_model_merged.onnx
    with its caches."""
    text = json.dumps(example(), ensure_ascii=False)
    return deploy.head(SEQ2SEQ_SESSIONS) + SEQ2SEQ.format(text=text)
