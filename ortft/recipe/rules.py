"""Cross-field rules of a recipe: combinations that cannot run are errors at validation, never
a silent fallback (fp32, a no-op) at run time. Each rule yields one line per problem, naming
the fields involved; ``combinations`` (``Recipe``'s model validator) runs every rule and raises
one ``ValueError`` holding all their lines, which ``io.format_errors`` splits: a recipe that
breaks three rules shows three lines in one ``ortft validate``, not one per fix.

``Recipe`` here is ``Any``: schema.py imports this module, so importing it back for the type
would be a cycle (tests/test_layout.py)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from ortft import tasks
from ortft.data import checks, encoded
from ortft.data.spec import DataSection
from ortft.recipe import backends, hf_names
from ortft.tasks import protocols

Recipe = Any  # ortft.recipe.schema.Recipe, validated up to its model validators


def has_eval_data(data: DataSection) -> bool:
    return bool(data.eval) or data.eval_fraction > 0 or bool(data.eval_split)


def problems(r: Recipe) -> list[str]:
    """Every cross-field problem of the recipe, in the order the rules run."""
    return [
        *combination_problems(r),
        *modality(r),
        *task_architecture(r),
        *streaming(r),
        *positions(r),
        *eval_user_problems(r),
    ]


def _raise_all(found: list[str]) -> None:
    if found:
        raise ValueError("\n".join(found))  # one problem a line: io.format_errors splits them


def combinations(r: Recipe) -> None:
    """``Recipe``'s first model validator: raise one ``ValueError`` with every problem of every
    rule, one a line (pydantic stops at the first validator that raises, so this one runs them
    all, ``eval_users``'s included)."""
    _raise_all(problems(r))


def eval_users(r: Recipe) -> None:
    """``Recipe``'s second model validator: ``eval_user_problems`` alone (already reported by
    ``combinations``, so it finds none once that passed)."""
    _raise_all(list(eval_user_problems(r)))


def combination_problems(r: Recipe) -> Iterator[str]:
    """Precision, device, backend, optimizer and adapter combinations."""
    # hardware.device=auto is checked again once resolved (runtime.check_precision).
    dtype, device = r.precision.dtype, r.hardware.device
    if dtype == "fp16" and device == "cpu":
        yield (
            "precision.dtype=fp16 needs CUDA: PyTorch has no fp16 training on cpu; "
            "use bf16 (backend.name=torch) or fp32"
        )
    if r.precision.weights != "fp32":
        yield from bf16_weights_problems(r)
    if isinstance(r.deepspeed, dict):
        from ortft.recipe import deepspeed as zero

        found = zero.check(r.deepspeed, r)
        if found:
            yield "deepspeed: " + "; ".join(found)
    elif isinstance(r.deepspeed, str) and not r.deepspeed.endswith(".json"):
        yield f"deepspeed: {r.deepspeed!r} is not a .json file path"
    if r.optimizer.name == "adamw_ort_fused" and device == "cpu":
        yield "optimizer.name=adamw_ort_fused needs CUDA; use adamw on cpu"
    found = backends.problems(r)
    if found:
        yield "; ".join(found)
    if r.adapter is not None and r.backend.trainable:
        yield "backend.trainable and adapter both choose what trains; use one of them"


def bf16_weights_problems(r: Recipe) -> Iterator[str]:
    """precision.weights=bf16 needs a bf16 run on the torch route (auto: where it resolves so);
    precision.weights=auto needs the probe that weighs it."""
    key = f"precision.weights={r.precision.weights}"
    if r.precision.dtype not in ("bf16", "auto"):
        yield f"{key} needs precision.dtype bf16 or auto, not {r.precision.dtype}"
    if r.backend.name not in ("torch", "auto"):
        yield f"{key} needs backend.name torch (or auto), not {r.backend.name}"
    if r.precision.weights == "auto" and "auto" not in (r.backend.name, r.backend.compile):
        yield (
            "precision.weights=auto is chosen by the probe, which runs under backend.name=auto "
            "or backend.compile=auto; set one of them, or precision.weights bf16 or fp32"
        )
    if r.deepspeed is not None:
        yield (
            f"{key} with deepspeed: DeepSpeed's bf16 already casts the model "
            "and keeps fp32 master weights; leave precision.weights at fp32"
        )


def reads_text(task: tasks.Task) -> bool:
    """Rows of text a tokenizer reads; not files a processor decodes per batch
    (``protocols.ReadsFiles``: images, audio, captioned images)."""
    return not isinstance(task, protocols.ReadsFiles)


def modality(r: Recipe) -> Iterator[str]:
    """What a task's rows hold decides what the model needs: a tokenizer (text), or what the
    family's own rules ask (``protocols.ChecksRecipe``: images, audio)."""
    task = tasks.get(r.task.name, r.task)
    tok = r.model.tokenizer
    if isinstance(task, protocols.ChecksRecipe):  # the family's own rules
        yield from task.recipe_problems(r)
    elif reads_text(task) and r.model.from_config and not tok.path and not tok.train:
        yield "a model built from_config needs model.tokenizer.path or model.tokenizer.train"
    if not reads_text(task) and r.data.streaming:
        yield f"data.streaming: {r.task.name} reads stored data (a list of files)"


# Model types whose positions are a learned table of absolute rows, with the config key that
# sizes it and the rows a padding offset takes. A position past the table is an index error at
# step 0 (a tensor-size RuntimeError), so a longer data.max_length is refused up front. RoBERTa
# numbers positions from pad_token_id + 1 = 2: 514 rows hold 512 tokens. OPT and BART add their
# offset of 2 on top of max_position_embeddings, so all of it is usable (offset 0 here). Rotary
# (llama, mistral, qwen2, gpt_neox), relative (t5, deberta-v2) and ALiBi (bloom) models have no
# such table: longer inputs run, so they are not refused.
LEARNED_POSITIONS: dict[str, tuple[str, int]] = {
    "bert": ("max_position_embeddings", 0),
    "roberta": ("max_position_embeddings", 2),
    "xlm-roberta": ("max_position_embeddings", 2),
    "camembert": ("max_position_embeddings", 2),
    "mpnet": ("max_position_embeddings", 2),
    "longformer": ("max_position_embeddings", 2),
    "distilbert": ("max_position_embeddings", 0),
    "electra": ("max_position_embeddings", 0),
    "albert": ("max_position_embeddings", 0),
    "mobilebert": ("max_position_embeddings", 0),
    "ernie": ("max_position_embeddings", 0),
    "xlm": ("max_position_embeddings", 0),
    "gpt2": ("n_positions", 0),
    "gpt_bigcode": ("n_positions", 0),
    "gpt_neo": ("max_position_embeddings", 0),
    "opt": ("max_position_embeddings", 0),
    "bart": ("max_position_embeddings", 0),
    "mbart": ("max_position_embeddings", 0),
    "biogpt": ("max_position_embeddings", 0),
}


def position_limit(model_type: str, config: dict[str, Any]) -> tuple[int, str] | None:
    """(the longest input, the config key that sets it) for a model with learned absolute
    positions; None for any other model (or a config without the key)."""
    entry = LEARNED_POSITIONS.get(model_type)
    if entry is None:
        return None
    key, offset = entry
    rows = config.get(key)
    return (rows - offset, key) if isinstance(rows, int) and not isinstance(rows, bool) else None


def positions(r: Recipe) -> Iterator[str]:
    """data.max_length fits a from_config model's learned position table."""
    fc = r.model.from_config
    rows = getattr(fc, "max_position_embeddings", None)
    if fc is None or rows is None:
        return
    kind = getattr(fc, "architecture", "")
    options = getattr(fc, "options", None) or {}  # they win over the fields (model.py)
    config = {"max_position_embeddings": rows, "n_positions": rows, **options}
    limit = position_limit(kind, config)
    if limit is not None and r.data.max_length > limit[0]:
        field = f"options.{limit[1]}" if limit[1] in options else "max_position_embeddings"
        yield (
            f"data.max_length={r.data.max_length} is beyond the {limit[0]} positions of "
            f"model.from_config.{field}={config[limit[1]]} ({kind} learns one embedding per "
            f"position); lower data.max_length or raise model.from_config.{field}"
        )


def streaming(r: Recipe) -> Iterator[str]:
    """data.streaming: what a stream of rows cannot give (see ortft/data/streaming.py)."""
    d = r.data
    if not d.streaming:
        return
    task = tasks.get(r.task.name, r.task)
    if not r.training.max_steps:
        yield "data.streaming needs training.max_steps (a stream has no length)"
    if not d.eval and not d.eval_split and d.eval_fraction > 0:
        yield (
            "data.streaming cannot hold out data.eval_fraction of a stream; "
            "give data.eval (read in full) or set data.eval_fraction: 0"
        )
    if checks.needs_labels(task) and not d.label_names:
        yield "data.streaming needs data.label_names (a stream is read once)"
    if not encoded.row_local(task):
        yield (
            f"data.streaming: {r.task.name} tokenizes across rows (packing or row ids); "
            "it needs stored data"
        )
    if r.backend.name not in ("ort", "torch"):
        yield f"data.streaming runs on backend.name ort or torch, not {r.backend.name}"
    if d.num_proc > 1:
        yield "data.num_proc applies to stored data; a stream tokenizes as it reads"


def task_architecture(r: Recipe) -> Iterator[str]:
    """A model built from_config must be a transformers model type the task's Auto class builds
    (an encoder-decoder only for seq2seq: ``hf_names.fitting``); a family that builds its own
    model checks what the recipe asks of it (``protocols.BuildsModel``)."""
    fc, name = r.model.from_config, r.task.name
    task = tasks.get(name, r.task)
    if isinstance(task, protocols.BuildsModel):
        yield from task.model_problems(r)
        return
    if fc is None:
        return
    auto_class = task.auto_class
    if not auto_class:  # a plugin task that builds its own model
        return
    fit = hf_names.fitting(auto_class)
    arch = fc.architecture
    if arch in fit:
        return
    listed = f"fitting {name}: {', '.join(fit)}"
    if arch in hf_names.encoder_decoders():
        yield (
            f"model.from_config.architecture={arch} is an encoder-decoder, which fits only "
            f"seq2seq ({listed})"
        )
        return
    if arch in hf_names.known():
        yield (
            f"model.from_config.architecture={arch} cannot learn {name}: transformers' "
            f"{auto_class} does not build it ({listed})"
        )
        return
    close = difflib.get_close_matches(arch, fit, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    yield (
        f"model.from_config.architecture={arch} is not a transformers model type; {hint}({listed})"
    )


def eval_user_problems(r: Recipe) -> Iterator[str]:
    """Early stopping, best-model selection and hpo need evals with the task's metrics."""
    t = r.training
    users: list[tuple[str, str, bool]] = []  # (who, metric, needs eval_every)
    if t.early_stopping:
        users.append(("training.early_stopping", t.early_stopping.metric, True))
    if r.checkpoint.final == "best":
        users.append(("checkpoint.final=best", r.selection_metric(), True))
    if r.hpo:
        users.append(("hpo", r.hpo.metric, r.hpo.pruning.enabled))
    metrics = tasks.get(r.task.name, r.task).eval_metrics
    for who, metric, needs_every in users:
        if metric not in metrics:
            yield (
                f"{who}: {metric} is not a metric of {r.task.name} (one of {', '.join(metrics)})"
            )
        if not has_eval_data(r.data):
            yield f"{who} needs eval data: set data.eval, data.eval_split or data.eval_fraction > 0"
        if needs_every and not t.eval_every:
            yield f"{who} needs training.eval_every (evaluations during training)"
