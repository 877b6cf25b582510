"""The image-text-to-text export of a Qwen2-VL model (qwen2vl_graphs.py): a tiny
Qwen2VLForConditionalGeneration (vision transformer of 2 layers, embed 32, patches of 4, merge
2; Qwen2 text model of 2 layers, hidden 32, M-RoPE sections [2, 1, 1]) with its
Qwen2VLProcessor (the PIL image processor) around a locally trained byte-BPE tokenizer,
exported as transformers.js's three graphs (``grid_thw`` into the vision encoder,
``position_ids`` [3, batch, sequence] into the decoder), checked per graph and by generating."""

import json

import numpy as np
import pytest
from test_vlm_export import export_once, three_graphs_pass, tiny_tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXTS = [
    "user: Which digit is this?\nassistant: seven",
    "user: What colour is the square?\nassistant: red",
    "user: How many dots are there?\nassistant: three",
]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]  # fmt: skip


def _processor_class():
    """Qwen2VLProcessor without a video processor (``qwen2vl_model.processor_class``: without
    torchvision, transformers 5.24 cannot build one)."""
    from ortft.families.vision_language.qwen2vl_model import processor_class

    return processor_class()


def tiny_qwen2vl():
    """(a Qwen2VLForConditionalGeneration built from a config with seed 0, its processor)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tok = tiny_tokenizer(TEXTS, SPECIALS, image_token="<|image_pad|>", video_token="<|video_pad|>")
    # images resized to multiples of 8 (patch 4 x merge 2), between 16x16 and 32x32 pixels
    images = Qwen2VLImageProcessorPil(
        patch_size=4, temporal_patch_size=2, merge_size=2,
        size={"shortest_edge": 16 * 16, "longest_edge": 32 * 32},
    )  # fmt: skip
    processor = _processor_class()(
        image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE
    )
    ids = tok.convert_tokens_to_ids
    config = Qwen2VLConfig(
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2,
            patch_size=4, temporal_patch_size=2, spatial_merge_size=2),
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                "mrope_section": [2, 1, 1]}),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config).eval(), processor


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_once(tmp_path_factory, tiny_qwen2vl, "qwen2vl")


def test_export_passes_parity_and_generation(exported):
    _, _, out, result = exported
    written = three_graphs_pass(out, result)
    assert written["model_type"] == "qwen2_vl"
    # the tiny random vision tower moves its features by ~1e-5 for wrong rotary positions
    # (a row/column swap), under the export's 1e-4: its graph is held to 1e-6 here
    assert written["parity"]["graphs"]["vision_encoder"]["max_abs_diff"] <= 1e-6
    gen = written["generation"]
    assert gen["passed"] and gen["mismatches"] == 0 and gen["prompts"] == 2
    assert gen["steps_compared"] >= 16
    # transformers.js's Qwen2VLForConditionalGeneration feeds these names
    assert written["inputs"]["vision_encoder"] == ["pixel_values", "grid_thw"]
    assert written["outputs"]["vision_encoder"] == ["image_features"]
    assert written["inputs"]["decoder"][:3] == ["inputs_embeds", "attention_mask", "position_ids"]
    pre = json.loads((out / "preprocessor_config.json").read_text())
    assert pre["processor_class"] == "Qwen2VLProcessor"
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (4, 2, 2)
    # its processor flattens patches: no preprocess.onnx, and export.json says why
    assert written["preprocess"]["exported"] is False and "preprocess" not in written["files"]
    assert "Qwen2VLImageProcessor" in written["preprocess"]["reason"]


def test_the_graphs_take_other_grids_and_multimodal_positions(exported):
    """The vision graph on a grid it was not traced with (two images in one call), and the
    decoder's position_ids of shape [3, batch, sequence]."""
    import onnxruntime as ort
    import torch
    from PIL import Image

    from ortft.families.vision_language import qwen2vl_graphs

    model, processor, out, _ = exported
    vision = ort.InferenceSession(str(out / "onnx/vision_encoder.onnx"))
    rng = np.random.default_rng(3)
    images = [Image.fromarray(rng.integers(0, 256, s + (3,)).astype(np.uint8))
              for s in ((32, 16), (24, 32))]  # fmt: skip
    x = processor.image_processor(images=images, return_tensors="pt")
    assert x["image_grid_thw"].tolist() == [[1, 8, 4], [1, 6, 8]]
    got = vision.run(None, qwen2vl_graphs.LAYOUT.vision_feeds(x))[0]
    with torch.no_grad():
        want = qwen2vl_graphs.LAYOUT.reference_features(model, x).numpy()
    assert got.shape == (8 + 12, 32) and np.max(np.abs(got - want)) <= 1e-6
    decoder = ort.InferenceSession(str(out / "onnx/decoder_model_merged.onnx"))
    shape = next(i.shape for i in decoder.get_inputs() if i.name == "position_ids")
    assert shape[0] == 3 and isinstance(shape[1], str) and isinstance(shape[2], str)


def test_rope_index_matches_the_model_on_a_left_padded_batch(exported):
    """The numpy port of transformers.js's get_rope_index against the model's own, on two
    prompts of different image grids, left-padded together."""
    from PIL import Image

    from ortft.families.vision_language.export import prompt_for
    from ortft.families.vision_language.qwen2vl_graphs import rope_index

    model, processor, _, _ = exported
    rng = np.random.default_rng(4)
    images = [Image.fromarray(rng.integers(0, 256, s + (3,)).astype(np.uint8))
              for s in ((16, 16), (32, 24))]  # fmt: skip
    prompts = [prompt_for(processor, q) for q in ("What is in the image?", "Which?")]
    x = processor(images=images, text=prompts, padding=True, padding_side="left",
                  return_tensors="pt")  # fmt: skip
    mask = x["attention_mask"]
    want, want_deltas = model.model.get_rope_index(
        x["input_ids"], x["mm_token_type_ids"], x["image_grid_thw"], attention_mask=mask
    )
    got, deltas = rope_index(
        x["input_ids"].numpy(), mask.numpy(), x["image_grid_thw"].numpy(), model.config
    )
    real = np.broadcast_to(mask.numpy() == 1, got.shape)
    assert np.array_equal(got[real], want.numpy()[real]) and int(mask.numpy().min()) == 0
    # transformers.js's delta is against the padded length, the model's against the row's own
    pads = (mask.numpy() == 0).sum(1, keepdims=True)
    assert np.array_equal(deltas + pads, want_deltas.numpy())


def test_a_processor_of_another_model_is_refused_before_exporting(tmp_path):
    from ortft.core.errors import InputError
    from ortft.families.vision_language.export import export_image_text_to_text

    model, processor = tiny_qwen2vl()
    processor.image_processor.merge_size = 1  # patches the model cannot merge in 2x2 blocks
    with pytest.raises(InputError, match="cannot take the processor's image .* merge_size"):
        export_image_text_to_text(model, processor, tmp_path / "out")
    processor.image_processor.merge_size = 2
    processor.image_token_id = processor.tokenizer.convert_tokens_to_ids("<|vision_end|>")
    processor.image_token = "<|vision_end|>"  # another model's: 1 token per image
    with pytest.raises(InputError, match=r"gives 1 image tokens for 1 image.* 6 image features"):
        export_image_text_to_text(model, processor, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_config_json_has_the_text_sizes_at_its_top_level(exported):
    """transformers.js reads a qwen2_vl config's cache sizes at the top level; transformers
    still reads the folder's config as the model's."""
    from transformers import Qwen2VLConfig

    model, _, out, _ = exported
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (2, 2)
    loaded = Qwen2VLConfig.from_pretrained(out).get_text_config()
    text = model.config.get_text_config()
    keys = (
        "num_hidden_layers",
        "num_key_value_heads",
        "hidden_size",
        "vocab_size",
        "rope_parameters",
    )
    assert {k: getattr(loaded, k) for k in keys} == {k: getattr(text, k) for k in keys}


@pytest.mark.consumer
def test_transformers_js_generates_the_ids_of_generate(exported, node_modules, tmp_path):
    """transformers.js 4.3.1 (tests/node/vlm.mjs) opens the folder as written, through its own
    Qwen2VLProcessor (flattened patches, grid_thw) and Qwen2VLForConditionalGeneration (its
    get_rope_index), and generates greedily the ids PyTorch's ``generate`` gives for the same
    image file and prompt. The images' sides are multiples of 8 within the processor's pixel
    range, so neither side resizes (their resizes differ)."""
    import subprocess
    from pathlib import Path

    from PIL import Image

    from ortft.families.vision_language.export import prompt_for

    model, processor, out, _ = exported
    rng = np.random.default_rng(1)
    rows, want = [], []
    for i, (question, size) in enumerate(
        (("What is in the image?", (16, 24)), ("Which colour is it?", (24, 24)))
    ):
        path = tmp_path / f"image{i}.png"
        Image.fromarray(rng.integers(0, 256, size + (3,)).astype(np.uint8)).save(path)
        prompt = prompt_for(processor, question)
        rows.append(json.dumps({"image": str(path), "prompt": prompt}))
        x = processor(images=[Image.open(path)], text=[prompt], return_tensors="pt")
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
