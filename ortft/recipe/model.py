"""The recipe's ``model:`` and ``adapter:`` sections: which model to start from (a folder, a Hub id,
or a config built from scratch), its tokenizer, and a LoRA adapter."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ortft.recipe.fields import PositiveInt, Section

# Any transformers model_type; rules.task_architecture checks it against the task's Auto class.
Architecture = str

# Scalar config fields a recipe may set through model.from_config.options (no nesting: a recipe
# names sizes, never objects or code).
OptionValue = bool | int | float | str


class FromConfig(Section):
    """A randomly initialised model built from a small config (demos, tests, benchmarks)."""

    architecture: Architecture = Field(
        description=(
            "A transformers model_type whose Auto class fits the task: bert (encoder), gpt2 "
            "(decoder), t5 (encoder-decoder, for seq2seq), or any other, e.g. llama, mistral, "
            "mixtral, deberta-v2, modernbert, bart. Encoder-decoders fit only seq2seq; a type "
            "that does not fit the task is an error listing those that do."
        ),
        min_length=1,
    )
    hidden_size: PositiveInt = Field(128, description="Width of the hidden states.")
    num_layers: PositiveInt = Field(
        2, description="Number of transformer blocks (an encoder-decoder: each side)."
    )
    num_heads: PositiveInt = Field(2, description="Attention heads; must divide hidden_size.")
    num_kv_heads: PositiveInt | None = Field(
        None,
        description=(
            "Key/value heads for grouped-query attention (num_key_value_heads; must divide "
            "num_heads); default: the config's own. Not for bert, gpt2 or t5."
        ),
    )
    intermediate_size: PositiveInt | None = Field(
        None, description="Feed-forward width (default 4 × hidden_size)."
    )
    max_position_embeddings: PositiveInt = Field(
        512, description="Longest sequence the model accepts (where the config has the field)."
    )
    options: dict[str, OptionValue] = Field(
        default_factory=dict,
        description=(
            "Other scalar fields of the transformers config, by their config name, e.g. "
            "{num_local_experts: 2, num_experts_per_tok: 1} or {local_attention: 8}; they win "
            "over the fields above. A name the config class lacks is an error when the model "
            "is built."
        ),
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> FromConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        private = [k for k in self.options if k.startswith("_") or not k.isidentifier()]
        if private:
            raise ValueError(
                f"options: {', '.join(private)} is not a config field name (a config's public "
                "fields are identifiers without a leading underscore)"
            )
        return self


class TrainTokenizer(Section):
    """Train a tokenizer locally from the training texts (saved with the model)."""

    kind: Literal["wordpiece", "byte-bpe"] = Field(
        "wordpiece", description="wordpiece (BERT-style, lowercased) or byte-bpe (GPT-2-style)."
    )
    vocab_size: Annotated[int, Field(ge=64, le=200_000)] = Field(
        2000, description="Target vocabulary size."
    )
    min_frequency: PositiveInt = Field(2, description="Ignore pieces seen fewer times than this.")


class TokenizerSection(Section):
    path: str | None = Field(
        None,
        description="Tokenizer directory or hub id; default: the model's own (model.name_or_path).",
    )
    train: TrainTokenizer | None = Field(
        None, description="Train a tokenizer from the training data instead of loading one."
    )

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerSection:
        if self.path and self.train:
            raise ValueError("give either tokenizer.path or tokenizer.train, not both")
        return self


class ModelSection(Section):
    name_or_path: str | None = Field(
        None,
        description=(
            "Pretrained model: a local directory (relative to the recipe), "
            "'pkg://<package>/<dir>' inside an installed Python package, or a Hub id (needs network)."
        ),
    )
    from_config: FromConfig | None = Field(
        None, description="Build a randomly initialised model instead of loading weights."
    )
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection)
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] | None = Field(
        None, description="Override every dropout probability in the model (0 for exact parity)."
    )
    trust_remote_code: bool = Field(
        False,
        description=(
            "Let transformers run Python code shipped with a Hub model/tokenizer. Off unless the "
            "recipe sets it: only for models whose code you have read."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if bool(self.name_or_path) == bool(self.from_config):
            raise ValueError("give exactly one of model.name_or_path or model.from_config")
        # a text task's from_config model needs a tokenizer: rules.modality (it knows the task)
        return self


DORA_PEFT = (0, 9, 0)  # the first peft with LoraConfig(use_dora=True)


def installed_peft() -> str | None:
    """peft's installed version, read from its metadata (no import: validation stays torch-free)."""
    from importlib import metadata

    try:
        return metadata.version("peft")
    except metadata.PackageNotFoundError:
        return None


class AdapterSection(Section):
    """Parameter-efficient fine-tuning: train small adapter matrices, freeze the base model."""

    kind: Literal["lora", "dora"] = Field(
        "lora",
        description="Adapter kind (needs the peft extra): lora, or dora (LoRA's update plus a "
        "trained magnitude per output feature, peft's use_dora; needs peft >= 0.9). Either is "
        "folded into the base weights for export.",
    )
    rank: PositiveInt = Field(8, description="LoRA rank r.")
    alpha: Annotated[float, Field(gt=0)] = Field(
        16.0, description="LoRA alpha (the update is scaled by alpha/r)."
    )
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0, description="Dropout on the LoRA input."
    )
    target_modules: Annotated[list[str], Field(min_length=1)] | None = Field(
        None,
        description="Module names to adapt (e.g. [query, value]); default: the attention "
        "projections of the architecture (bert: query/value, gpt2: c_attn, t5: q/v).",
    )
    train_head: bool = Field(
        True,
        description="Also train the new task head (classifier / qa_outputs) in full; the base stays frozen.",
    )

    @field_validator("kind")
    @classmethod
    def _peft_has_dora(cls, kind: str) -> str:
        import re

        version = installed_peft()  # no peft at all: building the model names the extra
        if kind != "dora" or version is None:
            return kind
        release = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
        if release < DORA_PEFT:
            raise ValueError(f"dora needs peft >= 0.9 (use_dora); peft {version} is installed")
        return kind
