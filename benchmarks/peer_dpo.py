"""ortft against TRL's DPOTrainer on preference tuning: DPO on recipes/dpo.yaml's pairs.

Each measurement runs in its own process.

Run (``make bench-peer-dpo``; not in CI):

    python benchmarks/peer_dpo.py --pairs 3 --out benchmarks/results/peer-dpo.json
    python benchmarks/peer_dpo.py --model start --pairs 3 --out benchmarks/results/peer-dpo-start.json

The fine-tune: DPO (TRL's ``loss_type="sigmoid"``, beta 0.1, no SFT term) on the 320 pairs of
recipes/data/preference-train.jsonl (number words -> digits, chosen the right digits), batch 8
pairs (16 sequences a forward: chosen and rejected concatenated, on both sides), sequences cut
at 48 tokens (prompt + response; the longest pair has fewer), lr 1e-5 with linear decay, no
warm-up, no weight decay, gradient norm clipped at 1.0 (the Trainer's defaults, set on ortft's
side too), seed 42, no dropout (TRL's ``disable_dropout``, ortft's ``model.dropout: 0``), CPU.
The model (``--model``):

- ``gpt2-25m`` (default): a GPT-2 built from a config, n_embd 512, 8 layers, 8 heads, inner
  2048, the tokenizer of recipes/data/preference-start/ (331 tokens): 25.4M parameters, random
  weights (seed 0), written once to ``<ORTFT_CACHE>/bench/peer-dpo-gpt2-25m/``. At about 28
  tokens a sequence a step is ~65 GFLOP, so the model's compute dominates the step.
- ``gpt2-25m-vocab50k``: the same with GPT-2's own vocabulary size, 50257 (the tokenizer gets
  ``<unused{i}>`` tokens past its 331, which the texts never hold, but the head projects onto
  all of them, as a real GPT-2's does): 51.0M parameters (tied), where the head is about half a token's forward FLOPs.
- ``start``: recipes/data/preference-start/ itself (the recipe's tiny GPT-2, 154k parameters):
  a step is mostly each side's per-step overhead.

Both sides see the same token sequences: TRL gets each pair as strings, the prompt formatted as
ortft formats it (``### Instruction:`` ... ``### Response:``, no chat template in this tokenizer)
and each response ending with EOS, so its tokenizer gives ortft's ids (the JSON's
``tokens_per_sequence`` is TRL's mean: 22.18, as ortft's encoding of the pairs).

Runners, alternating (trl, trl-fast, trl-fp32-fast, torch, torch-bf16, ort, auto, trl, ...) for
``--pairs`` rounds; every measurement a fresh process (peer_common):

- ``trl``: ``DPOTrainer`` as its documentation trains a model: ``DPOConfig`` defaults (so
  ``gradient_checkpointing=True``, its default) except the constants above and ``bf16=False``
  (DPOConfig's default is bf16): fp32, the reference a frozen copy of the model, run per batch.
- ``trl-fast``: TRL at its fastest on this CPU: ``bf16=True`` (autocast), the reference's
  log-probs precomputed before training (``precompute_ref_log_probs=True``: no reference
  forward in a step), ``gradient_checkpointing=False`` (memory is no concern here).
  Tried and not available in TRL 1.16.0: ``padding_free=True`` warns that it is "temporarily
  unavailable after a refactor" and pads as before; ``use_logits_to_keep`` is gone from
  DPOConfig (the loss reads log-probs from transformers' ``fused_lm_head``).
- ``trl-fp32-fast``: the same in fp32 (``bf16=False``): the fp32 routes' fair peer.
- ``torch`` / ``torch-bf16`` / ``ort``: ``ortft train recipes/dpo.yaml --json`` with
  ``ORTFT_OVERRIDES`` and the route's backend (and ``precision.dtype=bf16``); ``auto``:
  ``backend.name=auto precision.dtype=auto precision.weights=auto`` (its probe picks the route).
  ``torch-bf16-padded``: ``torch-bf16`` with ``backend.unpad=false``, the step before unpad
  reached decoders (``--runners trl,trl-fast,torch-bf16,torch-bf16-padded``; not in the peer
  table). ``ort-two-rows`` and ``torch-bf16w-two-rows``: ``ort`` and ``torch-bf16w`` with
  ``task.share_prefix=false``, each pair as two rows (``--runners ort,ort-two-rows``; not in
  the peer table).

Timing (peer_common): ``--warmup`` steps (default 4), then ``--steps`` timed steps (default 20),
each from the end of the step before to its own end. Neither side's reference pass is in the
steps: TRL's precompute runs in ``DPOTrainer.__init__`` (``init_s``: tokenization plus that
pass), ortft's before step 1 (``reference_s``: computed once per model and data, a cache hit
after, so only the first ortft run of a round set reports it). ``best_ratio`` (the report):
each round's best ortft runner over its best TRL runner, samples/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import peer_common as common  # benchmarks/: the script's folder is on sys.path

RECIPE = common.REPO / "recipes" / "dpo.yaml"
START = common.REPO / "recipes" / "data" / "preference-start"
PAIRS = common.REPO / "recipes" / "data" / "preference-train.jsonl"
BATCH, LR, SEED, MAX_LENGTH, BETA = 8, 1e-5, 42, 48, 0.1
# n_embd, n_layer, n_head, n_inner and vocabulary (None: the tokenizer's) of the model built
# from a config
SIZES = {"gpt2-25m": (512, 8, 8, 2048, None), "gpt2-25m-vocab50k": (512, 8, 8, 2048, 50257)}
MODEL_ENV = "PEER_DPO_MODEL"  # the parent's --model, read again by each worker process
TRL = ("trl", "trl-fast", "trl-fp32-fast")
ORTFT_RUNNERS = {
    "torch": {"backend.name": "torch", "precision.dtype": "fp32"},
    "torch-bf16": {"backend.name": "torch", "precision.dtype": "bf16"},
    "torch-bf16w": common.BF16_WEIGHTS,
    # the same, its batches padded as before backend.unpad reached decoders (not in the table)
    "torch-bf16-padded": {
        "backend.name": "torch",
        "precision.dtype": "bf16",
        "backend.unpad": "false",
    },
    "ort": {"backend.name": "ort", "precision.dtype": "fp32"},
    "auto": common.AUTO,
    # each pair as two rows, as before task.share_prefix (not in the peer table)
    "ort-two-rows": {
        "backend.name": "ort",
        "precision.dtype": "fp32",
        "task.share_prefix": "false",
    },
    "torch-bf16w-two-rows": {**common.BF16_WEIGHTS, "task.share_prefix": "false"},
}
NOT_IN_TABLE = ("torch-bf16-padded", "ort-two-rows", "torch-bf16w-two-rows")
REFERENCE_LINE = re.compile(r"reference log-probs: \d+ train pairs \(computed in ([\d.]+)s\)")


def model_name() -> str:
    return os.environ.get(MODEL_ENV, "gpt2-25m")


def model_dir(name: str) -> Path:
    """The model folder: the recipe's start, or a GPT-2 of ``SIZES`` (``build_model``)."""
    if name == "start":
        return START
    cache = Path(os.environ.get("ORTFT_CACHE", Path.home() / ".cache" / "ortft"))
    return cache / "bench" / f"peer-dpo-{name}"


def build_model(name: str) -> None:
    """Write ``model_dir(name)`` once (seeded: the same weights on every machine)."""
    out = model_dir(name)
    if name == "start" or (out / "model.safetensors").exists():
        return
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(START)
    n_embd, n_layer, n_head, n_inner, vocab = SIZES[name]
    if vocab:  # tokens the texts never hold, so the tokenizer sizes the model's vocabulary
        tokenizer.add_tokens([f"<unused{i}>" for i in range(vocab - len(tokenizer))])
    config = GPT2Config(
        vocab_size=vocab or len(tokenizer), n_positions=128, n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, n_inner=n_inner, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    GPT2LMHeadModel(config).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # a folder appears whole


def overrides(model: Path) -> dict[str, str]:
    """ortft's side of the same fine-tune, over recipes/dpo.yaml."""
    return common.trainer_overrides(LR, BATCH, SEED, **{
        "model.name_or_path": str(model),
        "model.dropout": "0.0",
        "data.eval": "null",  # the recipe's held-out pairs: no eval in a timed run
        "data.max_length": str(MAX_LENGTH),
        "task.loss": "dpo",
        "task.beta": str(BETA),
        "task.sft_weight": "0",  # TRL's loss_type ["sigmoid"] alone
    })  # fmt: skip


def trl_rows(tokenizer: Any) -> list[dict[str, str]]:
    """The training pairs as TRL's string rows, formatted by ortft's own row reader (so both
    sides tokenize the same texts)."""
    from ortft.families.preference.task import Options, PairRows

    reader = PairRows(Options())
    rows = [json.loads(ln) for ln in PAIRS.read_text(encoding="utf-8").splitlines() if ln]
    out = []
    for i, row in enumerate(rows):
        chosen, rejected = reader.conversations(row, i)
        prompt, chosen_text = reader._split(chosen, i, tokenizer)
        _, rejected_text = reader._split(rejected, i, tokenizer)
        out.append({"prompt": prompt, "chosen": chosen_text, "rejected": rejected_text})
    return out


def trl_worker(runner: str, steps: int, warmup: int, out: Path) -> None:
    """One DPOTrainer measurement in this process (``runner``: one of ``TRL``); its JSON."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    os.environ.setdefault("TQDM_DISABLE", "1")
    folder = model_dir(model_name())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    fast = runner != "trl"
    setting: dict[str, Any] = {"max_length": MAX_LENGTH, "beta": BETA, "loss_type": ["sigmoid"]}
    if fast:
        setting.update(precompute_ref_log_probs=True, gradient_checkpointing=False)
    bf16 = runner == "trl-fast"
    record = common.StepRecorder()
    with tempfile.TemporaryDirectory(prefix="peer-dpo-trl-") as tmp:
        args = DPOConfig(
            **common.trainer_arguments(tmp, LR, BATCH, warmup + steps, SEED, bf16, **setting)
        )
        t0 = time.perf_counter()
        trainer = record.trainer(DPOTrainer)(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(trl_rows(tokenizer)),
            processing_class=tokenizer,
            callbacks=[record.callback()],
        )
        init_s = time.perf_counter() - t0
        result = trainer.train()
        lengths = [
            len(r["prompt_ids"]) + len(r[k])
            for r in trainer.train_dataset
            for k in ("chosen_ids", "rejected_ids")
        ]
    common.write_json(out, {
        **record.result(steps, warmup, BATCH, result, model, args),
        "init_s": init_s,
        "precompute_ref_log_probs": args.precompute_ref_log_probs,
        "gradient_checkpointing": args.gradient_checkpointing,
        "tokens_per_sequence": statistics.mean(lengths),
    })  # fmt: skip


def ortft_stderr(stderr: str) -> dict[str, Any]:
    """The reference pass's seconds, where this run computed it (not a cache hit)."""
    found = REFERENCE_LINE.search(stderr)
    return {"reference_s": float(found.group(1))} if found else {}


def report(result: dict[str, Any]) -> None:
    """Each round's best ortft runner over its best TRL runner (samples/s), and the reference
    passes' seconds; added to the JSON as ``best_ratio``."""
    best = result["best_ratio"] = common.best_ratio(result["rounds"], TRL)
    if best["median"] is not None:
        lo, hi = best["range"]
        print(
            f"peer-dpo: best ortft / best TRL, all {len(best['which'])} rounds: "
            f"{best['median']:.2f}× (range {lo:.2f}–{hi:.2f}; {', '.join(best['which'])})"
        )
    runs = [(k, v) for one in result["rounds"] for k, v in one.items() if v["ok"]]
    for key, label in (("init_s", "TRL's DPOTrainer()"), ("reference_s", "ortft's reference")):
        seen = sorted({k: [] for k, v in runs if key in v})
        for runner in seen:
            values = [v[key] for k, v in runs if k == runner and key in v]
            print(f"peer-dpo: {label} {runner}: {statistics.median(values):.1f} s (median)")
    tokens = {k: v["tokens_per_sequence"] for k, v in runs if "tokens_per_sequence" in v}
    if tokens:
        print(f"peer-dpo: TRL's mean tokens a sequence: {sorted(set(tokens.values()))}")


@functools.cache
def work(name: str) -> dict[str, Any]:
    """A pair's useful training FLOPs (peer_common.work): the policy's forward and backward on
    its chosen and its rejected sequence (prompt + response, cut at ``MAX_LENGTH``), averaged
    over the pairs. The reference's log-probs are precomputed by ortft and ``trl-fast``, so
    they are no step's work; ``trl`` runs the reference every step, which this leaves out."""
    from transformers import AutoConfig, AutoTokenizer

    from ortft.tools import flops

    build_model(name)
    folder = model_dir(name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    samples = []
    for row in trl_rows(tokenizer):
        a, b = (
            min(len(tokenizer(row["prompt"] + row[k])["input_ids"]), MAX_LENGTH)
            for k in ("chosen", "rejected")
        )
        samples.append((2, a + b, a * a + b * b))
    fm = flops.from_saved(folder, "AutoModelForCausalLM", "causal-lm")
    return common.work(fm, AutoConfig.from_pretrained(folder), samples, 2 * BATCH)


def bench(name: str) -> common.Bench:
    folder = model_dir(name)
    return common.Bench(
        name="peer-dpo" if name == "gpt2-25m" else f"peer-dpo-{name}",
        script=__file__,
        recipe=RECIPE,
        batch=BATCH,
        overrides=overrides(folder),
        model=f"DPO, {name} ({folder.name}), {MAX_LENGTH} tokens",
        worker=lambda bf16, steps, warmup, out: trl_worker(TRL[int(bf16)], steps, warmup, out),
        extra={
            "lr": LR,
            "beta": BETA,
            "max_length": MAX_LENGTH,
            "model": name,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        },  # fmt: skip
        extra_keys=("init_s", "reference_s", "tokens_per_sequence"),
        bases=(TRL[0], TRL[1]),
        more_peers=TRL[2:],
        named_worker=trl_worker,
        ortft_runners=ORTFT_RUNNERS,
        ortft_stderr=ortft_stderr,
        report=report,
        work=lambda: work(name),
    )


def task_peers() -> list[common.TaskPeer]:
    """This bench's rows of the one peer table (benchmarks/peers.py): the default model, each
    measurement with the environment this script's command line sets (and only those)."""
    name = model_name()
    runners = {k: v for k, v in ORTFT_RUNNERS.items() if k not in NOT_IN_TABLE}
    peer = common.task_peer(dataclasses.replace(bench(name), ortft_runners=runners), "dpo")
    own = {MODEL_ENV: name}

    def one(runner: str, steps: int, warmup: int, tmp: Path, timeout: float) -> dict[str, Any]:
        build_model(name)  # once: it is kept in the cache
        before = dict(os.environ)
        os.environ.update(own)
        try:
            return peer.measure(runner, steps, warmup, tmp, timeout)
        finally:
            os.environ.clear()
            os.environ.update(before)

    return [dataclasses.replace(peer, measure=one)]


if __name__ == "__main__":
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--model", choices=("start", *SIZES), default=model_name(), help="the model (see above)"
    )
    known, _ = own.parse_known_args()
    os.environ[MODEL_ENV] = known.model  # the workers (fresh processes) read it
    if not {"-h", "--help", "--worker"} & set(sys.argv):
        build_model(known.model)
    common.main(bench(known.model), __doc__ or "", parents=(own,))
