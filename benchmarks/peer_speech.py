"""ortft against transformers' Seq2SeqTrainer on speech recognition: a Whisper on spoken digits.

Each measurement runs in its own process.

Run (``make bench-peer-speech``; not in CI; an estimated 15 minutes on 2 quiet CPU cores,
longer while it waits for quiet):

    python benchmarks/peer_speech.py --pairs 5 --out benchmarks/results/peer-speech.json

The fine-tune (recipes/bench/whisper-digits.yaml): a Whisper built from a config (random
weights: no pretrained speech model offline), d_model 256, 4 encoder + 4 decoder layers, 4
heads, feed-forward 1024, 80 mel bins, 150 encoder positions (a 3 s window), 32 decoder
positions (7.8M parameters), dropout 0; its tokenizer a byte-level BPE of 300 trained on the
transcripts, plus Whisper's special tokens (405 in all; ortft.families.speech.processor). Batch 16,
lr 5e-5 with linear decay, no warm-up, no weight decay, gradient norm clipped at 1.0 (Trainer's
defaults, set on ortft's side too), seed 42, fp32 unless the runner says otherwise, CPU. The
data: the 240 training clips of recipes/data/speech (16 kHz mono FLAC, 0.9-2.8 s), each padded
to the 3 s window, so every batch's encoder input is 16 x 80 x 300 on both sides; the labels
(3 prompt tokens, the digits, end-of-text: 7-9 tokens) are cut to the batch's longest.

Why this size: a clip's forward is about 0.68 G multiply-adds (the conv front-end 48M, the
encoder's 4 layers over 150 positions 518M, the decoder's over ~9 tokens 115M, 39M of it its
cross-attention keys/values over the 150 encoder positions, the LM head 1M); a training step
is 3 x 2 x that x 16 = 65 GFLOP, 83% of it in the encoder, against a 2-core fp32 matmul peak
of 100-115 GFLOP/s: at least 0.6 s a step. Decoding 16 FLACs takes 9 ms and the feature
extractor 74-141 ms on them batched (ortft's collate; measured on a busy machine), so the
model dominates the step. The shipped recipe's Whisper (hidden 128, 2 + 2 layers) is 10 GFLOP
a step: ~0.1 s, as long as its features, a bench of the data path instead.

Runners, alternating (trainer, trainer-bf16, torch, ort, trainer, ...) for ``--pairs`` rounds;
every measurement is a fresh process (benchmarks/peer_common.py):

- ``trainer``: ``transformers.Seq2SeqTrainer`` over a torch ``Dataset`` that decodes each FLAC
  with soundfile and runs ``WhisperFeatureExtractor(feature_size=80, chunk_length=3)`` on it
  per item (as ortft does per batch, not cached); the collator of Hugging Face's Whisper
  fine-tuning blog (``DataCollatorSpeechSeq2SeqWithPadding``: ``feature_extractor.pad``,
  ``tokenizer.pad``, padding labels with -100, stripping a leading start-of-transcript, which
  the model prepends), plus ``decoder_attention_mask`` as ortft passes it (ones over the
  shifted real labels); ``Seq2SeqTrainingArguments`` defaults except ``max_steps``, batch 16,
  ``use_cpu=True``, ``save_strategy="no"``, ``report_to="none"``, a temporary ``output_dir``.
  The model is ``WhisperForConditionalGeneration(WhisperConfig(...))`` with the sizes and token
  ids ortft's from_config gives it and the attention transformers picks by default: sdpa
  (recorded as ``attention``). The tokenizer is ortft's (transformers has no way to train a
  Whisper tokenizer offline), trained before the timed steps on the same transcripts: the
  same 405 tokens (both sides record ``vocab_size``; the table warns where they differ).
  ``data_ms_per_step``: the time its ``__getitem__`` took a timed step (decoding + features).
- ``trainer-bf16``: the same with ``bf16=True`` (CPU autocast to bfloat16).
- ``torch`` / ``ort``: ``ortft train recipes/bench/whisper-digits.yaml --json`` with the
  overrides in ``ORTFT_OVERRIDES`` and ``backend.name`` torch (sdpa attention) or ort (eager
  attention in ORT's graph), each at its defaults.

Timing, the quiet-machine wait, clean rounds and the table are peer_image.py's (see its
docstring and peer_common.py): ``--warmup`` steps (default 4: ORT's export, allocator growth),
then ``--steps`` timed steps (default 20), each from the end of the step before to its own
end; the decoding, the features, collation, forward, backward, clipping, the optimizer and
scheduler steps are all inside. The first step's loss of each run is kept (``loss_step1``):
each side draws its own random Whisper, so they agree only roughly, near ln(405) = 6.00.

A caution for reading it: the Trainer runs the feature extractor once per clip, and each call
is a small torch STFT; on a busy machine (load average 5 on 2 cores) 16 such calls with
torch's 2 OpenMP threads took 1.6 s (51-66 ms on 1 thread; 95 ms at a load average of 3), and
a busy smoke run read ``data_ms_per_step`` at 330-470 ms, so a busy round says little about
the Trainer (the wait for a quiet machine and the clean rounds are there for this).

Offline: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE are set for every process.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path

RECIPE = common.REPO / "recipes" / "bench" / "whisper-digits.yaml"
TRAIN = common.REPO / "recipes" / "data" / "speech" / "train.jsonl"
BATCH, LR, SEED, LANGUAGE = 16, 5e-5, 42, "en"
TOKENIZER = {"kind": "byte-bpe", "vocab_size": 300, "min_frequency": 2}  # the recipe's
WHISPER = {  # recipes/bench/whisper-digits.yaml's model.from_config, as WhisperConfig's fields
    "d_model": 256,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
    "num_mel_bins": 80,
    "max_source_positions": 150,  # 3 s: 50 encoder positions a second
    "max_target_positions": 32,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
}
SECONDS = WHISPER["max_source_positions"] // 50  # the feature extractor's window
# ortft's side of the same fine-tune (the recipe holds these too)
ORTFT_OVERRIDES = common.trainer_overrides(LR, BATCH, SEED, **{"task.generate_samples": "0"})


def clips() -> tuple[list[str], list[str]]:
    """The training clips' absolute paths and transcripts, in the jsonl's order."""
    rows = [json.loads(ln) for ln in TRAIN.read_text().splitlines() if ln.strip()]
    return [str(TRAIN.parent / r["audio"]) for r in rows], [r["text"] for r in rows]


def whisper(tokenizer: Any) -> Any:
    """The bench's Whisper, with the token ids ortft's from_config sets for a trained
    tokenizer (ortft.backends.torch.hf_config.token_kwargs)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    eot = tokenizer.eos_token_id
    config = WhisperConfig(
        **WHISPER,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        begin_suppress_tokens=[eot],
        suppress_tokens=None,
    )
    return WhisperForConditionalGeneration(config)


def collator(fe: Any, tokenizer: Any, start: int) -> Any:
    """The blog's DataCollatorSpeechSeq2SeqWithPadding, plus decoder_attention_mask."""

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        feats = fe.pad([{"input_features": x["input_features"]} for x in items],
                       return_tensors="pt")  # fmt: skip
        padded = tokenizer.pad([{"input_ids": x["labels"]} for x in items], return_tensors="pt")
        labels = padded["input_ids"].masked_fill(padded.attention_mask.ne(1), -100)
        if (labels[:, 0] == start).all().cpu().item():  # the model prepends it
            labels = labels[:, 1:]
        mask = torch.ones_like(labels)  # decoder inputs: start token, then labels[:-1]
        mask[:, 1:] = labels[:, :-1] != -100
        return {"input_features": feats["input_features"], "labels": labels,
                "decoder_attention_mask": mask}  # fmt: skip

    return collate


def trainer_worker(bf16: bool, steps: int, warmup: int, out: Path) -> None:
    """One Seq2SeqTrainer measurement in this process; writes its result as JSON to ``out``."""
    import soundfile as sf
    import torch
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, WhisperFeatureExtractor

    from ortft.families.speech.processor import train_tokenizer
    from ortft.recipe.model import TrainTokenizer

    paths, texts = clips()
    tokenizer = train_tokenizer(texts, TrainTokenizer(**TOKENIZER), LANGUAGE)
    fe = WhisperFeatureExtractor(feature_size=WHISPER["num_mel_bins"], chunk_length=SECONDS)
    labels = [tokenizer(t).input_ids for t in texts]  # start, en, transcribe, no-timestamps ...
    spent: list[float] = []  # each __getitem__'s seconds

    class Clips(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            samples, rate = sf.read(paths[i], dtype="float32")
            feats = fe(samples, sampling_rate=rate, return_tensors="np")["input_features"][0]
            spent.append(time.perf_counter() - t0)
            return {"input_features": feats, "labels": labels[i]}

    torch.manual_seed(SEED)
    model = whisper(tokenizer)
    record = common.StepRecorder()
    with tempfile.TemporaryDirectory(prefix="peer-speech-trainer-") as tmp:
        args = Seq2SeqTrainingArguments(
            **common.trainer_arguments(tmp, LR, BATCH, warmup + steps, SEED, bf16)
        )
        trainer = record.trainer(Seq2SeqTrainer)(
            model=model,
            args=args,
            train_dataset=Clips(),
            data_collator=collator(fe, tokenizer, model.config.decoder_start_token_id),
            callbacks=[record.callback()],
        )
        result = trainer.train()
    timed = spent[warmup * BATCH : (warmup + steps) * BATCH]
    common.write_json(out, {
        **record.result(steps, warmup, BATCH, result, model, args),
        "data_ms_per_step": 1000 * sum(timed) / steps,
        "vocab_size": len(tokenizer),
    })  # fmt: skip


BENCH = common.Bench(
    name="peer-speech",
    script=__file__,
    recipe=RECIPE,
    batch=BATCH,
    overrides=ORTFT_OVERRIDES,
    model="Whisper d_model 256, 4+4 layers, 3 s windows",
    worker=trainer_worker,
    extra={"lr": LR, "whisper": WHISPER, "tokenizer": TOKENIZER},
    extra_keys=("data_ms_per_step", "vocab_size"),
)


def task_peers() -> list[common.TaskPeer]:
    """This bench's rows of the one peer table (benchmarks/peers.py)."""
    return [common.task_peer(BENCH, "speech")]


if __name__ == "__main__":
    common.main(BENCH, __doc__ or "")
