"""image-text-to-text (LLaVA, Idefics3 and Qwen2-VL, ``archs.ARCHS``): encoding and its loss
mask, the forward ORTModule trains against transformers' own, LoRA on the language model, and
one tiny run of the shipped recipe per architecture (module-scoped, ``RUNS``) that the resume,
eval, predict and export tests reuse (``arch_run``; the card test: LLaVA's and Qwen2-VL's runs,
``ortft export``: LLaVA's; Qwen2-VL's resume and card checks are hand-run: slow)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import DEFAULT_BACKEND
from helpers import losses, run_cli

from ortft import tasks
from ortft.core.constants import IGNORE_INDEX
from ortft.core.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "image-text-to-text.yaml"
DIGITS = ROOT / "recipes" / "data" / "digits"
QUESTIONS = ROOT / "recipes" / "data" / "digit-questions"  # images in ../digits/images
QUESTION = {"image": "images/0004.png", "question": "Which digit is this?", "answer": "four"}
CHAT = {
    "image": "images/0007.png",
    "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Even or odd?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "odd"}]},
    ],
}


ARCHS = ("llava", "idefics3")
# per architecture: the rendered prompt's start and end, the image's expansion as tokens
PROMPTS = {
    "llava": ("USER: <image>", "\nASSISTANT: "),
    "idefics3": ("User:<fake_token_around_image><global-img><image>", "\nAssistant:"),
}


class Data:
    image_column = "image"
    max_length = 48
    on_bad_file = "error"


def processor_of(arch: str):
    """``arch``'s processor for 8x8 images in 4x4 patches (``patch``: Idefics3's 2x2, whose
    grid its pixel shuffle halves) around a tokenizer trained here."""
    from ortft.backends.torch import models
    from ortft.families.vision_language import archs
    from ortft.recipe.model import TrainTokenizer

    texts = ["Which digit is this?", "four", "Even or odd?", "odd", "seven"] * 20
    spec = TrainTokenizer(kind="byte-bpe", vocab_size=280, min_frequency=1)
    options = tasks.options("image-text-to-text", image_size=8, patch_size=PATCH[arch])
    return archs.named(arch).for_config(options, models.train_tokenizer(texts, spec))


PATCH = {"llava": 4, "idefics3": 2}  # 4 image tokens an image in both


@pytest.fixture(scope="module")
def processors():
    return {arch: processor_of(arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def processor(processors):
    return processors["llava"]


def task_for(processor, **options):
    task = tasks.get("image-text-to-text", {"name": "image-text-to-text", **options})
    task.bind(processor)
    return task


def rows(*raw):
    return [{**r, "image": str(DIGITS / r["image"])} for r in raw]


@pytest.mark.parametrize("arch", ARCHS)
def test_encode_learns_the_answers_only_and_expands_the_image_token(processors, arch):
    processor = processors[arch]
    task = task_for(processor)
    enc = task.encode(rows(QUESTION, CHAT), processor, Data, None)
    tok, image_id = processor.tokenizer, processor.image_token_id
    # LLaVA: 8x8 pixels in 4x4 patches, CLS left out; Idefics3: 4x4 patches of 2x2 shuffled
    # by 2 into 4 tokens, between its image markers
    assert task.image_tokens() == 4
    # the prompt's ids are the processor's own expansion of the chat template's text
    first = {**QUESTION, "image": str(DIGITS / QUESTION["image"])}
    msgs = task.messages(first, 0)[:1]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    image = images_of([first["image"]])[0]
    want = processor(images=[image], text=[text], add_special_tokens=False)["input_ids"][0]
    start = int(enc.column("_start")[0])
    assert enc.column("input_ids")[0, :start].tolist() == list(want)
    for k, answer in enumerate(("four", "odd")):
        ids, labels = enc.column("input_ids")[k], enc.column("labels")[k]
        real = enc.column("attention_mask")[k] == 1
        assert (ids[real] == image_id).sum() == 4  # one token per image feature
        learned = labels[labels != IGNORE_INDEX].tolist()
        # the answer, its end and the turn's newline (as the template renders the turn), only
        lead = " " if arch == "idefics3" else ""  # SmolVLM's "Assistant:" then " answer"
        assert tok.decode(learned) == lead + answer + tok.eos_token + "\n"
        start = int(enc.column("_start")[k])
        assert (labels[:start] == IGNORE_INDEX).all() and labels[start] != IGNORE_INDEX
        # the prompt is what the chat template renders up to the open assistant turn
        prompt = tok.decode(ids[:start])
        assert prompt.startswith(PROMPTS[arch][0]) and prompt.endswith(PROMPTS[arch][1])


@pytest.mark.parametrize("arch", ARCHS)
def test_the_export_checks_prompt_each_row_as_training_tokenized_it(processors, arch):
    """The export's check rows (``exporting.samples_of``): the processor, given the row's
    image and prompt, gives the ids training had before the answer (the image's expansion
    folded back to the one image token the processor expands again)."""
    from ortft.families.vision_language.exporting import samples_of

    processor = processors[arch]
    task = task_for(processor)
    enc = task.encode(rows(QUESTION, CHAT), processor, Data, None)
    samples = samples_of(task, enc)
    assert len(samples) == 2
    for j, sample in enumerate(samples):
        x = processor(images=[sample.image], text=[sample.prompt], add_special_tokens=False)
        start = int(enc.column("_start")[j])
        assert list(x["input_ids"][0]) == enc.column("input_ids")[j, :start].tolist()


def images_of(paths: list[str]) -> list:
    from ortft.data import images

    return [images.load(p) for p in paths]


def test_bad_rows_are_one_line_errors_naming_the_row(processor, tmp_path):
    task = task_for(processor)
    two = {**CHAT, "messages": [{**CHAT["messages"][0], "content": [{"type": "image"}] * 2},
                                CHAT["messages"][1]]}  # fmt: skip
    with pytest.raises(InputError, match=r'row 2: messages has 2 \{"type": "image"\} parts'):
        task.encode(rows(QUESTION, two), processor, Data, None)
    with pytest.raises(InputError, match="row 1: needs question and answer, or messages"):
        task.encode(rows({"image": "images/0001.png", "question": "?"}), processor, Data, None)
    broken = tmp_path / "broken.png"
    broken.write_bytes((DIGITS / "images" / "0001.png").read_bytes()[:40])
    bad = {**QUESTION, "image": str(broken)}
    with pytest.raises(InputError, match=rf"row 2: {broken}: .*data.on_bad_file=skip"):
        task.encode([rows(QUESTION)[0], bad], processor, Data, None)

    class Skip(Data):
        on_bad_file = "skip"

    assert len(task.encode([rows(QUESTION)[0], bad], processor, Skip, None)) == 1


def tiny_model(processor, arch: str = "llava"):
    from transformers import AutoModelForImageTextToText

    from ortft.families.vision_language import archs
    from ortft.recipe.model import FromConfig

    spec = FromConfig(architecture=arch, hidden_size=32, num_layers=1, num_heads=2)
    options = tasks.options("image-text-to-text", image_size=8, patch_size=PATCH[arch],
                            vision_hidden_size=32, vision_layers=1)  # fmt: skip
    config = archs.named(arch).model_config(spec, options, processor.tokenizer, 0.0)
    return AutoModelForImageTextToText.from_config(config, attn_implementation="eager")


# what the collate gives per architecture: Idefics3's one tile a row and its pixel mask
PIXELS = {
    "llava": {"pixel_values": (2, 3, 8, 8)},
    "idefics3": {"pixel_values": (2, 1, 3, 8, 8), "pixel_attention_mask": (2, 1, 8, 8)},
}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_trained_forward_gives_transformers_logits(processors, arch):
    """The gather that puts the projected features at the image tokens (what ORTModule
    exports), with the vision tower inside and outside the module, against transformers' own
    forward on the pixel inputs (masked_scatter): its loss, and its logits at the answers'
    positions, the only ones the trained head computes."""
    import torch

    from ortft.families.vision_language import archs
    from ortft.tasks.lm_head import label_positions

    processor = processors[arch]
    torch.manual_seed(0)
    model = tiny_model(processor, arch).eval()
    task = task_for(processor)
    task.prepare_model(model, processor)
    batch = task.collate(task.encode(rows(QUESTION, CHAT), processor, Data, None).take(
        np.arange(2)), None, 0)  # fmt: skip
    t = {k: torch.from_numpy(v) for k, v in batch.items() if not k.startswith("_")}
    assert {k: tuple(t[k].shape) for k in PIXELS[arch]} == PIXELS[arch]
    with torch.no_grad():
        full = model(**t, use_cache=False)
        loss, got = task.forward(model, **t)
        outside_loss, outside = task.forward(model, **task.outside_inputs(t))
    assert "image_features" in task.outside_inputs(t) and archs.of(model).model_type == arch
    index = label_positions(t["labels"])
    assert len(index) == int((t["labels"][:, 1:] != -100).sum()) < t["labels"].numel() / 4
    want = full.logits.reshape(-1, full.logits.shape[-1])[index]
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(outside, want, atol=1e-6)
    assert torch.allclose(loss, full.loss) and torch.allclose(outside_loss, full.loss)


LANGUAGE = {"llava": "language_model", "idefics3": "text_model"}
PROJECTOR = {"llava": "multi_modal_projector", "idefics3": "connector"}


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_adapts_the_language_model_and_trains_the_projector(processors, arch):
    from ortft.backends.torch import models
    from ortft.recipe.model import AdapterSection

    processor = processors[arch]
    task = task_for(processor)
    model = tiny_model(processor, arch)
    task.prepare_model(model, processor)
    adapted = models.apply_adapter(model, AdapterSection(kind="lora", rank=2), task)
    trained = [n for n, p in adapted.named_parameters() if p.requires_grad]
    language, projector = LANGUAGE[arch], PROJECTOR[arch]
    assert trained and all(language in n or projector in n for n in trained)
    assert any("lora_A" in n and "q_proj" in n for n in trained)
    assert any(projector in n for n in trained)
    with pytest.raises(InputError, match="adapter.target_modules: out_proj matches no module "
                       "of the language model"):  # fmt: skip
        task.adapter_targets(model, ["out_proj"])  # the vision tower's, not Llama's


def test_a_pretrained_idefics3_folder_fits_and_its_processor_takes_each_image_whole(
    processors, tmp_path
):
    """A saved Idefics3 (whose class reads input_ids first, not pixel_values) fits the task;
    its processor, saved splitting images into tiles, loads with splitting off, as training
    expands every image alike (``idefics3_model``)."""
    from types import SimpleNamespace

    from ortft.backends.torch import load_checks

    processor = processors["idefics3"]
    tiny_model(processor, "idefics3").save_pretrained(tmp_path)
    processor.image_processor.do_image_splitting = True
    processor.save_pretrained(tmp_path)
    processor.image_processor.do_image_splitting = False
    task = task_for(processor)
    load_checks.check_fits(str(tmp_path), task, False)
    loaded = SimpleNamespace(recipe=SimpleNamespace(model=SimpleNamespace(trust_remote_code=False)))
    got = task.load_processor(loaded, str(tmp_path), None, [])
    assert type(got).__name__ == "Idefics3Processor"
    assert got.image_processor.do_image_splitting is False
    task.bind(got)
    assert task.expansion() == task_for(processor).expansion()  # 7 ids: markers and 4 tokens


def test_validate_names_the_architectures_a_config_builds():
    """``ortft validate`` (in process): idefics3 and llava build from a config; another
    image-text-to-text type is one line naming the field, exit 2."""
    from typer.testing import CliRunner

    from ortft.cli.app import app

    runner = CliRunner()
    for arch in ARCHS:
        over = f"model.from_config.architecture={arch}"
        res = runner.invoke(app, ["validate", str(RECIPE), "--set", over])
        assert res.exit_code == 0, res.stderr
    over = "model.from_config.architecture=paligemma"
    res = runner.invoke(app, ["validate", str(RECIPE), "--set", over])
    assert res.exit_code == 2
    assert "model.from_config.architecture=paligemma: image-text-to-text builds llava or " in (
        res.stderr
    )


@pytest.fixture(scope="module")
def qwen_processor():
    """Qwen2-VL's processor around a tokenizer trained here: 8x8 images in 2x2 patches, merged
    2 x 2: 4 image tokens."""
    from ortft.backends.torch import models
    from ortft.families.vision_language import archs
    from ortft.recipe.model import TrainTokenizer

    texts = ["Which digit is this?", "four", "Even or odd?", "odd", "seven"] * 20
    spec = TrainTokenizer(kind="byte-bpe", vocab_size=280, min_frequency=1)
    options = tasks.options("image-text-to-text", image_size=8, patch_size=2)
    return archs.named("qwen2_vl").for_config(options, models.train_tokenizer(texts, spec))


def tiny_qwen(processor):
    from transformers import AutoModelForImageTextToText

    from ortft.families.vision_language import archs
    from ortft.recipe.model import FromConfig

    spec = FromConfig(architecture="qwen2_vl", hidden_size=32, num_layers=1, num_heads=2)
    options = tasks.options("image-text-to-text", image_size=8, patch_size=2,
                            vision_hidden_size=32, vision_layers=1)  # fmt: skip
    config = archs.named("qwen2_vl").model_config(spec, options, processor.tokenizer, 0.0)
    return AutoModelForImageTextToText.from_config(config, attn_implementation="eager")


def test_qwen2vl_encode_expands_the_image_pad_by_the_grid(qwen_processor, tmp_path):
    """ChatML around <|vision_start|><|image_pad|><|vision_end|>, the pad expanded into the
    image's merged patches (as Qwen2VLProcessor's own call expands it), the answer and
    <|im_end|> learned; a 16x8 image gets its own count (its own grid)."""
    from PIL import Image

    task = task_for(qwen_processor)
    wide = tmp_path / "wide.png"
    Image.open(DIGITS / "images" / "0004.png").resize((16, 8)).save(wide)
    enc = task.encode(rows(QUESTION, CHAT) + [{**QUESTION, "image": str(wide)}],
                      qwen_processor, Data, None)  # fmt: skip
    tok, pad = qwen_processor.tokenizer, qwen_processor.image_token_id
    ids = enc.column("input_ids")
    # 8x8: 4x4 patches, 4 tokens; 16x8 resized to 8x4 (at most 64 pixels): 4x2 patches, 2
    assert [(ids[k] == pad).sum() for k in range(3)] == [4, 4, 2]
    labels = enc.column("labels")[1]
    assert tok.decode(labels[labels != IGNORE_INDEX]) == "odd<|im_end|>\n"
    start = int(enc.column("_start")[0])
    prompt = tok.decode(ids[0, :start])
    assert prompt.startswith("<|im_start|>user\n<|vision_start|><|image_pad|>")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # the processor's own expansion of the rendered prompt gives the same ids
    text = qwen_processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"},
                                      {"type": "text", "text": QUESTION["question"]}]}],
        add_generation_prompt=True, tokenize=False)  # fmt: skip
    image = Image.open(DIGITS / "images" / "0004.png").convert("RGB")
    own = qwen_processor(images=[image], text=[text], return_tensors="np")["input_ids"][0]
    assert own.tolist() == ids[0, :start].tolist()


@pytest.mark.parametrize("frozen", [True, False])
def test_qwen2vl_forward_with_outside_rope_positions_gives_transformers_logits(
    qwen_processor, frozen, tmp_path
):
    """The rope positions (and a frozen tower's blocks) computed before the module, the merger
    and the gather inside, against transformers' own forward on the flat patches; a 16x8 image
    beside 8x8 ones (patches padded per row)."""
    import torch
    from PIL import Image

    from ortft.families.vision_language import archs

    torch.manual_seed(0)
    model = tiny_qwen(qwen_processor).eval()
    task = task_for(qwen_processor, freeze_vision=frozen)
    task.prepare_model(model, qwen_processor)
    wide = tmp_path / "wide.png"
    Image.open(DIGITS / "images" / "0004.png").resize((16, 8)).save(wide)
    enc = task.encode(rows(QUESTION, CHAT) + [{**QUESTION, "image": str(wide)}],
                      qwen_processor, Data, None)  # fmt: skip
    batch = task.collate(enc.take(np.arange(3)), None, 0)
    assert batch["pixel_values"].shape[:2] == (3, 16)  # 16 patches, the wide one's 8 padded
    t = {k: torch.from_numpy(v) for k, v in batch.items() if not k.startswith("_")}
    vision = {k: batch[k] for k in ("pixel_values", "image_grid_thw")}
    with torch.no_grad():
        full = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                     **archs.of(model).model_inputs(model, t["input_ids"], vision),
                     labels=t["labels"], use_cache=False)  # fmt: skip
        inputs = task.outside_inputs(t)
        loss, got = task.forward(model, **inputs)
    assert ("image_features" in inputs) == frozen and "rope_positions" in inputs
    want = full.logits.reshape(-1, full.logits.shape[-1])[inputs["label_index"]]
    assert len(got) == int((t["labels"][:, 1:] != -100).sum())  # the answers' positions only
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(loss, full.loss, atol=1e-6)
    trained = {n.split(".")[2] for n, p in model.named_parameters() if p.requires_grad and
               "visual" in n}  # fmt: skip
    assert trained == ({"merger"} if frozen else {"patch_embed", "blocks", "merger"})


def test_qwen2vl_lora_adapts_the_language_model_and_trains_the_merger(qwen_processor):
    from ortft.backends.torch import models
    from ortft.recipe.model import AdapterSection

    task = task_for(qwen_processor)
    model = tiny_qwen(qwen_processor)
    task.prepare_model(model, qwen_processor)
    adapted = models.apply_adapter(model, AdapterSection(kind="lora", rank=2), task)
    trained = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trained and all("language_model" in n or ".merger." in n for n in trained)
    assert any("lora_A" in n and "q_proj" in n for n in trained)
    assert any(".merger." in n for n in trained)


TINY = [
    "model.from_config.hidden_size=32", "model.from_config.num_layers=1",
    "task.vision_hidden_size=32", "task.vision_layers=1", "task.freeze_vision=true",
    "task.generate_samples=4", "data.max_train_samples=64", "data.max_eval_samples=8",
    "training.batch_size=8", "training.max_steps=4", "training.epochs=null",
    "training.log_every=1", "training.eval_every=4", "checkpoint.save_every=2",
    "checkpoint.keep_last=2", f"backend.name={DEFAULT_BACKEND}",
]  # fmt: skip


def train(out: Path, *overrides: str):
    return run_cli("train", RECIPE, *TINY, *overrides, "--output-dir", out)


RUNS = (*ARCHS, "qwen2_vl")  # the architectures of the tiny runs
# the recipe with a Qwen2-VL: 8x8 digits in 2x2 patches, merged 2 x 2 into 4 image tokens
QWEN2VL = ["model.from_config.num_heads=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny run of an architecture, trained on first use: 4 steps of the shipped recipe
    (``model.from_config.architecture`` overridden), the frozen vision tower outside the
    trained module (ORTModule on the ort profile), a checkpoint every 2, an eval at the end."""
    done: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in done:
            out = tmp_path_factory.mktemp(f"vlm-{arch}") / "run"
            res = train(out, *arch_overrides(arch))
            assert res.returncode == 0, res.stderr[-3000:]
            done[arch] = out
        return done[arch]

    return get


def arch_overrides(arch: str) -> list[str]:
    return [f"model.from_config.architecture={arch}", *(QWEN2VL if arch == "qwen2_vl" else [])]


@pytest.fixture(scope="module")
def run(trained):
    return trained("llava")


@pytest.fixture(scope="module")
def qwen_run(trained):
    """The same 4 steps with a Qwen2-VL: its rope positions and frozen tower outside the
    trained module, the merger and the language model inside."""
    return trained("qwen2_vl")


@pytest.fixture(scope="module", params=RUNS)
def arch_run(request, trained):
    """(architecture, its run): a test over every architecture's run."""
    return request.param, trained(request.param)


CLASSES = {
    "llava": ("LlavaProcessor", "LlavaForConditionalGeneration", "vision_tower"),
    "idefics3": ("Idefics3Processor", "Idefics3ForConditionalGeneration", "vision_model"),
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLForConditionalGeneration", ".visual."),
}


def test_the_compiled_torch_route_trains_as_eager(tmp_path):
    """backend.compile=true on the recipe's LLaVA (aot_eager: dynamo's tracing without
    inductor's minutes; on torch 2.6 it failed at a graph break in transformers' output
    capturing, which imports torch for typing only): eager torch's losses over 3 steps."""
    short = [
        "backend.name=torch", "training.max_steps=3", "training.eval_every=null",
        "export.enabled=false", "task.generate_samples=0", "checkpoint.save_every=null",
    ]  # fmt: skip
    eager = train(tmp_path / "eager", *short)
    assert eager.returncode == 0, eager.stderr[-3000:]
    res = run_cli(
        "train", RECIPE, *TINY, *short, "backend.compile=true", "--output-dir",
        tmp_path / "compiled", env={"ORTFT_COMPILE_BACKEND": "aot_eager"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    compiled = json.loads((tmp_path / "compiled" / "summary.json").read_text())
    assert compiled["backend"]["compile"]["graphs"] >= 1
    assert losses(tmp_path / "compiled") == pytest.approx(losses(tmp_path / "eager"), rel=1e-4)


def load_processor(final: Path):
    """AutoProcessor of final/; a Qwen2-VL's through ortft's loader (without torchvision,
    transformers 5.24's AutoProcessor cannot build its video processor)."""
    from transformers import AutoProcessor

    from ortft.families.vision_language import qwen2vl_model

    if qwen2vl_model.is_folder(str(final)):
        return qwen2vl_model.from_folder(str(final), "final")
    return AutoProcessor.from_pretrained(final)


def test_the_run_trains_on_the_default_backend_and_final_loads(arch_run):
    from transformers import AutoModelForImageTextToText

    arch, run = arch_run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"]["used"] == DEFAULT_BACKEND and not summary["backend"]["fallback"]
    assert {"eval_loss", "eval_exact_match"} <= set(summary["metrics"])
    assert summary["export"]["passed"] is True  # the recipe exports (test_the_run_exports...)
    processor = load_processor(run / "final")
    kind, model_class, tower = CLASSES[arch]
    assert type(processor).__name__ == kind and processor.chat_template
    if arch == "qwen2_vl":  # what AutoProcessor (with torchvision) needs to load the folder
        video = json.loads((run / "final" / "video_preprocessor_config.json").read_text())
        image = processor.image_processor
        assert video["video_processor_type"] == "Qwen2VLVideoProcessor"
        assert (video["patch_size"], video["merge_size"]) == (image.patch_size, image.merge_size)
    model = AutoModelForImageTextToText.from_pretrained(run / "final")
    assert type(model).__name__ == model_class
    vision = [p for n, p in model.named_parameters() if tower in n]
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["kind"] == "train" and np.isfinite(first["loss"]) and vision


def _questions(n: int) -> str:
    """The first ``n`` held-out question rows, their image paths made absolute."""
    lines = (QUESTIONS / "eval.jsonl").read_text().splitlines()[:n]
    rows = [json.loads(line) for line in lines]
    return "".join(json.dumps({**r, "image": str(QUESTIONS / r["image"])}) + "\n" for r in rows)


def test_eval_of_the_run_gives_the_training_eval(arch_run, tmp_path):
    """``ortft eval`` on the rows training's eval scored (data.max_eval_samples=8, the first 4
    answered): transformers' own forward on pixel_values, its loss and exact match."""
    _, run = arch_run
    (tmp_path / "eval.jsonl").write_text(_questions(8))
    res = run_cli("eval", run, "--data", tmp_path / "eval.jsonl", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout)
    summary = json.loads((run / "summary.json").read_text())["metrics"]
    assert got["examples"] == 8
    assert got["metrics"]["loss"] == pytest.approx(summary["eval_loss"], abs=1e-4)
    assert got["metrics"]["exact_match"] == summary["eval_exact_match"]


def processor_answer(final: Path, image: Path, msgs: list) -> str:
    """transformers' own path, independent of ortft's: the processor renders the chat, expands
    the image token and makes the pixels; ``generate``, greedy."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    processor = load_processor(final)
    model = AutoModelForImageTextToText.from_pretrained(final).eval()
    prompt = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    rgb = Image.open(image).convert("RGB")
    inputs = processor(images=[rgb], text=[prompt], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    return processor.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_predict_answers_each_row_as_transformers_does(arch_run, tmp_path):
    _, run = arch_run
    shutil.copytree(DIGITS / "images", tmp_path / "images")
    ask = [{"image": "images/0004.png", "question": "Which digit is this?"}, CHAT]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ask))
    res = run_cli("predict", run, "--input", tmp_path / "rows.jsonl", "--json",
                  "--max-new-tokens", "4")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = [json.loads(line) for line in res.stdout.splitlines()]
    assert [o["index"] for o in out] == [0, 1]
    assert [o["input"] for o in out] == ["images/0004.png", "images/0007.png"]
    question = [
        {"role": "user", "content": [{"type": "image"},
                                     {"type": "text", "text": "Which digit is this?"}]},
    ]  # fmt: skip
    want = [
        processor_answer(run / "final", DIGITS / "images" / "0004.png", question),
        processor_answer(run / "final", DIGITS / "images" / "0007.png", CHAT["messages"][:1]),
    ]
    assert [o["generated"] for o in out] == [w.strip() for w in want]
    assert all(0 <= o["new_tokens"] <= 4 for o in out)


def test_predict_reads_every_row_before_answering_and_names_a_bad_one(tmp_path):
    """In process (the CLI turns the InputError into its one line and exit 2, before any
    answer: the rows are all read first)."""
    from ortft.families.vision_language import predict

    task = tasks.get("image-text-to-text")
    shutil.copy(DIGITS / "images" / "0004.png", tmp_path / "a.png")
    good = json.dumps({"image": "a.png", "question": "Which digit is this?"})
    (tmp_path / "rows.jsonl").write_text(f"{good}\n\n{good}\n")
    assert [n for n, _, _ in predict._rows(task, str(tmp_path / "rows.jsonl"))] == [1, 3]
    for line, needle in (
        (json.dumps({"image": "missing.png"}), r"rows.jsonl:2: missing.png: "),
        ("{not json", r"rows.jsonl:2: not a JSON object"),
        (
            json.dumps({"question": "?"}),
            r"rows.jsonl:2: needs 'image' \(data.image_column\), the image file's path",
        ),
    ):
        (tmp_path / "rows.jsonl").write_text(f"{good}\n{line}\n")
        with pytest.raises(InputError, match=needle):
            predict._rows(task, str(tmp_path / "rows.jsonl"))
    # a run trained on data.image_column=picture: its rows' images are read from there
    (tmp_path / "rows.jsonl").write_text(good.replace('"image"', '"picture"') + "\n" + good + "\n")
    with pytest.raises(InputError, match=r"rows.jsonl:2: needs 'picture' \(data.image_column\)"):
        predict._rows(task, str(tmp_path / "rows.jsonl"), "picture")


def test_the_run_exports_the_three_graphs_with_its_held_out_rows_checked(arch_run):
    """``ortft train`` published onnx/ through the exporter: the graphs transformers.js reads,
    parity and generation checked on the held-out rows (not synthetic noise), the gates passed."""
    arch, run = arch_run
    report = json.loads((run / "onnx" / "export.json").read_text())
    assert report["passed"] is True and report["failures"] == []
    assert set(report["files"].values()) >= {
        "onnx/vision_encoder.onnx", "onnx/embed_tokens.onnx", "onnx/decoder_model_merged.onnx"
    }  # fmt: skip
    assert report["parity"]["source"] == "samples" and report["parity"]["samples"] == 4
    assert report["generation"]["passed"] is True and report["generation"]["prompts"] == 4
    assert (run / "onnx" / "README.md").is_file() and not (run / "onnx.failed").exists()
    assert report["model_type"] == arch


def test_predict_and_eval_on_the_export_answer_as_the_pytorch_run(arch_run, tmp_path):
    """``ortft predict`` and ``ortft eval`` of onnx/ run the three graphs
    (``exporting.OnnxVisionLanguage``): the same answers, loss and exact match as final/."""
    _, run = arch_run
    (tmp_path / "rows.jsonl").write_text(_questions(6))
    out = {}
    for source in (run, run / "onnx"):
        res = run_cli("predict", source, "--input", tmp_path / "rows.jsonl", "--json",
                      "--max-new-tokens", "6")  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        out[source] = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(out[run]) == 6 and out[run / "onnx"] == out[run]
    res = run_cli("eval", run / "onnx", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout)
    summary = json.loads((run / "summary.json").read_text())["metrics"]
    assert got["runtime"] == "onnxruntime"
    assert got["metrics"]["loss"] == pytest.approx(summary["eval_loss"], abs=1e-4)
    assert got["metrics"]["exact_match"] == summary["eval_exact_match"]


def test_a_qwen2vl_folder_passes_the_model_check_and_loads_its_processor(qwen_run):
    """A pretrained Qwen2-VL folder (model.name_or_path; the run's final/ here): its class reads
    input_ids first, which the image-text task takes (``reads_modalities``); its processor loads
    without torchvision."""
    from ortft.backends.torch import load_checks

    task = tasks.get("image-text-to-text")
    load_checks.check_fits(str(qwen_run / "final"), task, False)  # raises on a misfit
    processor = task.processor_from_folder(qwen_run / "final")
    assert type(processor).__name__ == "Qwen2VLProcessor"
    assert processor.tokenizer.eos_token == "<|im_end|>" and processor.chat_template


def test_qwen2vl_export_answers_and_scores_as_the_pytorch_model(qwen_run):
    """In process (cheap): the Qwen2-VL run's onnx/ as ``ortft eval`` and ``ortft predict``
    run it (the flat patches, the grid, the 3-D positions in numpy) against final/ in
    transformers (``batch_logits``, ``generate``) on 4 held-out rows, wide image padding
    included by the collate."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from ortft.families.vision_language import exporting, predict

    processor = load_processor(qwen_run / "final")
    task = task_for(processor)
    held_out = [json.loads(line) for line in _questions(4).splitlines()]
    batch = task.collate(task.encode(held_out, processor, Data, None).take(np.arange(4)),
                         None, 0)  # fmt: skip
    model = AutoModelForImageTextToText.from_pretrained(qwen_run / "final").eval()
    config = AutoConfig.from_pretrained(qwen_run / "onnx")
    graphs = exporting.OnnxVisionLanguage(qwen_run / "onnx", config)
    want = task.batch_logits(model, "torch", batch)
    got = task.batch_logits(graphs, "onnxruntime", batch)
    assert np.max(np.abs(got - want)) <= 1e-4
    start = int(task.encode(held_out[:1], processor, Data, None).column("_start")[0])
    ids = batch["input_ids"][:1, :start]
    vision = {k: batch[k][:1] for k in ("pixel_values", "image_grid_thw")}
    answers = [predict.generate(m, processor, ids, vision, 6) for m in (model, graphs)]
    assert answers[0] == answers[1] and answers[0][0][1] >= 1
    # the 3-D positions themselves (a tiny random model's logits barely depend on them): the
    # export's numpy ones are get_rope_index's on every real token
    import torch

    from ortft.families.vision_language import qwen2vl_model

    t = {k: torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "image_grid_thw")}
    want = qwen2vl_model.positions(model, *t.values()).permute(1, 0, 2).numpy()
    feeds = graphs.arch.onnx_feeds({k: batch[k] for k in graphs.arch.pixel_keys})
    got = graphs.arch.onnx_positions(batch["input_ids"], batch["attention_mask"], feeds, config)
    real = batch["attention_mask"].astype(bool)
    assert (got[:, real] == want[:, real]).all()


# Qwen2-VL's card is hand-run (slow: about 50 s on 2 loaded cores, its own process)
@pytest.mark.parametrize(
    "arch_run", ["llava", pytest.param("qwen2_vl", marks=pytest.mark.slow)], indirect=True
)
def test_the_export_card_generates_as_transformers_does(arch_run, tmp_path):
    """The model card's snippet (onnxruntime, numpy, Pillow and the processor), run in a copy
    of the folder on one of the digits: its greedy tokens are ``generate``'s on final/, and its
    last step's logits are within the export's tolerance of ``generate``'s."""
    import subprocess
    import sys

    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from ortft.export.deploy import card_snippet

    _, run = arch_run
    folder = tmp_path / "export"
    shutil.copytree(run / "onnx", folder, symlinks=True)
    shutil.copy(DIGITS / "images" / "0004.png", folder / "image.png")
    (folder / "snippet.py").write_text(card_snippet((folder / "README.md").read_text()))
    show = (
        "import json, runpy; g = runpy.run_path('snippet.py'); "
        "print(json.dumps({'ids': g['answer'], 'last': g['out'][0][0, -1].tolist()}))"
    )
    res = subprocess.run([sys.executable, "-c", show], cwd=folder, capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    processor = load_processor(run / "final")
    model = AutoModelForImageTextToText.from_pretrained(run / "final").eval()
    msgs = [{"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "Which digit is this?"}]}]  # fmt: skip
    prompt = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    x = processor(images=[Image.open(folder / "image.png").convert("RGB")], text=[prompt],
                  return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        out = model.generate(**x, max_new_tokens=16, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)  # fmt: skip
    want = out.sequences[0, x["input_ids"].shape[1] :].tolist()
    eos = processor.tokenizer.eos_token_id
    assert got["ids"] == (want[: want.index(eos)] if eos in want else want)
    last = out.logits[-1][0].numpy()
    assert np.max(np.abs(np.asarray(got["last"]) - last)) <= 1e-4


def test_ortft_export_of_the_run_publishes_the_same_checks(run, tmp_path):
    res = run_cli("export", run, "-o", tmp_path / "out")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "export.json").read_text())
    assert report["passed"] is True and report["parity"]["source"] == "samples"
    res = run_cli("export", run, "-o", tmp_path / "bad", "--quantize", "int8")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: image-text-to-text exports")


# Qwen2-VL's resume is hand-run (slow: two more runs, about 60 s on 2 loaded cores); it shares
# the loop, the checkpoint and the data order with the others, and its positions are recomputed
# from each batch
@pytest.mark.parametrize(
    "arch_run", [*ARCHS, pytest.param("qwen2_vl", marks=pytest.mark.slow)], indirect=True
)
def test_the_run_resumes_exactly_after_kill_9(arch_run, tmp_path):
    """Killed with kill -9 right after step 2's checkpoint and resumed: steps 3-4 give the
    uninterrupted run's losses."""
    import signal
    import subprocess
    import time

    from helpers import start_cli

    arch, run = arch_run
    cut = tmp_path / "cut"
    # no export and no generated answers: the losses of steps 3-4 are what is compared
    overrides = [*TINY, *arch_overrides(arch), "export.enabled=false", "task.generate_samples=0"]
    args = ["train", RECIPE, *overrides, "--output-dir", cut]
    with open(tmp_path / "cut.err", "w") as err:
        proc = start_cli(*args, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 600
    while not (cut / "step-000002" / "manifest.json").exists():
        assert proc.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-000002")
    want, got = losses(run, by_step=True), losses(cut, by_step=True)
    assert [got[s] for s in (3, 4)] == pytest.approx([want[s] for s in (3, 4)], abs=1e-6)


def test_an_audio_folder_is_one_line_naming_what_the_task_reads(tmp_path):
    """A pretrained folder whose model reads neither an image nor a text first."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from ortft.backends.torch import load_checks

    sizes = dict(d_model=8, encoder_ffn_dim=8, decoder_ffn_dim=8, vocab_size=60)
    layers = dict(encoder_layers=1, decoder_layers=1)
    heads = dict(encoder_attention_heads=1, decoder_attention_heads=1)
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    config = WhisperConfig(**sizes, **layers, **heads, **ids)
    WhisperForConditionalGeneration(config).save_pretrained(tmp_path)
    says = r"an audio model \(input_features\); image-text-to-text needs an image or text model"
    with pytest.raises(InputError, match=says):
        load_checks.check_fits(str(tmp_path), tasks.get("image-text-to-text"), False)
