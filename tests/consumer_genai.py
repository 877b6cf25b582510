"""onnxruntime-genai on an ortft decoder export, as a deployment would run it: genai (and the
onnxruntime it loads) only, in the clean venv of scripts/consumer-env.sh, never with ortft
importable.

    python consumer_genai.py ONNX_DIR PROMPTS MAX_NEW

``og.Model(ONNX_DIR)`` opens the folder as written (its genai_config.json), genai's tokenizer
encodes each prompt (PROMPTS: JSONL, ``text``) and genai generates greedily, one prompt at a
time, at most MAX_NEW tokens. One JSON line per prompt: the fields ``ortft predict`` gives,
``generated`` (the new tokens up to the end-of-sequence token, decoded by the folder's
tokenizer.json, special tokens skipped, as ``ortft predict`` decodes) and ``new_tokens``; and
``same_prompt_ids`` (genai's tokenizer encoded the prompt as tokenizer.json does). genai's own
decoding is not compared: on a byte sequence that is not UTF-8 (a tiny random model's output)
it drops the bytes after the first bad one, where ``tokenizers`` writes U+FFFD for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnxruntime_genai as og
from tokenizers import Tokenizer


def generate(model: og.Model, hf: Tokenizer, eos: set[int], text: str, max_new: int) -> dict:
    ids = og.Tokenizer(model).encode(text)  # genai's own tokenizer, as a deployment uses it
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    new = []
    for t in gen.get_sequence(0)[len(ids) :].tolist():
        if t in eos:
            break
        new.append(int(t))
    return {
        "generated": hf.decode(new, skip_special_tokens=True),
        "new_tokens": len(new),
        "same_prompt_ids": [int(t) for t in ids] == hf.encode(text, add_special_tokens=False).ids,
    }


def main() -> None:
    folder, prompts, max_new = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    model = og.Model(str(folder))
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])
    for line in prompts.read_text().splitlines():
        if line.strip():
            out = generate(model, hf, eos, json.loads(line)["text"], max_new)
            print(json.dumps(out, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
