"""Models and tokenizers: load a pretrained one, or build one from a small config.

Every model is built with ``attn_implementation="eager"`` when it will run under ORTModule:
ORTModule cannot build gradients for transformers' default ``sdpa`` attention (measured on
torch 2.6 / ORT 1.19). The ``TaskModule`` adapter returns plain ``(loss, logits)`` tensors,
so ORTModule never meets a cache object or a ModelOutput it cannot flatten.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ortft.backends.torch import hf_config, load_checks
from ortft.core.errors import InputError, first_line
from ortft.recipe.io import LoadedRecipe, looks_local
from ortft.recipe.schema import FromConfig, ModelSection, TrainTokenizer
from ortft.tasks import protocols, traits

log = logging.getLogger("ortft")

SPECIAL_WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BPE_EOS = "<|endoftext|>"


# --------------------------------------------------------------------------- tokenizers


def train_tokenizer(texts: list[str], spec: TrainTokenizer) -> Any:
    """Train a tokenizer on the training texts (deterministic for the same texts)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    if spec.kind == "wordpiece":
        normalizer = normalizers.BertNormalizer(lowercase=True)
        pre = pre_tokenizers.BertPreTokenizer()
        # The trainer numbers "##x" continuation pieces in hash-map order, which changes from
        # process to process (and with it the tie-breaks between merges). Registering every
        # "##x" up front in sorted order makes training deterministic; the vocabulary is then
        # rebuilt below so those pieces are ordinary entries, not special tokens.
        chars: set[str] = set()
        for text in texts:
            for word, _ in pre.pre_tokenize_str(normalizer.normalize_str(text)):
                chars.update(word)
        fixed = SPECIAL_WORDPIECE + [f"##{c}" for c in sorted(chars)]
        trainer = trainers.WordPieceTrainer(
            vocab_size=max(spec.vocab_size, len(fixed) + len(chars)),
            min_frequency=spec.min_frequency,
            special_tokens=fixed,
            initial_alphabet=sorted(chars),
            show_progress=False,
        )
        draft = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        draft.normalizer, draft.pre_tokenizer = normalizer, pre
        draft.train_from_iterator(texts, trainer=trainer)
        tok = Tokenizer(models.WordPiece(vocab=draft.get_vocab(), unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = normalizer, pre
        tok.decoder = decoders.WordPiece()
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],  # as BERT's
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=train_byte_bpe(texts, spec),
        bos_token=BPE_EOS,
        eos_token=BPE_EOS,
        unk_token=BPE_EOS,
        pad_token=BPE_EOS,
    )


def train_byte_bpe(texts: list[str], spec: TrainTokenizer) -> Any:
    """A GPT-2-style byte-level BPE (``tokenizers.Tokenizer``) trained on ``texts``, with
    ``BPE_EOS`` as its one special token (Whisper's tokenizer is built on it too:
    ``ortft.families.speech.processor``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=[BPE_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def model_source(loaded: LoadedRecipe, value: str) -> str:
    """A local path as a string, or the Hub id unchanged."""
    path = loaded.resolve_path(value)
    if path.exists() or looks_local(value):
        if not path.exists():
            raise InputError(f"{path}: model/tokenizer directory not found")
        return str(path)
    return value


def load_tokenizer(
    loaded: LoadedRecipe, saved_dir: Path | None = None, sample_texts: list[str] | None = None
) -> Any:
    """The tokenizer from ``saved_dir`` (a resumed run), the recipe's path, or the model's.

    A loaded one must fit the model and ``sample_texts`` (some training texts):
    ``load_checks.check_tokenizer``; a resumed run's was checked when the run started."""
    from transformers import AutoConfig, AutoTokenizer

    spec: ModelSection = loaded.recipe.model
    value = str(saved_dir) if saved_dir else (spec.tokenizer.path or spec.name_or_path)
    if value is None:
        return None  # to be trained
    source = value if saved_dir else model_source(loaded, value)
    if not saved_dir and not spec.tokenizer.path:
        _check_model_dir(source)
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"{value}: cannot load tokenizer ({first_line(err)})") from None
    if tok.pad_token is None:  # GPT-2-style tokenizers have none; pad with EOS
        tok.pad_token = tok.eos_token
    if not saved_dir:
        rows = None  # from_config: the embedding is built with a row per token
        if spec.name_or_path:
            try:
                config = AutoConfig.from_pretrained(
                    model_source(loaded, spec.name_or_path),
                    trust_remote_code=spec.trust_remote_code,
                )
                rows = load_checks.embedding_rows(config)
            except (OSError, ValueError, KeyError):
                pass  # build_model reports a config it cannot read
        field = "model.tokenizer.path" if spec.tokenizer.path else "model.name_or_path"
        load_checks.check_tokenizer(tok, rows, sample_texts or [], field, source)
    return tok


def _check_model_dir(source: str) -> None:
    """A local model folder must hold config.json: say so, not a transformers error about it."""
    path = Path(source)
    if path.is_dir() and not (path / "config.json").exists():
        pipeline = (path / "model_index.json").exists()
        hint = " but model_index.json: a diffusers pipeline, for text-to-image" if pipeline else ""
        raise InputError(
            f"model.name_or_path: {path} is not a model directory (no config.json{hint})"
        )


def check_fits(loaded: LoadedRecipe, task: Any) -> None:
    """The recipe's pretrained folder holds a model the task builds and feeds: one line naming
    the folder and why otherwise (``load_checks.check_fits``), before anything else reads it."""
    spec = loaded.recipe.model
    if spec.name_or_path is None or not task.auto_class:
        return
    source = model_source(loaded, spec.name_or_path)
    _check_model_dir(source)
    load_checks.check_fits(source, task, spec.trust_remote_code)


# --------------------------------------------------------------------------- models


CLASSIC = ("bert", "gpt2", "t5")  # built as before any model type could be (golden losses)


def _config_from_spec(spec: FromConfig, tokenizer: Any, dropout: float | None) -> Any:
    """bert, gpt2 and t5 through their own branch; any other model type generically."""
    if spec.architecture not in CLASSIC:
        return hf_config.generic_config(spec, tokenizer, dropout)
    config = _classic_config(spec, tokenizer, dropout)
    hf_config.apply_options(config, spec)
    return config


def _classic_config(spec: FromConfig, tokenizer: Any, dropout: float | None) -> Any:
    from transformers import BertConfig, GPT2Config, T5Config

    inter = spec.intermediate_size or 4 * spec.hidden_size
    p = 0.1 if dropout is None else dropout
    if spec.architecture == "t5":
        # the tokenizer's end-of-text ([SEP] for wordpiece) ends targets; decoding starts from pad
        eos = (
            tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        )
        return T5Config(  # type: ignore[call-arg]  # T5Config's typed fields omit the decoder's
            vocab_size=len(tokenizer),
            d_model=spec.hidden_size,
            d_kv=spec.hidden_size // spec.num_heads,
            d_ff=inter,
            num_layers=spec.num_layers,
            num_decoder_layers=spec.num_layers,
            num_heads=spec.num_heads,
            dropout_rate=p,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    if spec.architecture == "bert":
        return BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            intermediate_size=inter,
            max_position_embeddings=spec.max_position_embeddings,
            hidden_dropout_prob=p,
            attention_probs_dropout_prob=p,
            pad_token_id=tokenizer.pad_token_id,
        )
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=spec.hidden_size,
        n_layer=spec.num_layers,
        n_head=spec.num_heads,
        n_inner=inter,
        n_positions=spec.max_position_embeddings,
        resid_pdrop=p,
        embd_pdrop=p,
        attn_pdrop=p,
        summary_first_dropout=p,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _set_dropout(config: Any, p: float) -> None:
    """model.dropout on a loaded config: every dropout probability and stochastic depth it has,
    as ``from_config`` sets them (a pretrained Swin or BEiT keeps drop_path_rate 0.1 otherwise)."""
    for name, value in hf_config.dropout_kwargs(type(config), config, p).items():
        setattr(config, name, value)


def build_model(
    loaded: LoadedRecipe,
    task_auto_class: str,
    tokenizer: Any,
    labels: list[str] | None,
    attn: str,
    weights_dir: Path | None = None,
    config: Any = None,
) -> nn.Module:
    """The Hugging Face model for the task (weights from ``weights_dir`` when resuming)."""
    import transformers
    from transformers import AutoConfig

    spec = loaded.recipe.model
    auto = getattr(transformers, task_auto_class)
    label_kw: dict[str, Any] = {}
    if labels is not None:
        label_kw = {
            "num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {name: i for i, name in enumerate(labels)},
        }
    if spec.from_config and weights_dir is None:
        config = config or _config_from_spec(spec.from_config, tokenizer, spec.dropout)
        for k, v in label_kw.items():
            setattr(config, k, v)
        # deit and levit map to two classes (with and without a distillation head) and
        # transformers 5.24's from_config then iterates config.architectures: None is a TypeError
        if config.architectures is None:
            config.architectures = []
        attn = hf_config.attention_for(auto, config, attn)
        config._attn_implementation = attn
        torch.manual_seed(loaded.recipe.training.seed)
        return auto.from_config(config, attn_implementation=attn)
    source = str(weights_dir) if weights_dir else model_source(loaded, spec.name_or_path or "")
    if weights_dir is None:
        _check_model_dir(source)
    load_checks.check_weights(Path(source))  # a truncated file named before loading starts
    remote = spec.trust_remote_code  # off unless the recipe sets it: Hub code never runs by default
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=remote, **label_kw)
        head = None  # a task with labels: keep the checkpoint's head, reorder it or start afresh
        if labels is not None:  # from the head's own labels (label_kw replaced them above)
            own = AutoConfig.from_pretrained(source, trust_remote_code=remote)
            head = load_checks.plan_head(own, labels)
        if spec.dropout is not None:
            _set_dropout(config, spec.dropout)
        # vision and audio configs have no pad_token_id at all (transformers 5), only text ones
        if tokenizer is not None and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
        attn = hf_config.attention_for(auto, config, attn)  # ResNet, ConvNeXt: no sdpa path
        torch.manual_seed(loaded.recipe.training.seed)  # a fresh head is seeded too
        model, info = auto.from_pretrained(
            source,
            config=config,
            attn_implementation=attn,
            trust_remote_code=remote,
            ignore_mismatched_sizes=head is not None and head.resize,
            output_loading_info=True,
        )
    except (OSError, ValueError, KeyError) as err:
        raise InputError(f"{spec.name_or_path}: cannot load model ({first_line(err)})") from None
    except load_checks.load_errors() as err:  # cut or corrupt weights (safetensors, torch.load)
        raise InputError(
            f"{source}: cannot read the model's weights ({first_line(err)}); "
            "download or save the model again"
        ) from None
    if head is not None:
        load_checks.settle_head(model, head, info)
    return model


class TaskModule(nn.Module):
    """What the backends wrap: a forward that returns just ``(loss, logits)``, as the task
    calls its model (``Task.forward``; question answering's start/end positions, decoders'
    ``use_cache=False``, which keeps a ``DynamicCache`` out of ORTModule's outputs: it cannot
    flatten one and would silently fall back to PyTorch)."""

    def __init__(self, model: nn.Module, task: Any):
        super().__init__()
        self.model = model
        self.task = task  # what the torch route's unpad plan reads (unpad.plan)
        self._task_forward = task.forward

    def forward(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # by name: text tasks take input_ids / attention_mask / labels, images pixel_values
        return self._task_forward(self.model, **inputs)


# --------------------------------------------------------------------------- LoRA adapters

# The attention projections LoRA adapts when adapter.target_modules is not given (measured to
# train through ORTModule: bert query/value, gpt2 c_attn, t5 q/v).
DEFAULT_TARGETS = {
    "bert": ["query", "value"],
    "gpt2": ["c_attn"],
    "t5": ["q", "v"],
    "bart": ["q_proj", "v_proj"],
    "llama": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
}
HEADS = ("classifier", "score", "qa_outputs")  # new task heads trained in full with train_head


def apply_adapter(model: nn.Module, spec: Any, task: Any = None) -> nn.Module:
    """Wrap ``model`` in a PEFT LoRA model (DoRA: peft's ``use_dora``): only the adapter (and
    the new head, or what ``protocols.AdaptsLanguageModel`` names) train. peft builds the task
    model ``traits.peft_task_type`` names (None: the plain ``PeftModel``)."""
    try:
        import peft
    except ImportError as err:
        raise InputError(
            f"adapter.kind={spec.kind} needs the peft extra ({err}); "
            "pip install -c requirements/lock.txt -r requirements/extras.txt"
        ) from None
    kind = getattr(model.config, "model_type", "")
    task_type = traits.peft_task_type(task)
    if isinstance(task, protocols.AdaptsLanguageModel):
        targets, saved = task.adapter_targets(model, spec.target_modules)
        config = _lora_config(peft, spec, targets, saved, kind, task_type)
        return peft.get_peft_model(model, config)
    targets = spec.target_modules or DEFAULT_TARGETS.get(kind)
    if not targets:
        raise InputError(
            f"adapter.target_modules: no default for model type {kind}; "
            "name the modules to adapt, e.g. [q_proj, v_proj]"
        )
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        raise InputError(
            f"adapter.target_modules: {', '.join(missing)} matches no module of this "
            f"{kind} model (it has e.g. {', '.join(sorted(names - {''})[:8])})"
        )
    heads = [h for h in HEADS if h in names] if spec.train_head else []
    config = _lora_config(peft, spec, list(targets), heads, kind, task_type)
    return peft.get_peft_model(model, config)


def _lora_config(
    peft: Any, spec: Any, targets: Any, saved: list[str], kind: str, task_type: str | None
) -> Any:
    return peft.LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        modules_to_save=saved or None,
        fan_in_fan_out=kind == "gpt2",  # GPT-2's Conv1D stores W transposed
        use_dora=spec.kind == "dora",
        task_type=task_type,
    )


def is_adapted(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain transformers model with the adapter folded into its weights (``model`` unchanged)."""
    import copy

    peft_model: Any = copy.deepcopy(model) if is_adapted(model) else None  # a PeftModel
    return peft_model.merge_and_unload() if peft_model is not None else model


def freeze(model: nn.Module, patterns: list[str]) -> None:
    """backend.trainable: only parameters whose name matches a glob train; the rest are frozen."""
    import fnmatch

    names = [n for n, _ in model.named_parameters()]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise InputError(
            f"backend.trainable: {', '.join(unmatched)} matches no parameter of this "
            f"model (names look like: {', '.join(names[:2])}, ..., {names[-1]})"
        )
    for name, p in model.named_parameters():
        p.requires_grad_(any(fnmatch.fnmatchcase(name, pat) for pat in patterns))


def count_parameters(model: nn.Module, trainable: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


def model_log_line(model: nn.Module, attn: str) -> str:
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", type(model).__name__)
    n = count_parameters(model)
    size = f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"
    return f"model: {kind}, {size} parameters, attention={attn}"
