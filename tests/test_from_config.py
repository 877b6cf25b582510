"""model.from_config for any transformers model type: which types fit a task (a recipe error
lists them), the generic size mapping and options, bert/gpt2/t5 built as before, and the
ORTModule patches (backends/ortmodule/patches.py) on tiny DeBERTa-v2 and ModernBERT runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import WORDS, tiny_classifier, write_recipe
from helpers import losses, run_cli, summary
from test_golden_losses import REL

from ortft.backends.torch import models
from ortft.core.errors import RecipeError
from ortft.recipe import hf_names
from ortft.recipe import io as recipe_io
from ortft.recipe.schema import FromConfig, TrainTokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park today"] * 20


def _recipe(tmp_path: Path, task: str, arch: str, **fc: object) -> Path:
    (tmp_path / "train.csv").write_text("text,label\na b,x\nc d,y\n")
    r = tiny_classifier("train.csv")
    r["task"] = task
    r["model"]["from_config"].update(architecture=arch, **fc)
    return write_recipe(tmp_path / "r.yaml", r)


def _error(tmp_path: Path, task: str, arch: str, **fc: object) -> str:
    with pytest.raises(RecipeError) as err:
        recipe_io.load(_recipe(tmp_path, task, arch, **fc))
    return str(err.value)


# --------------------------------------------------------------------------- validation


def test_an_unknown_type_is_an_error_that_suggests_and_lists_the_fitting_ones(tmp_path):
    msg = _error(tmp_path, "sequence-classification", "modrenbert")
    assert "not a transformers model type" in msg
    assert "did you mean modernbert?" in msg
    assert "bert, " in msg and "llama" in msg and "deberta-v2" in msg


def test_a_decoder_cannot_learn_masked_lm(tmp_path):
    msg = _error(tmp_path, "masked-lm", "gpt2")
    assert "AutoModelForMaskedLM does not build it" in msg
    assert "bert" in msg.split("fitting masked-lm:")[1]


def test_an_encoder_decoder_fits_only_seq2seq(tmp_path):
    # transformers maps t5 to T5ForSequenceClassification, but the task feeds no decoder inputs
    msg = _error(tmp_path, "sequence-classification", "t5")
    assert "encoder-decoder, which fits only seq2seq" in msg
    assert "t5" in hf_names.fitting("AutoModelForSeq2SeqLM")


@pytest.mark.parametrize(
    ("task", "arch"),
    [("sequence-classification", "llama"), ("masked-lm", "modernbert"), ("causal-lm", "mixtral")],
)
def test_fitting_types_validate(tmp_path, task, arch):
    assert (
        recipe_io.load(_recipe(tmp_path, task, arch)).recipe.model.from_config.architecture == arch
    )


def test_names_are_read_without_torch():
    import subprocess
    import sys

    code = (
        "import sys; from ortft.recipe import hf_names; "
        "assert 'bert' in hf_names.fitting('AutoModelForMaskedLM'); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_parsed_names_equal_transformers_mappings():
    import transformers

    for auto_class in ("AutoModelForSequenceClassification", "AutoModelForCausalLM"):
        mapping = getattr(transformers, auto_class)._model_mapping._model_mapping
        assert set(hf_names.model_types(auto_class)) == set(mapping)


def test_option_names_and_kv_heads_are_checked(tmp_path):
    assert "num_kv_heads (3) must divide num_heads (2)" in _error(
        tmp_path, "causal-lm", "llama", num_kv_heads=3
    )
    assert "_x is not a config field name" in _error(
        tmp_path, "causal-lm", "llama", options={"_x": 1}
    )


# --------------------------------------------------------------------------- configs


@pytest.fixture(scope="module")
def tokenizers():
    return {
        "wordpiece": models.train_tokenizer(
            TEXTS, TrainTokenizer(kind="wordpiece", vocab_size=100)
        ),
        "byte-bpe": models.train_tokenizer(TEXTS, TrainTokenizer(kind="byte-bpe", vocab_size=300)),
    }


def test_llama_config_takes_the_generic_sizes(tokenizers):
    tok = tokenizers["byte-bpe"]
    spec = FromConfig(
        architecture="llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
        intermediate_size=48, max_position_embeddings=64, options={"rope_theta": 500.0},
    )  # fmt: skip
    c = models._config_from_spec(spec, tok, 0.0)
    assert type(c).__name__ == "LlamaConfig"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (32, 3, 4)
    assert (c.num_key_value_heads, c.head_dim, c.intermediate_size) == (2, 8, 48)
    assert c.max_position_embeddings == 64 and c.vocab_size == len(tok)
    assert c.pad_token_id == c.eos_token_id == c.bos_token_id == tok.eos_token_id
    assert c.attention_dropout == 0.0


def test_an_encoder_decoder_sets_both_sides_and_the_decoder_start(tokenizers):
    tok = tokenizers["wordpiece"]
    c = models._config_from_spec(FromConfig(architecture="bart", hidden_size=32), tok, None)
    assert (c.d_model, c.encoder_layers, c.decoder_layers) == (32, 2, 2)
    assert (c.encoder_ffn_dim, c.decoder_ffn_dim) == (128, 128)
    assert c.decoder_start_token_id == tok.pad_token_id
    assert c.eos_token_id == tok.sep_token_id  # wordpiece: [SEP] ends a text, as for t5


def test_gemma_head_dim_follows_the_heads(tokenizers):
    spec = FromConfig(architecture="gemma2", hidden_size=32, num_heads=2)
    assert models._config_from_spec(spec, tokenizers["byte-bpe"], None).head_dim == 16


def test_options_reach_the_config_and_unknown_ones_name_the_class(tokenizers):
    tok = tokenizers["byte-bpe"]
    moe = FromConfig(architecture="mixtral", hidden_size=32, options={"num_local_experts": 2})
    assert models._config_from_spec(moe, tok, None).num_local_experts == 2
    # read as kwargs.get(...) in ModernBertConfig, not declared as a field
    mb = FromConfig(architecture="modernbert", options={"global_attn_every_n_layers": 2})
    assert models._config_from_spec(mb, tok, None).layer_types[1] == "sliding_attention"
    bad = FromConfig(architecture="llama", options={"bogus_field": 1})
    with pytest.raises(RecipeError, match="LlamaConfig has no field bogus_field"):
        models._config_from_spec(bad, tok, None)
    gqa_bert = FromConfig(architecture="bert", num_kv_heads=1)
    with pytest.raises(RecipeError, match="num_kv_heads: BertConfig"):
        models._config_from_spec(gqa_bert, tokenizers["wordpiece"], None)


def _old_config(spec: FromConfig, tokenizer, dropout):
    """The bert/gpt2/t5 construction before any model type could be built (golden losses)."""
    from transformers import BertConfig, GPT2Config, T5Config

    inter = spec.intermediate_size or 4 * spec.hidden_size
    p = 0.1 if dropout is None else dropout
    if spec.architecture == "t5":
        eos = (
            tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        )
        return T5Config(
            vocab_size=len(tokenizer), d_model=spec.hidden_size,
            d_kv=spec.hidden_size // spec.num_heads, d_ff=inter, num_layers=spec.num_layers,
            num_decoder_layers=spec.num_layers, num_heads=spec.num_heads, dropout_rate=p,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
            decoder_start_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    if spec.architecture == "bert":
        return BertConfig(
            vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
            num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
            intermediate_size=inter, max_position_embeddings=spec.max_position_embeddings,
            hidden_dropout_prob=p, attention_probs_dropout_prob=p,
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    return GPT2Config(
        vocab_size=len(tokenizer), n_embd=spec.hidden_size, n_layer=spec.num_layers,
        n_head=spec.num_heads, n_inner=inter, n_positions=spec.max_position_embeddings,
        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, summary_first_dropout=p,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "kind"), [("bert", "wordpiece"), ("gpt2", "byte-bpe"), ("t5", "wordpiece")]
)
@pytest.mark.parametrize("dropout", [None, 0.0])
def test_bert_gpt2_t5_configs_are_unchanged(tokenizers, arch, kind, dropout):
    spec = FromConfig(architecture=arch, hidden_size=32, num_layers=2, num_heads=2)
    tok = tokenizers[kind]
    got = models._config_from_spec(spec, tok, dropout).to_dict()
    assert got == _old_config(spec, tok, dropout).to_dict()


# --------------------------------------------------------------------------- ORT patches


def _varied_csv(path: Path) -> Path:
    rng = random.Random(0)
    rows = [
        f"{' '.join(rng.choice(WORDS) for _ in range(rng.randint(2, 20)))},{rng.choice('ab')}"
        for _ in range(40)
    ]
    path.write_text("text,label\n" + "\n".join(rows) + "\n")
    return path


ARCHS = {  # the patch each needs (ortft/backends/ortmodule/patches.py)
    "deberta-v2": ({"relative_attention": True, "pos_att_type": "p2c|c2p"}, "deberta scale"),
    "modernbert": ({"local_attention": 8}, "bias-less LayerNorm"),
}


@pytest.mark.archs  # 40-60 s each on 2 shared cores: the architecture tier (make test-archs)
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_ort_trains_like_torch_with_the_patch(tmp_path, arch):
    """3 steps of batch 4 over texts of different lengths (three batch shapes): ORT's losses
    are torch's, with no fallback; final/ loads back as a plain model (no added bias keys)."""
    options, note = ARCHS[arch]
    _varied_csv(tmp_path / "train.csv")
    runs = {}
    for backend in ("ort", "torch"):
        r = tiny_classifier("train.csv", backend=backend, max_steps=3, batch_size=4)
        r["model"]["from_config"].update(architecture=arch, options=options)
        r["data"].update(max_length=32, pad_to_multiple_of=1, eval_fraction=0)
        r["checkpoint"] = {"output_dir": str(tmp_path / backend), "save_every": 2}
        out = run_cli("train", write_recipe(tmp_path / f"{backend}.yaml", r), cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[backend] = tmp_path / backend
    backend = summary(runs["ort"])["backend"]
    assert backend["used"] == "ort" and backend["fallback"] is False and backend["ort_exports"]
    assert any(note.split()[0] in n for n in backend["notes"]), backend["notes"]
    lengths = [
        json.loads(line)["batch_lengths"][0]
        for line in (runs["ort"] / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert len(set(lengths)) > 1, lengths
    assert losses(runs["ort"]) == pytest.approx(losses(runs["torch"]), rel=REL)
    _loads_plainly(runs["ort"])


def _loads_plainly(run_dir: Path) -> None:
    import transformers
    from safetensors import safe_open

    for weights in (run_dir / "final" / "model.safetensors", *run_dir.glob("step-*/*.safetensors")):
        with safe_open(str(weights), "pt") as f:
            config = json.loads((run_dir / "final" / "config.json").read_text())
            if config["model_type"] == "modernbert":
                assert not [k for k in f.keys() if "norm.bias" in k], weights  # noqa: SIM118
    auto = transformers.AutoModelForSequenceClassification
    _, info = auto.from_pretrained(str(run_dir / "final"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
