"""The architecture tier (`make test-archs`, marker ``archs``): model families built from a tiny
config (hidden 32, 2 layers, 2 heads) train on ORTModule like on PyTorch and export.

Each family trains with its natural task (encoders: sequence-classification, decoders:
causal-lm, encoder-decoders: seq2seq) for 3 steps of batch 4 with ``data.padding: longest``
and ``pad_to_multiple_of: 1`` over texts of different lengths, so the batches have different
shapes, in process (``lifecycle.run``): once on ``backend.name=ort`` with the export on, once
on ``torch`` with it off. Checked per family: ORT ran (backend.used ort, no fallback), the
per-step losses equal PyTorch's (test_golden_losses.py's tolerance), and the export passed its
parity check (summary.json's export section).

Image families (kind ``image``) train image-classification the same way on a folder of tiny
PNGs resized to 16x16 (``options.image_size``), the generic sizes mapped onto each config by
``hf_config.VISION``, from a pretrained folder as a user has one (``save_pretrained_image``:
that config's model and the family's own image processor, written by ``save_pretrained``; its
head kept, reordered, new or started afresh, ``HEADS``); ``ortft predict`` on final/ and on the
export agree. Those ORTModule trains only with a fix (backends/ortmodule/patches.py)
must name it in backend.notes (``IMAGE_PATCHES``). BatchNorm's running statistics are not
compared: ORT's kernel updates running_var with the biased batch variance
(tests/test_vision_patches.py); the losses do not read them. Left out: mobilenet_v2 (its 3-step
losses differ from torch's by 0.08, as much as torch's own float32 from float64, 0.065: noise on
244k parameters), efficientnet (transformers initialises its BatchNorm weights from
N(0, 0.02): logits of 1e-24, a loss of exactly ln(n) on both backends, nothing compared) and
mobilevit (no generic size mapping: its three stages are fixed and its 7 neck widths do not
follow from hidden_size).

The export's generation check (a decoder's KV cache against PyTorch's generate; a seq2seq pair
always runs its own) and a consumer load (tests/test_consumer.py's client on the export in the
clean venv of scripts/consumer-env.sh, against ``ortft predict``) run for one family per kind
in CI (``CHECKED``); ``make test-archs-full`` (ORTFT_ARCHS_FULL=1) runs them for every family.
Other decoders export without the cache (export.kv_cache=false), which skips that check.

onnxruntime-genai opens the export of each decoder family it runs (``genai.MODEL_TYPES``) and
generates ``ortft predict``'s tokens (tests/test_consumer_genai.py's check), for the families of
``DEEP``.

The closing table (family x trains on ORT x max loss diff vs torch x export parity x generation
x consumer load x genai) prints at the end of the session, and goes to ORTFT_ARCHS_TABLE when set
(JSON when the path ends in .json, else Markdown).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import WORDS, write_classification_csv, write_image_folder, write_recipe
from helpers import losses, summary
from test_consumer import CLIENT, ROOT, _consumer, _predict, _prompts
from test_consumer_genai import assert_genai_agrees
from test_golden_losses import REL
from test_task_matrix import _close

from ortft.core.errors import GateError
from ortft.families.generation import genai
from ortft.recipe import io as recipe_io
from ortft.run import lifecycle

# the tracer's and the ONNX exporter's warnings, hundreds a family, say nothing this tier checks
pytestmark = [
    pytest.mark.archs,
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning"),
]

FULL = os.environ.get("ORTFT_ARCHS_FULL", "") not in ("", "0")
TABLE = os.environ.get("ORTFT_ARCHS_TABLE")
STEPS = 3
MAX_NEW = 4  # generated tokens per consumer prompt


@dataclass(frozen=True)
class Family:
    """One ``from_config.architecture`` (a transformers model_type) and how it is built."""

    name: str
    kind: str  # encoder | decoder | seq2seq | image
    gqa: bool = False  # num_kv_heads 1 of 2: grouped-query attention
    options: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] | None = None  # an image family's generic sizes (text: recipe())


IMAGE = 16  # pixels a side: 16 patches of 4 (vit), stages of 4x4 and 2x2 (convnext, resnet)
ATTENTION = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
STAGES = {"hidden_size": 16, "num_layers": 2}  # two stages of 16 and 32 channels
# image family -> (its generic sizes, model.from_config.options)
IMAGE_FAMILIES: dict[str, tuple[dict[str, int], dict[str, Any]]] = {
    "vit": (ATTENTION, {"patch_size": 4}),
    "deit": (ATTENTION, {"patch_size": 4}),
    # pretrained BEiTs use the relative position bias (the resized-table path)
    "beit": (ATTENTION, {"patch_size": 4, "use_relative_position_bias": True}),
    "dinov2": (ATTENTION, {"patch_size": 4}),
    # 8x8 tokens in windows of 4: stage 1's second block shifts its windows
    "swin": (
        {**STAGES, "num_heads": 2, "intermediate_size": 32},
        {"patch_size": 2, "window_size": 4},
    ),
    "convnext": (STAGES, {}),
    "convnextv2": (STAGES, {}),
    "resnet": (STAGES, {}),
    "regnet": ({**STAGES, "num_heads": 2}, {}),  # RegNetY: groups of 8, squeeze-excitation
    # 2x2 after its 16x patch embedding, 1x1 after the subsampling attention
    "levit": ({**STAGES, "num_heads": 2, "intermediate_size": 32}, {"image_size": 32}),
}
# the fix each trains with on ORT (a word of its backend.notes line; patches.py): regnet's
# gradients are wrong without its pool fix, resnet's only classifier pool was right either way
IMAGE_PATCHES = {
    "beit": "bias table",
    "dinov2": "position embedding",
    "resnet": "GlobalAveragePool",
    "regnet": "GlobalAveragePool",
    "levit": "Hardswish",
}
# LeViT's BatchNorm over a batch of 4 (one token an image in its last stage) makes its third
# loss move with float32 rounding (torch float32 against float64: 7e-4; ORT against torch, by
# the folder's seed: 1e-6 to 2e-3); over 8 images ORT and torch agree to 1e-5 on every seed tried
IMAGE_BATCH = {"levit": 8}
# Each image family loads from a pretrained folder (save_pretrained_image) whose head has the
# data's labels (kept), the same in another order (reordered), none (a base model: new), or
# another set's, as an ImageNet checkpoint's (the rest: reinitialised); load_checks.plan_head
LABELS = ("cat", "dog", "fox")  # write_image_folder's classes, in label order
OTHER_LABELS = ("tench", "goldfish", "shark", "hen", "ostrich")
HEADS = {"vit": "kept", "deit": "reordered", "resnet": "new"}
ENCODERS = ["bert", "roberta", "xlm-roberta", "deberta-v2", "distilbert", "electra", "albert"]
ENCODERS += ["mpnet", "modernbert"]
GQA = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi3", "starcoder2"]
FAMILIES = (
    [Family(n, "encoder") for n in ENCODERS]
    + [Family("gpt2", "decoder")]
    + [Family(n, "decoder", gqa=True) for n in GQA]
    # MoE: 2 experts, each token routed to 1 (a real sparse route: an expert may get no token)
    + [
        Family(
            "mixtral",
            "decoder",
            gqa=True,
            options={"num_local_experts": 2, "num_experts_per_tok": 1},
        )
    ]
    + [Family(n, "decoder") for n in ("gpt_neox", "opt", "falcon")]
    + [Family(n, "seq2seq") for n in ("t5", "bart", "mbart", "marian")]
    + [Family(n, "image", options=o, sizes=sz) for n, (sz, o) in IMAGE_FAMILIES.items()]
)
BY_NAME = {f.name: f for f in FAMILIES}
# one family per kind gets the generation check and the consumer load in CI
# (an image export's consumer load is tests/test_consumer.py's)
CHECKED = {"encoder": "roberta", "decoder": "llama", "seq2seq": "bart"}
DEEP = [f.name for f in FAMILIES if f.kind != "image" and (FULL or CHECKED[f.kind] == f.name)]

TASK = {
    "image": {"name": "image-classification"},
    "encoder": {"name": "sequence-classification"},
    "decoder": {"name": "causal-lm"},
    "seq2seq": {"name": "seq2seq", "max_target_length": 8, "generate_samples": 2},
}
TOKENIZER = {  # one tokenizer kind per model kind, trained from the run's texts
    "encoder": {"kind": "wordpiece", "vocab_size": 200},
    "decoder": {"kind": "byte-bpe", "vocab_size": 300},
    "seq2seq": {"kind": "wordpiece", "vocab_size": 200, "min_frequency": 1},
}
INPUTS = {  # the consumer's prompts
    "encoder": ["great fun movie", "terrible plot"],
    "decoder": ["the cat sat", "dogs ran in"],
    "seq2seq": ["seven zero eight", "two three"],
}
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _write_data(root: Path) -> dict[str, str]:
    """The three kinds' training files: texts of different lengths (batch shapes vary)."""
    rng = random.Random(0)
    lm = [
        {"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))} for _ in range(60)
    ]
    nums = [[rng.randrange(10) for _ in range(rng.randint(1, 6))] for _ in range(60)]
    s2s = [
        {"source": " ".join(DIGITS[d] for d in n), "target": " ".join(map(str, n))} for n in nums
    ]
    for name, rows in (("lm.jsonl", lm), ("s2s.jsonl", s2s)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_classification_csv(root / "cls.csv", n=60)
    write_image_folder(root / "imgs", per_class=6)  # 18 images of 10x12, 3 classes
    return {"encoder": "cls.csv", "decoder": "lm.jsonl", "seq2seq": "s2s.jsonl", "image": "imgs"}


def image_spec(family: Family) -> dict[str, Any]:
    """The family's tiny ``model.from_config`` section."""
    spec = {"architecture": family.name, **(family.sizes or {})}
    spec["options"] = {"image_size": IMAGE, **family.options}
    return spec


def save_pretrained_image(family: Family, folder: Path) -> Path:
    """A pretrained folder of ``family`` as ``save_pretrained`` writes one: the model of the
    tier's tiny config with its type's default dropouts (swin and beit: drop_path_rate 0.1,
    which model.dropout must reach), a head as ``HEADS`` says, and the family's own image
    processor (PIL backend), sized to the config's images."""
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForImageClassification
    from transformers.models.auto.image_processing_auto import (
        IMAGE_PROCESSOR_MAPPING_NAMES as PROCESSORS,
    )

    from ortft.backends.torch import hf_config
    from ortft.recipe.schema import FromConfig

    config = hf_config.generic_config(FromConfig(**image_spec(family)), None, None)
    head = HEADS.get(family.name, "reinitialised")
    names = {"kept": LABELS, "reordered": LABELS[::-1]}.get(head, OTHER_LABELS)
    config.id2label = dict(enumerate(names))
    config.label2id = {n: i for i, n in enumerate(names)}
    config.architectures = []  # deit, levit: from_config iterates it (models.build_model)
    torch.manual_seed(0)
    auto = AutoModel if head == "new" else AutoModelForImageClassification
    auto.from_config(config).save_pretrained(folder)
    processor = getattr(transformers, PROCESSORS[family.name]["pil"])
    pixels = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    image_processor(processor, pixels).save_pretrained(folder)
    return folder


def image_processor(cls: Any, pixels: int) -> Any:
    """``cls`` making ``pixels`` x ``pixels`` inputs its own way: a fixed resize, or a shortest
    edge resize (ConvNeXt's crop_pct, LeViT's 256/224), then its centre crop where it has one."""
    default = cls()
    if "shortest_edge" in default.size:
        size = {"shortest_edge": pixels}
    elif default.do_center_crop:  # resized a little larger, then cut (DeiT: 256, then 224)
        size = {"height": pixels + 2, "width": pixels + 2}
    else:
        size = {"height": pixels, "width": pixels}
    if default.do_center_crop:
        return cls(size=size, crop_size={"height": pixels, "width": pixels})
    return cls(size=size)


def image_recipe(family: Family, train: str, backend: str, pretrained: Path) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(pretrained), "dropout": 0.0},
        "task": TASK["image"],
        "data": {"train": train, "eval_fraction": 0.2, "max_eval_samples": 8},
        "training": {
            "max_steps": STEPS,
            "batch_size": IMAGE_BATCH.get(family.name, 4),
            "lr": 1e-3,
            "log_every": 1,
        },
        "backend": {"name": backend},
        "export": {"enabled": backend == "ort"},
    }


def recipe(
    family: Family, train: str, backend: str, pretrained: Path | None = None
) -> dict[str, Any]:
    if family.kind == "image":
        assert pretrained is not None
        return image_recipe(family, train, backend, pretrained)
    spec: dict[str, Any] = {
        "architecture": family.name,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    }
    if family.gqa:
        spec["num_kv_heads"] = 1
    if family.options:
        spec["options"] = {**spec.get("options", {}), **family.options}
    data = {"train": train, "max_length": 24, "padding": "longest", "pad_to_multiple_of": 1}
    data.update(eval_fraction=0.2, max_eval_samples=8)  # the eval rows are the parity samples
    if family.kind == "decoder":
        data["packing"] = False  # one text a row: batch lengths vary
    export: dict[str, Any] = {"enabled": backend == "ort"}
    if family.kind == "decoder" and family.name not in DEEP:
        export["kv_cache"] = False  # no cache, no generation check (CI runs it once per kind)
    return {
        "model": {
            "from_config": spec,
            "tokenizer": {"train": TOKENIZER[family.kind]},
            "dropout": 0.0,
        },
        "task": TASK[family.kind],
        "data": data,
        "training": {"max_steps": STEPS, "batch_size": 4, "lr": 1e-3, "log_every": 1},
        "backend": {"name": backend},
        "export": export,
    }


class Tier:
    """Trains each (family, backend) once, in this process; tests and the table read the runs."""

    def __init__(self, root: Path) -> None:
        self.root, self.data = root, _write_data(root)
        self.runs: dict[tuple[str, str], Path] = {}
        self.errors: dict[tuple[str, str], str] = {}
        self.rows: dict[str, dict[str, Any]] = {}

    def run(self, name: str, backend: str) -> Path:
        key = (name, backend)
        if key in self.errors:
            pytest.fail(self.errors[key])
        if key not in self.runs:
            family = BY_NAME[name]
            try:
                folder = self.pretrained(family) if family.kind == "image" else None
                path = write_recipe(
                    self.root / f"{name}-{backend}.yaml",
                    recipe(family, self.data[family.kind], backend, folder),
                )
                lifecycle.run(recipe_io.load(path), output_dir=self.root / f"{name}-{backend}")
            except GateError:
                pass  # the export's parity gate (exit 3): trained; test_export_passes_parity says
            except (Exception, SystemExit) as err:  # kept: the family's other tests say it too
                self.errors[key] = f"{name} on {backend}: {type(err).__name__}: {err}"
                if backend == "ort":
                    self.row(name)["trains_on_ort"] = f"error ({type(err).__name__})"
                pytest.fail(self.errors[key])
            self.runs[key] = self.root / f"{name}-{backend}"
        return self.runs[key]

    def pretrained(self, family: Family) -> Path:
        """An image family's pretrained folder, built once for both backends."""
        folder = self.root / f"{family.name}-pretrained"
        if not (folder / "preprocessor_config.json").exists():
            save_pretrained_image(family, folder)
        return folder

    def row(self, name: str) -> dict[str, Any]:
        blank = dict.fromkeys(("trains_on_ort", "max_loss_diff", "export_parity"))
        blank.update(generation="not run (CI)", consumer="not run (CI)", genai="not run (CI)")
        if BY_NAME[name].kind in ("encoder", "image"):
            blank["generation"] = "n/a"
        if name not in genai.MODEL_TYPES:
            blank["genai"] = "n/a"
        if BY_NAME[name].kind == "image":
            blank["consumer"] = "test_consumer"
        return self.rows.setdefault(name, {"family": name, "kind": BY_NAME[name].kind, **blank})


COLUMNS = [
    "family",
    "kind",
    "trains_on_ort",
    "max_loss_diff",
    "export_parity",
    "generation",
    "consumer",
    "genai",
]


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return "—" if v is None else f"{v:.1e}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


class _Report:
    """Prints the table in pytest's terminal summary (a plugin registered by the fixture)."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        rows = [self.tier.rows[f.name] for f in FAMILIES if f.name in self.tier.rows]
        if rows:
            terminalreporter.write_sep("=", "architecture tier")
            terminalreporter.write_line(markdown(rows))


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    t = Tier(tmp_path_factory.mktemp("archs"))
    request.config.pluginmanager.register(_Report(t), "ortft-archs-table")
    yield t
    rows = [t.rows[f.name] for f in FAMILIES if f.name in t.rows]
    if TABLE and rows:
        text = json.dumps(rows, indent=1) if TABLE.endswith(".json") else markdown(rows)
        Path(TABLE).write_text(text + "\n")


@pytest.fixture(scope="module")
def consumer_python() -> str:
    """The clean venv's python (scripts/consumer-env.sh; cached in ~/.cache/ortft)."""
    res = subprocess.run(
        [str(ROOT / "scripts" / "consumer-env.sh")], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip()


def _ids(name: str) -> str:
    return name


TRAINED = [f.name for f in FAMILIES]


@pytest.mark.parametrize("name", TRAINED, ids=_ids)
def test_trains_on_ort_like_torch(name: str, tier: Tier) -> None:
    ort_run = tier.run(name, "ort")
    got = summary(ort_run)
    ort_ok = got["backend"]["used"] == "ort" and not got["backend"]["fallback"]
    tier.row(name)["trains_on_ort"] = "yes" if ort_ok else f"no ({got['backend']['used']})"
    assert ort_ok, got["backend"]  # a silent fallback would reproduce torch's losses
    assert got["status"] == "completed" and got["steps"] == STEPS
    if BY_NAME[name].kind == "image":  # one image size, no shapes to vary: the fix it needs
        fix = IMAGE_PATCHES.get(name)
        assert fix is None or any(fix in n for n in got["backend"]["notes"]), got["backend"]
    else:
        shapes = {tuple(r) for r in _batch_lengths(ort_run)}
        assert len(shapes) > 1, f"every batch had the same shape {shapes}"
    ort, torch = losses(ort_run), losses(tier.run(name, "torch"))
    diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ort, torch, strict=True))
    tier.row(name)["max_loss_diff"] = diff
    assert ort == pytest.approx(torch, rel=REL), (ort, torch)


@pytest.mark.parametrize("name", list(IMAGE_FAMILIES), ids=_ids)
def test_pretrained_image_folder_predicts(name: str, tier: Tier) -> None:
    """The folder's head was kept, reordered or started afresh as ``HEADS`` says, on both
    backends; ``ortft predict`` on the ORT run's final/ (PyTorch) and on its export
    (preprocess.onnx, then model.onnx) gives the same label for every image."""
    from ortft.inference import predict

    run = tier.run(name, "ort")
    for backend in ("ort", "torch"):
        head = summary(tier.run(name, backend))["backend"]["head"]
        assert head["action"] == HEADS.get(name, "reinitialised"), head
        assert head["new_labels"] == list(LABELS), head
    images = str(tier.root / tier.data["image"])
    final = list(predict.run(run / "final", images))
    export = list(predict.run(run / "onnx", images))
    assert len(final) == 18 and [r["label"] for r in export] == [r["label"] for r in final]
    for got, want in zip(export, final, strict=True):
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-4), (got, want)
    preprocess = json.loads((run / "onnx" / "export.json").read_text())["preprocess"]
    if name == "levit":  # its processor resizes its own way: predict runs the processor
        assert "LevitImageProcessorPil" in preprocess["reason"], preprocess
    else:
        assert preprocess["exported"] and preprocess["passed"], preprocess


def _batch_lengths(run: Path) -> list[list[int]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["batch_lengths"] for r in rows if r["kind"] == "train"]


@pytest.mark.parametrize("name", TRAINED, ids=_ids)
def test_export_passes_parity(name: str, tier: Tier) -> None:
    report = summary(tier.run(name, "ort"))["export"]
    parity = (report or {}).get("parity") or {}
    row = tier.row(name)
    verdict = "passed" if parity.get("passed") else "FAILED"
    row["export_parity"] = f"{verdict} ({parity.get('max_abs_diff', float('nan')):.1e})"
    generation = (report or {}).get("generation")
    if generation is not None:  # seq2seq pairs always check it; decoders with the KV cache
        row["generation"] = "passed" if generation["passed"] else "FAILED"
    assert report is not None and report["passed"], report and report["failures"]
    assert parity["passed"], parity


@pytest.mark.parametrize("name", [n for n in DEEP if BY_NAME[n].kind != "encoder"], ids=_ids)
def test_generation_check(name: str, tier: Tier) -> None:
    report = json.loads((tier.run(name, "ort") / "onnx" / "export.json").read_text())
    generation = report.get("generation")
    tier.row(name)["generation"] = (
        "missing" if generation is None else "passed" if generation["passed"] else "FAILED"
    )
    assert generation is not None, "the export ran no generation check"
    assert generation["passed"] and generation["steps_compared"] > 0, generation


@pytest.mark.parametrize("name", DEEP, ids=_ids)
def test_consumer_loads_the_export(name: str, tier: Tier, consumer_python: str) -> None:
    """tests/consumer_client.py in the clean venv gives what ``ortft predict`` gives."""
    folder = tier.run(name, "ort") / "onnx"
    kind = "label" if BY_NAME[name].kind == "encoder" else "generate"
    inputs = folder.parent / "consumer-inputs.jsonl"
    inputs.write_text("".join(x + "\n" for x in INPUTS[BY_NAME[name].kind]))
    tier.row(name)["consumer"] = "FAILED"
    want = _predict(folder, inputs, MAX_NEW)
    out = _consumer(consumer_python, "-I", CLIENT, folder, _prompts(folder, inputs), kind, MAX_NEW)
    got = [json.loads(x) for x in out.splitlines()]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert _close(g, {k: w[k] for k in g}), (g, w)
    tier.row(name)["consumer"] = "passed"


@pytest.mark.parametrize("name", [n for n in DEEP if n in genai.MODEL_TYPES], ids=_ids)
def test_genai_generates_what_predict_generates(
    name: str, tier: Tier, consumer_python: str
) -> None:
    """onnxruntime-genai opens the export (its genai_config.json) and generates ``ortft
    predict``'s tokens (tests/test_consumer_genai.py)."""
    folder = tier.run(name, "ort") / "onnx"
    tier.row(name)["genai"] = "FAILED"
    assert_genai_agrees(folder, genai.MODEL_TYPES[name], consumer_python, MAX_NEW)
    tier.row(name)["genai"] = "passed"
