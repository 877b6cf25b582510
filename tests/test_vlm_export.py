"""The image-text-to-text export (ortft/families/vision_language/export.py): a tiny LLaVA
(CLIP vision tower of 2 layers, hidden 32, on 16x16 images of 4 patches; Llama of 2 layers,
hidden 32) with its LlavaProcessor around a locally trained byte-BPE tokenizer, exported as
transformers.js's three graphs, checked per graph and by generating."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'].upper() }}: {% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
    "\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
TEXTS = [
    "USER: Which digit is this?\nASSISTANT: seven",
    "USER: What colour is the square?\nASSISTANT: red",
    "USER: How many dots are there?\nASSISTANT: three",
]


def tiny_tokenizer(texts: list[str], special: list[str], **named: Any) -> Any:
    """A fast tokenizer of a byte-level BPE trained on ``texts`` (no Hub), ``<|endoftext|>``
    for bos, eos, pad and unk, ``special`` added; ``named``: its extra_special_tokens."""
    from transformers import PreTrainedTokenizerFast

    from ortft.backends.torch.models import train_byte_bpe
    from ortft.recipe.schema import TrainTokenizer

    bpe = train_byte_bpe(texts * 10, TrainTokenizer(kind="byte-bpe", vocab_size=300))
    eos = "<|endoftext|>"
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=eos, eos_token=eos, pad_token=eos, unk_token=eos,
        **({"extra_special_tokens": named} if named else {}),
    )  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": special})
    return tok


def export_once(tmp_path_factory: Any, build: Any, name: str) -> tuple[Any, Any, Path, dict]:
    """(model, processor, the export folder, the export's result) of ``build()``'s model."""
    from ortft.families.vision_language.export import export_image_text_to_text

    model, processor = build()
    out = tmp_path_factory.mktemp(name) / "onnx-export"
    return model, processor, out, export_image_text_to_text(model, processor, out)


def three_graphs_pass(out: Path, result: dict) -> dict:
    """The export's export.json, after checking it passed with the three graphs written and
    each graph's parity within 1e-4."""
    assert result["passed"], result["failures"]
    written = json.loads((out / "export.json").read_text())
    assert written["task"] == "image-text-to-text"
    for name in ("vision_encoder", "embed_tokens", "decoder_model_merged"):
        assert (out / "onnx" / f"{name}.onnx").is_file()
    graphs = written["parity"]["graphs"]
    assert set(graphs) == {"vision_encoder", "embed_tokens", "decoder"}
    assert all(g["max_abs_diff"] <= 1e-4 for g in graphs.values())
    return written


def tiny_llava(strategy: str = "default"):
    """(a LlavaForConditionalGeneration built from a config with seed 0, its LlavaProcessor).
    ``strategy``: the model's vision_feature_select_strategy (``default`` drops CLS)."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = tiny_tokenizer(TEXTS, ["<image>"], image_token="<image>")
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=8, num_additional_image_tokens=1,
        vision_feature_select_strategy=strategy, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    torch.manual_seed(0)
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=16, patch_size=8,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision, text_config=text, vision_feature_layer=-1,
        vision_feature_select_strategy=strategy, image_token_id=tok.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    return LlavaForConditionalGeneration(config).eval(), processor


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_once(tmp_path_factory, tiny_llava, "vlm")


def test_export_passes_parity_and_generation(exported):
    _, _, out, result = exported
    written = three_graphs_pass(out, result)
    assert written["kv_cache"] is True
    for name in ("config.json", "generation_config.json", "processor_config.json"):
        assert (out / name).is_file(), name
    assert (out / "preprocessor_config.json").is_file()  # transformers.js's image processor
    gen = written["generation"]
    assert gen["passed"] and gen["mismatches"] == 0 and gen["prompts"] == 2
    assert gen["steps_compared"] >= 16  # the tiny random model's top-2 margins leave steps
    assert written["inputs"]["decoder"][:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert written["outputs"]["vision_encoder"] == ["image_features"]
    assert written["exporter"]["name"] == "torchscript"


def test_preprocess_onnx_gives_the_image_processors_pixel_values(exported):
    """onnx/preprocess.onnx (the image classifier's graph) is checked in export.json against
    the processor, and on images of other sizes (resized down and up, then centre-cropped)
    gives the processor's pixel_values, which the vision encoder takes."""
    import onnxruntime as ort
    from PIL import Image

    from ortft.families.vision_language import exporting

    _, processor, out, _ = exported
    written = json.loads((out / "export.json").read_text())
    pre = written["preprocess"]
    assert written["files"]["preprocess"] == "onnx/preprocess.onnx" == pre["file"]
    assert pre["passed"] and pre["images"] == 2 and pre["max_abs_diff"] <= pre["tolerance"]
    assert pre["output"] == "pixel_values: float32 [1, 3, 16, 16]"
    sess = ort.InferenceSession(str(out / "onnx" / "preprocess.onnx"))
    vision = ort.InferenceSession(str(out / "onnx" / "vision_encoder.onnx"))
    rng = np.random.default_rng(3)
    for shape in ((31, 23, 3), (9, 13, 3)):
        pixels = rng.integers(0, 256, shape).astype(np.uint8)
        want = processor.image_processor(images=[Image.fromarray(pixels)], return_tensors="np")
        got = sess.run(None, {"image": pixels})[0]
        assert np.abs(got - want["pixel_values"]).max() <= pre["tolerance"], shape
        assert vision.run(None, {"pixel_values": got})[0].shape[:2] == (1, 4)
    _, _, line, _ = exporting.card(written)  # the model card's (ortft train, ortft export)
    assert "`onnx/preprocess.onnx` takes the decoded RGB image" in line


def test_a_broken_preprocess_fails_the_export(tmp_path, monkeypatch):
    """preprocess.onnx is gated as the graphs are: one built without the normalisation fails
    its check, which fails the export (``parity.failures``: the export's gate)."""
    from test_export_image import _skip_normalize

    from ortft.export import parity
    from ortft.families.vision_language.export import builder

    _skip_normalize(monkeypatch)
    model, processor = tiny_llava()
    section = builder(model, processor, opset=20, tolerance=1e-4, samples=None).preprocess(tmp_path)
    assert section["exported"] and not section["passed"] and section["max_abs_diff"] > 0.5
    (line,) = parity.failures({"preprocess": section})  # type: ignore[typeddict-item]
    assert line.startswith("preprocess.onnx: max |diff|")


def test_export_leaves_the_model_as_it_was(exported):
    model = exported[0]
    # the decoder is traced on eager attention (vlm_graphs.eager_text), then switched back
    assert model.config.get_text_config()._attn_implementation == "sdpa"


def test_the_folder_loads_in_autoprocessor_as_the_checks_ran(exported):
    """The export's processor (what transformers.js and ortft predict read) gives the inputs
    the checks were run on."""
    from transformers import AutoProcessor

    from ortft.families.vision_language.export import synthetic_samples

    _, processor, out, _ = exported
    loaded = AutoProcessor.from_pretrained(out)
    sample = synthetic_samples(processor)[1]
    want = processor(images=[sample.image], text=[sample.prompt], return_tensors="np")
    got = loaded(images=[sample.image], text=[sample.prompt], return_tensors="np")
    assert got["input_ids"].tolist() == want["input_ids"].tolist()
    assert np.array_equal(got["pixel_values"], want["pixel_values"])
    assert loaded.chat_template == CHAT_TEMPLATE
    # transformers.js's count: patches + num_additional_image_tokens (export.save_processor)
    config = json.loads((out / "processor_config.json").read_text())
    assert (config["vision_feature_select_strategy"], config["num_additional_image_tokens"]) == (
        "full",
        0,
    )
    assert json.loads((out / "preprocessor_config.json").read_text())["processor_class"] == (
        "LlavaProcessor"
    )


def test_merge_scatters_features_at_image_tokens_in_order():
    from ortft.families.vision_language.vlm_graphs import merge

    embeds = np.zeros((2, 4, 3), np.float32)
    ids = np.array([[9, 5, 5, 1], [5, 2, 3, 4]])
    features = np.arange(9, dtype=np.float32).reshape(3, 1, 3) + 1  # 3 images of 1 token
    out = merge(embeds, ids, features, 5)
    assert out[0, 1].tolist() == [1, 2, 3] and out[0, 2].tolist() == [4, 5, 6]
    assert out[1, 0].tolist() == [7, 8, 9] and not out[0, 0].any() and not out[1, 1:].any()
    with pytest.raises(ValueError, match="3 image tokens in the prompt but 2 image features"):
        merge(embeds, ids, features[:2], 5)


def test_a_model_the_export_cannot_write_is_refused_before_exporting(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from ortft.core.errors import InputError
    from ortft.families.vision_language.export import export_image_text_to_text

    model, processor = tiny_llava()
    model.config.vision_feature_layer = [-2, -1]
    with pytest.raises(InputError, match=r"vision_feature_layer \[-2, -1\]: .* one feature layer"):
        export_image_text_to_text(model, processor, tmp_path / "out")
    text = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32))  # fmt: skip
    with pytest.raises(InputError, match="LlamaForCausalLM: .* LLaVA-style"):
        export_image_text_to_text(text, processor, tmp_path / "out")
    model.config.vision_feature_layer = -1
    processor.patch_size = 4  # another model's: 16 image tokens for 4 features
    with pytest.raises(InputError, match="gives 16 image tokens for 1 image.* 4 image features"):
        export_image_text_to_text(model, processor, tmp_path / "out")
    processor.patch_size, processor.chat_template = 8, None
    with pytest.raises(InputError, match="LlavaProcessor has no chat template: pass the check's"):
        export_image_text_to_text(model, processor, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.consumer
def test_transformers_js_generates_the_ids_of_generate(exported, node_modules, tmp_path):
    """transformers.js 4.3.1 (tests/node/vlm.mjs) opens the folder as written, through its own
    LlavaProcessor and AutoModelForImageTextToText, and generates greedily the ids PyTorch's
    ``generate`` gives for the same image file and prompt. The images are at the processor's
    16x16: larger ones go through transformers.js's own resize, which differs from PIL's."""
    import subprocess
    from pathlib import Path

    from PIL import Image

    from ortft.families.vision_language.export import prompt_for

    model, processor, out, _ = exported
    rng = np.random.default_rng(1)
    rows, want = [], []
    for i, question in enumerate(("What is in the image?", "Which colour is it?")):
        path = tmp_path / f"image{i}.png"
        Image.fromarray(rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)).save(path)
        prompt = prompt_for(processor, question)
        rows.append(json.dumps({"image": str(path), "prompt": prompt}))
        x = processor(images=[Image.open(path)], text=[prompt], return_tensors="pt")
        want.append(model.generate(**x, max_new_tokens=16, do_sample=False)[0].tolist())
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("\n".join(rows) + "\n")
    script = Path(__file__).resolve().parent / "node" / "vlm.mjs"
    res = subprocess.run(
        ["node", str(script), node_modules, str(out), str(inputs), "16"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = [json.loads(line)["ids"] for line in res.stdout.splitlines() if line.startswith("{")]
    assert got == want
