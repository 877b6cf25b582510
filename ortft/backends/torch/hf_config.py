"""``model.from_config`` for any transformers model type: the recipe's generic sizes mapped onto
that type's config class (``AutoConfig.for_model``).

Each generic field names the config fields it sets, by their canonical names: most configs
alias hidden_size / num_hidden_layers / num_attention_heads through ``attribute_map`` (bart:
d_model, encoder_layers, encoder_attention_heads), and an encoder-decoder has a second copy
for its decoder. Every candidate the config has is set, so bart's decoder is as deep as its
encoder. Values go into the constructor, so fields derived there (llama's head_dim) follow.
bert, gpt2 and t5 keep their own construction in ``models._config_from_spec``.

Vision configs that state their shape in their own terms (stages of widths, ratios: swin,
convnext, resnet, regnet, dinov2, levit) get it derived from the same generic sizes
(``VISION``); the recipe has no list fields.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ortft.core.errors import RecipeError, first_line
from ortft.recipe.schema import FromConfig
from ortft.tasks import protocols

FIELD = "model.from_config"

# generic recipe field -> the config fields (canonical or aliased) that carry it
SIZES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "d_model", "n_embd"),
    "num_layers": (
        "num_hidden_layers",
        "num_layers",
        "encoder_layers",
        "decoder_layers",
        "num_decoder_layers",
        "n_layer",
    ),
    "num_heads": (
        "num_attention_heads",
        "num_heads",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "n_head",
    ),
    "intermediate_size": (
        "intermediate_size",
        "ffn_dim",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "d_ff",
        "n_inner",
        "hidden_dim",  # distilbert's feed-forward width
        "ffn_hidden_size",  # falcon's
    ),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "num_kv_heads": ("num_key_value_heads",),
}
REQUIRED = ("hidden_size", "num_layers", "num_heads")
# a head's width, where a config states it instead of deriving it (gemma defaults to 256)
HEAD_DIM = ("head_dim", "d_kv")
# tokenizer attribute -> config field, set where the config has the field
TOKEN_IDS = {
    "cls_token_id": "cls_token_id",
    "sep_token_id": "sep_token_id",
    "mask_token_id": "mask_token_id",
    "unk_token_id": "unk_token_id",
}


def _ffn(spec: FromConfig) -> int:
    return spec.intermediate_size or 4 * spec.hidden_size


def _widths(spec: FromConfig) -> list[int]:
    """A stage per layer, each twice as wide as the last (as ResNet/ConvNeXt/Swin halve the
    resolution and double the channels from stage to stage)."""
    return [spec.hidden_size * 2**i for i in range(spec.num_layers)]


def _swin(spec: FromConfig) -> dict[str, Any]:
    # a stage per layer, of two blocks: a window block and a shifted-window one (swin's unit:
    # every Swin's depths are even); patch merging doubles the width, so the heads double too
    # and each stays hidden_size / num_heads wide (swin-tiny: 96 / 3 = 32 in every stage)
    return {
        "embed_dim": spec.hidden_size,
        "depths": [2] * spec.num_layers,
        "num_heads": [spec.num_heads * 2**i for i in range(spec.num_layers)],
        "mlp_ratio": _ffn(spec) / spec.hidden_size,
    }


def _convnext(spec: FromConfig) -> dict[str, Any]:
    # no attention and a fixed 4x feed-forward (ConvNeXt's inverted bottleneck)
    return {
        "num_stages": spec.num_layers,
        "hidden_sizes": _widths(spec),
        "depths": [1] * spec.num_layers,
    }


def _resnet(spec: FromConfig) -> dict[str, Any]:
    # basic blocks (ResNet-18/34's): the default bottleneck squeezes each width by 4 (16 -> 4
    # channels at hidden_size 16); the stem is as wide as the first stage, as in ResNet-18
    return {
        "embedding_size": spec.hidden_size,
        "hidden_sizes": _widths(spec),
        "depths": [1] * spec.num_layers,
        "layer_type": "basic",
    }


def _regnet(spec: FromConfig) -> dict[str, Any]:
    # grouped convolutions of hidden_size / num_heads channels a group (as heads split the
    # width): every stage's width is a multiple of it, as RegNet requires
    return {
        "embedding_size": spec.hidden_size,
        "hidden_sizes": _widths(spec),
        "depths": [1] * spec.num_layers,
        "groups_width": spec.hidden_size // spec.num_heads,
    }


def _whole_ratio(spec: FromConfig) -> int:
    """The feed-forward width as a multiple of hidden_size: dinov2's and levit's mlp_ratio are
    int fields in transformers 5.24 (2.5 is rejected)."""
    ratio, rest = divmod(_ffn(spec), spec.hidden_size)
    if rest:
        raise RecipeError(
            f"{FIELD}.intermediate_size: {spec.architecture} states it as a whole multiple of "
            f"hidden_size (mlp_ratio); {_ffn(spec)} is not one of {spec.hidden_size}"
        )
    return ratio


def _levit(spec: FromConfig) -> dict[str, Any]:
    # a stage per layer (one block each), widths doubling, heads hidden_size / num_heads wide
    # (key_dim) so they double too; between stages LeViT's attention subsampling, as its
    # default down_ops: [kind, key_dim, heads, attention ratio 4, mlp ratio 2, stride 2]
    widths, key, n = _widths(spec), spec.hidden_size // spec.num_heads, spec.num_layers
    return {
        "hidden_sizes": widths,
        "num_attention_heads": [w // key for w in widths],
        "depths": [1] * n,
        "key_dim": [key] * n,
        "mlp_ratio": [_whole_ratio(spec)] * n,
        "attention_ratio": [2] * n,
        "down_ops": [["Subsample", key, w // key, 4, 2, 2] for w in widths[:-1]],
    }


def _dinov2(spec: FromConfig) -> dict[str, Any]:
    ratio = _whole_ratio(spec)
    return {
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "mlp_ratio": ratio,
    }


# model_type -> (the generic fields it reads, its constructor arguments from them). These
# replace SIZES' mapping for the type: swin's num_heads is a list and its hidden_size derived,
# the CNNs have neither field. vit, deit and beit take the generic mapping as text models do.
VISION: dict[str, tuple[tuple[str, ...], Callable[[FromConfig], dict[str, Any]]]] = {
    "swin": (("hidden_size", "num_layers", "num_heads", "intermediate_size"), _swin),
    "convnext": (("hidden_size", "num_layers"), _convnext),
    "convnextv2": (("hidden_size", "num_layers"), _convnext),
    "resnet": (("hidden_size", "num_layers"), _resnet),
    "regnet": (("hidden_size", "num_layers", "num_heads"), _regnet),
    "dinov2": (("hidden_size", "num_layers", "num_heads", "intermediate_size"), _dinov2),
    "levit": (("hidden_size", "num_layers", "num_heads", "intermediate_size"), _levit),
}
# options ortft itself reads, allowed on any vision config (one with num_channels) even where
# the class has no such field: the processor of a from_config model is sized by image_size
# (the vision family's processor.for_config), which resnet and regnet do not declare
ORTFT_OPTIONS = ("image_size",)
# stochastic depth, which model.dropout sets with the dropout probabilities
STOCHASTIC_DEPTH = ("drop_path_rate", "drop_connect_rate")


def vision_kwargs(spec: FromConfig, cls: Any) -> dict[str, Any]:
    """``VISION``'s constructor arguments; a size the recipe gives that the type has no use
    for is an error, as a missing field is in ``size_kwargs``."""
    uses, build = VISION[spec.architecture]
    unused = sorted((spec.model_fields_set & set(SIZES)) - set(uses))
    if unused:
        raise RecipeError(
            f"{FIELD}.{unused[0]}: {cls.__name__} has no such size ({spec.architecture} is "
            f"shaped by {', '.join(uses)})"
        )
    return build(spec)


def config_class(model_type: str) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]
    except KeyError:
        raise RecipeError(
            f"{FIELD}.architecture={model_type}: transformers has no config for it"
        ) from None


def _default(cls: Any) -> Any:
    try:
        return cls()
    except Exception as err:  # noqa: BLE001 - composite configs need sub-configs
        raise RecipeError(
            f"{FIELD}.architecture: {cls.__name__} cannot be built from sizes alone ({err})"
        ) from None


def _canonical(cls: Any, default: Any, names: tuple[str, ...]) -> list[str]:
    """The config fields among ``names`` that ``default`` has, each by its canonical name."""
    out: list[str] = []
    for name in names:
        canon = cls.attribute_map.get(name, name)
        if isinstance(getattr(cls, canon, None), property):
            continue  # derived, read-only (falcon's head_dim): the constructor does not take it
        if hasattr(default, canon) and canon not in out:
            out.append(canon)
    return out


def size_kwargs(spec: FromConfig, cls: Any, default: Any) -> dict[str, Any]:
    """The recipe's sizes as constructor arguments of ``cls``."""
    values = {
        "hidden_size": spec.hidden_size,
        "num_layers": spec.num_layers,
        "num_heads": spec.num_heads,
        "intermediate_size": spec.intermediate_size or 4 * spec.hidden_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "num_kv_heads": spec.num_kv_heads,
    }
    given = spec.model_fields_set
    kw: dict[str, Any] = {}
    for field, names in SIZES.items():
        if values[field] is None:
            continue
        targets = _canonical(cls, default, names)
        if not targets and (field in REQUIRED or field in given):
            raise RecipeError(
                f"{FIELD}.{field}: {cls.__name__} has no such field (looked for "
                f"{', '.join(names)}); set it through {FIELD}.options"
            )
        kw.update(dict.fromkeys(targets, values[field]))
    for name in _canonical(cls, default, HEAD_DIM):
        kw[name] = spec.hidden_size // spec.num_heads
    return kw


def token_kwargs(tokenizer: Any, default: Any) -> dict[str, Any]:
    """Token ids of the locally trained tokenizer, as the t5 branch sets them: a wordpiece
    tokenizer's [SEP] ends texts and its [CLS] starts them; an encoder-decoder starts decoding
    from pad."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    kw: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    for attr, field in TOKEN_IDS.items():
        value = getattr(tokenizer, attr, None)
        if hasattr(default, field) and value is not None:
            kw[field] = value
    if getattr(default, "is_encoder_decoder", False):
        kw["decoder_start_token_id"] = tokenizer.pad_token_id
    sot = tokenizer.get_vocab().get("<|startoftranscript|>")
    if sot is not None and hasattr(default, "max_source_positions"):
        # Whisper decodes from start-of-transcript; its default suppressed ids (220, 50256)
        # belong to the pretrained vocabulary: a trained one suppresses only an empty answer
        kw.update(decoder_start_token_id=sot, begin_suppress_tokens=[eos], suppress_tokens=None)
    # The defaults' forced ids belong to the pretrained vocabulary (BART's eos 2 is [CLS] in a
    # trained wordpiece one, Marian's 0 is [PAD]): a model built from scratch forces nothing.
    for field in ("forced_bos_token_id", "forced_eos_token_id"):
        if getattr(default, field, None) is not None:
            kw[field] = None
    if hasattr(default, "decoder_vocab_size"):  # marian: a separate decoder vocabulary
        kw["decoder_vocab_size"] = len(tokenizer)
    return kw


def dropout_kwargs(cls: Any, default: Any, p: float) -> dict[str, float]:
    """model.dropout: every dropout probability the config has (``*dropout*``, ``*_pdrop``),
    and its stochastic depth (``drop_path_rate``: beit and swin default to 0.1, which would
    drop whole residual branches of a run asked for no dropout; efficientnet's
    ``drop_connect_rate``). Each keeps its field's type: levit declares drop_path_rate an int
    (transformers 5.24 rejects 0.0), so it gets ``int(p)`` where p is whole and otherwise keeps
    its default, 0 (no drop path)."""
    out: dict[str, float] = {}
    for name, value in default.to_dict().items():
        named = "dropout" in name or name.endswith("_pdrop") or name in STOCHASTIC_DEPTH
        scalar = value is None or (isinstance(value, float | int) and not isinstance(value, bool))
        if not (named and scalar):
            continue
        if _annotation(cls, name) in (int, "int"):
            if float(p).is_integer():
                out[name] = int(p)
            continue
        out[name] = p
    return out


def _annotation(cls: Any, name: str) -> Any:
    """The field's declared type (a string under ``from __future__ import annotations``)."""
    for klass in cls.__mro__:
        annotations = klass.__dict__.get("__annotations__", {})
        if name in annotations:
            return annotations[name]
    return None


def option_kwargs(spec: FromConfig, cls: Any, default: Any) -> dict[str, Any]:
    """model.from_config.options, checked against the config class's fields."""
    kw: dict[str, Any] = {}
    for name, value in spec.options.items():
        canon = cls.attribute_map.get(name, name)
        ortft_reads = name in ORTFT_OPTIONS and hasattr(default, "num_channels")
        if not hasattr(default, canon) and not ortft_reads and name not in _read_names(cls):
            raise RecipeError(f"{FIELD}.options.{name}: {cls.__name__} has no field {name}")
        kw[canon] = value
    return kw


def _read_names(cls: Any) -> set[str]:
    """Names a config or its model read as ``kwargs.get("x")`` / ``getattr(config, "x", d)``
    rather than declare as fields (modernbert's global_attn_every_n_layers, deberta-v2's
    position_buckets): the quoted identifiers of the config's and the model's source."""
    import inspect
    import re
    import sys

    names: set[str] = set()
    for module_name in (cls.__module__, cls.__module__.replace(".configuration_", ".modeling_")):
        try:
            if module_name not in sys.modules:
                importlib.import_module(module_name)
            source = inspect.getsource(sys.modules[module_name])
        except (ImportError, OSError, TypeError):
            continue
        names.update(re.findall(r"[\"']([A-Za-z][A-Za-z0-9_]*)[\"']", source))
    return names


def generic_config(spec: FromConfig, tokenizer: Any, dropout: float | None) -> Any:
    """The config of ``spec.architecture`` with the recipe's sizes, the tokenizer's ids, the
    dropout override and the options (last, so they win)."""
    from transformers import AutoConfig

    cls = config_class(spec.architecture)
    default = _default(cls)
    if spec.architecture in VISION:
        kw = vision_kwargs(spec, cls)
    else:
        kw = size_kwargs(spec, cls, default)
    if tokenizer is not None:  # an image model has no vocabulary
        kw.update(token_kwargs(tokenizer, default))
    if dropout is not None:
        kw.update(dropout_kwargs(cls, default, dropout))
    kw.update(option_kwargs(spec, cls, default))
    try:
        config = AutoConfig.for_model(spec.architecture, **kw)
    except (TypeError, ValueError) as err:  # the config's own checks (e.g. strict types)
        first = first_line(err)
        raise RecipeError(f"{FIELD}: {cls.__name__} rejects these values ({first})") from None
    return config


def apply_options(config: Any, spec: FromConfig) -> None:
    """options and num_kv_heads on a bert / gpt2 / t5 config (built by its own branch)."""
    if spec.num_kv_heads is not None:
        raise RecipeError(
            f"{FIELD}.num_kv_heads: {type(config).__name__} has no grouped-query attention"
        )
    for name, value in option_kwargs(spec, type(config), config).items():
        setattr(config, name, value)


def attention_for(auto: Any, config: Any, attn: str) -> str:
    """``attn`` (the backend's choice), or eager where the model class has no sdpa path
    (DeBERTa: transformers raises a ValueError for sdpa rather than choosing)."""
    if attn != "sdpa":
        return attn
    try:
        cls = auto._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return attn
    return attn if getattr(cls, "_supports_sdpa", False) else "eager"


def composed_config(loaded: Any, task: Any, tokenizer: Any) -> Any:
    """A from_config model's config as its family composes it (``ComposesConfig``); None: the
    recipe's ``model.from_config`` gives it alone."""
    spec = loaded.recipe.model
    if spec.from_config is None or not isinstance(task, protocols.ComposesConfig):
        return None
    return task.model_config(spec.from_config, tokenizer, spec.dropout)


def vocabulary(task: Any, processor: Any) -> Any:
    """What sizes the model's vocabulary: a text task's tokenizer, a speech processor's
    tokenizer; an image processor sizes none (None)."""
    if not isinstance(task, protocols.ReadsFiles):
        return processor
    return getattr(processor, "tokenizer", None)
