"""The image-text-to-text export of an Idefics3 (SmolVLM's architecture;
ortft/families/vision_language/idefics3_graphs.py): a tiny Idefics3ForConditionalGeneration
(SigLIP-style vision model of 2 layers, hidden 32, on 16x16 tiles of 16 patches, pixel shuffle
by 2: 4 tokens a tile; Llama of 2 layers, hidden 32) with its Idefics3Processor (images split
into 16x16 tiles, rows x cols and the whole image) around a locally trained byte-BPE tokenizer,
exported as transformers.js's three graphs, checked per graph and by generating."""

import json

import numpy as np
import pytest
from test_vlm_export import export_once, three_graphs_pass, tiny_tokenizer

CHAT_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}"
    "{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
TEXTS = [
    "User: Which digit is this?\nAssistant: seven",
    "User: What colour is the square?\nAssistant: red",
    "User: How many dots are there?\nAssistant: three",
]
# Idefics3Processor's tokens; the tile tokens up to 4 x 4 tiles
SPECIAL = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)
]


def tiny_idefics3():
    """(an Idefics3ForConditionalGeneration built from a config with seed 0, its
    Idefics3Processor: images resized to a longest edge of 32, split into 16x16 tiles)."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        LlamaConfig,
    )

    tok = tiny_tokenizer(TEXTS, SPECIAL)
    images = Idefics3ImageProcessor(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 16}, do_image_splitting=True
    )
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=4, chat_template=CHAT_TEMPLATE
    )
    torch.manual_seed(0)
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=16, patch_size=4,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    config = Idefics3Config(
        vision_config=vision, text_config=text.to_dict(), scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )  # fmt: skip
    return Idefics3ForConditionalGeneration(config).eval(), processor


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_once(tmp_path_factory, tiny_idefics3, "idefics3")


def test_export_passes_parity_and_generation(exported):
    _, _, out, result = exported
    written = three_graphs_pass(out, result)
    assert written["model_type"] == "idefics3"
    gen = written["generation"]
    assert gen["passed"] and gen["mismatches"] == 0 and gen["prompts"] == 2
    assert gen["steps_compared"] >= 16
    assert written["inputs"]["vision_encoder"] == ["pixel_values", "pixel_attention_mask"]
    assert written["inputs"]["decoder"][:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    assert written["outputs"]["vision_encoder"] == ["image_features"]
    assert written["preprocessor"]["processor"] == "Idefics3Processor"
    # its processor splits images into tiles: no preprocess.onnx, and export.json says why
    assert written["preprocess"]["exported"] is False and "preprocess" not in written["files"]
    assert "Idefics3ImageProcessor" in written["preprocess"]["reason"]


def test_the_vision_graph_drops_a_batchs_padding_tiles(exported):
    """Two rows of different tile counts (the shorter padded with all-zero tiles, as both
    processors pad a batch): the graph gives the model's features of the real tiles only."""
    import torch
    from PIL import Image

    from ortft.families.vision_language import vlm_graphs

    model, processor, out, _ = exported
    rng = np.random.default_rng(2)
    wide = Image.fromarray(rng.integers(0, 256, (12, 32, 3)).astype(np.uint8))  # 1 x 2 tiles
    square = Image.fromarray(rng.integers(0, 256, (32, 32, 3)).astype(np.uint8))  # 2 x 2
    prompt = "<image>?"
    x = processor(
        images=[[wide], [square]], text=[prompt, prompt], padding=True, return_tensors="pt"
    )
    assert tuple(x["pixel_values"].shape[:2]) == (2, 5)  # the wide row: 3 tiles and 2 padding
    with torch.no_grad():
        want = torch.cat(list(model.model.get_image_features(
            pixel_values=x["pixel_values"], pixel_attention_mask=x["pixel_attention_mask"],
        ).pooler_output)).numpy()  # fmt: skip
    sessions = vlm_graphs.Sessions(out, int(model.config.image_token_id))
    got = sessions.image_features(
        x["pixel_values"].numpy(), pixel_attention_mask=x["pixel_attention_mask"].numpy() > 0
    )
    assert got.shape == (8, 4, 32)
    assert np.max(np.abs(got.reshape(want.shape) - want)) <= 1e-4


def test_the_folder_loads_in_autoprocessor_as_transformers_js_reads_it(exported):
    from transformers import AutoProcessor

    from ortft.families.vision_language.export import synthetic_samples

    _, processor, out, _ = exported
    loaded = AutoProcessor.from_pretrained(out)
    sample = synthetic_samples(processor)[1]
    want = processor(images=[sample.image], text=[sample.prompt], return_tensors="np")
    got = loaded(images=[sample.image], text=[sample.prompt], return_tensors="np")
    assert got["input_ids"].tolist() == want["input_ids"].tolist()
    assert np.array_equal(got["pixel_values"], want["pixel_values"])
    # what transformers.js's Idefics3Processor and image processor read
    assert json.loads((out / "processor_config.json").read_text())["image_seq_len"] == 4
    pre = json.loads((out / "preprocessor_config.json").read_text())
    assert pre["processor_class"] == "Idefics3Processor"
    assert (pre["image_processor_type"], pre["max_image_size"]) == (
        "Idefics3ImageProcessor",
        {"longest_edge": 16},
    )


def test_another_models_processor_is_refused_before_exporting(tmp_path):
    from ortft.core.errors import InputError
    from ortft.families.vision_language.export import export_image_text_to_text

    model, processor = tiny_idefics3()
    processor.image_seq_len = 9  # another model's: 9 tokens a tile for the model's 4
    with pytest.raises(InputError, match="gives 45 image tokens for 1 image.* 20 image features"):
        export_image_text_to_text(model, processor, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.consumer
def test_transformers_js_generates_the_ids_of_generate(exported, node_modules, tmp_path):
    """transformers.js 4.3.1 (tests/node/vlm.mjs, its Idefics3Processor called as
    ``processor(text, images)``) opens the folder as written and generates greedily the ids
    PyTorch's ``generate`` gives for the same image file and prompt: each 32x32 image split
    into 2 x 2 tiles and the whole image (the prompt's ``<row_r_col_c>`` tokens included).
    At 32x32 no resize precedes the split; a smaller image is resized by transformers.js's own
    code, which differs from PIL's."""
    import subprocess
    from pathlib import Path

    from PIL import Image

    from ortft.families.vision_language.export import prompt_for

    model, processor, out, _ = exported
    rng = np.random.default_rng(1)
    rows, want = [], []
    for i, question in enumerate(("What is in the image?", "Which colour is it?")):
        path = tmp_path / f"image{i}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3)).astype(np.uint8)).save(path)
        prompt = prompt_for(processor, question)
        rows.append(json.dumps({"image": str(path), "prompt": prompt}))
        x = processor(images=[Image.open(path)], text=[prompt], return_tensors="pt")
        assert "<row_2_col_2>" in processor.tokenizer.decode(x["input_ids"][0])
        want.append(model.generate(**x, max_new_tokens=16, do_sample=False)[0].tolist())
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("\n".join(rows) + "\n")
    script = Path(__file__).resolve().parent / "node" / "vlm.mjs"
    res = subprocess.run(
        ["node", str(script), node_modules, str(out), str(inputs), "16", "text-image"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = [json.loads(line)["ids"] for line in res.stdout.splitlines() if line.startswith("{")]
    assert got == want
