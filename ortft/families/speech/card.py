"""The model card of a speech export: what the folder holds and a client that transcribes.

The snippet is what a deployment runs, with onnxruntime, numpy, soundfile and tokenizers only
(``make test-consumer`` runs it verbatim and compares its output with ``ortft predict``):
decode the file, down-mix to mono, ``features.onnx`` on the raw 16 kHz samples, the encoder
once, then the merged decoder with its caches (the cross-attention's computed at the first
step, read after), greedy, from Whisper's prompt (start-of-transcript,
language, transcribe, no-timestamps) with ``generation_config.json``'s suppressed tokens.
"""

from __future__ import annotations

from ortft.core.reports import ExportReport

CARD_AUDIO = "audio.flac"  # the snippet's input file (a user puts theirs there)
NEW_TOKENS = 32  # tokens the snippet generates at most (as ortft predict's default)

SNIPPET = """import json

import numpy as np
import onnxruntime as ort
import soundfile
from tokenizers import Tokenizer


def session(name):
    return ort.InferenceSession(name, providers=["CPUExecutionProvider"])


gen = json.load(open("generation_config.json"))
# prompt + transcript fit the decoder's positions (4: the longest prompt)
limit = min({new_tokens}, json.load(open("config.json"))["max_target_positions"] - 4)
samples, rate = soundfile.read("{audio}", dtype="float32", always_2d=True)
assert rate == {rate}, "resample to {rate} Hz first (e.g. scipy.signal.resample_poly)"
features = session("features.onnx").run(None, {{"samples": samples.mean(axis=1)}})[0]
hidden = session("encoder_model.onnx").run(None, {{"input_features": features}})[0]
decoder = session("decoder_model_merged.onnx")
past = {{
    i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    for i in decoder.get_inputs()
    if i.name.startswith("past_key_values")
}}
{prompt}
new = []
for i in range(limit):
    feeds = {{"input_ids": np.array([step], dtype=np.int64), "encoder_hidden_states": hidden}}
    feeds["use_cache_branch"] = np.array([i > 0])  # the first step computes the cross cache
    out = decoder.run(None, {{**feeds, **past}})
    logits = out[0][0, -1].astype(np.float64)
    logits[gen["suppress_tokens"] or []] = -np.inf
    if i == 0:  # no empty transcript
        logits[gen["begin_suppress_tokens"] or []] = -np.inf
    token = int(logits.argmax())
    if token == gen["eos_token_id"]:
        break
    new.append(token)
    fresh = dict(zip(past, out[1:]))  # later steps give the cross-attention's empty: keep them
    past = {{k: past[k] if i > 0 and ".encoder." in k else v for k, v in fresh.items()}}
    step = [token]
print(Tokenizer.from_file("tokenizer.json").decode(new, skip_special_tokens=True).strip())
"""
# Whisper's prompt: start-of-transcript, the language's token (none for an English-only
# model), transcribe, no-timestamps
PROMPT = (
    'step = [gen["decoder_start_token_id"], gen["lang_to_id"]["<|" + gen["language"] + "|>"],\n'
    '        gen["task_to_id"][gen["task"]], gen["no_timestamps_token_id"]]'
)
PROMPT_NO_LANGUAGE = (
    'step = [gen["decoder_start_token_id"], gen["task_to_id"][gen["task"]],\n'
    '        gen["no_timestamps_token_id"]]'
)


def snippet(rate: int, language: str | None) -> str:
    """The client code, for clips at ``rate`` Hz."""
    prompt = PROMPT if language else PROMPT_NO_LANGUAGE
    return SNIPPET.format(audio=CARD_AUDIO, rate=rate, new_tokens=NEW_TOKENS, prompt=prompt)


def card(report: ExportReport) -> tuple[str, str, str, str]:
    """The card's (snippet, what else the folder holds, the preprocessing line, what the
    snippet needs): ``deploy.write_card``."""
    f = report["features"]
    holds = (
        "the processor (`processor_config.json`: the feature extractor; the tokenizer files), "
        "`generation_config.json`"
    )
    if not f.get("passed") or "features" not in report["files"]:
        why = f.get("reason") or "its check failed"
        line = (
            f"- **Features:** no `features.onnx` ({why}): run the feature extractor "
            "(`WhisperFeatureExtractor`, from `processor_config.json`) to get `input_features`."
        )
        code = "# no features.onnx: compute input_features with the feature extractor first\n"
        return code, holds, line, "`onnxruntime`, `numpy`, `soundfile` and `transformers`"
    code = snippet(int(f["sampling_rate"]), report.get("language"))
    line = (
        f"- **Features:** `features.onnx` takes one clip's raw samples (`samples`, float32 [n], "
        f"mono, {f['sampling_rate']} Hz, any length: cut or zero-padded to "
        f"{f['n_samples'] / f['sampling_rate']:g} s) and gives the encoder's `input_features` "
        f"(float32 [1, {f['feature_size']}, {f['nb_max_frames']}], log-mel) as the feature "
        f"extractor does: checked on {f['clips']} clips, max |diff| {f['max_abs_diff']:.2e} "
        f"(tolerance {f['tolerance']:.0e})."
    )
    return code, holds, line, "`onnxruntime`, `numpy`, `soundfile` and `tokenizers`"
