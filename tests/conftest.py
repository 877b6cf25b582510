"""Shared fixtures: tiny offline data and recipes (2 layers, hidden 32, tokenizers trained here).

Also the suite's own rules, for every tier: the Hub is offline (each test process and every
process it starts), property tests draw the same examples every run, a test marked ``ort``
skips where ONNX Runtime training is not installed (the current profile) and runs wherever it
is, and a skip fails the session unless its reason is one of ``ALLOWED_SKIPS`` (a GPU, a
developer's opt-out, the ort profile).
"""

from __future__ import annotations

import csv
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

from ortft.env import ort_training

# Set before any test imports transformers, datasets or huggingface_hub (they read these once)
# and inherited by every CLI process a test starts: nothing in the suite may reach the Hub.
HUB_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
os.environ.update(HUB_OFFLINE)

# The same examples every run: a property test that fails, fails again (and its example is
# printed); hypothesis's example database stays out of it.
settings.register_profile("ortft", derandomize=True, database=None, print_blob=True)
settings.load_profile("ortft")

# The only reasons a test may skip. Any other skip is a broken install or a test that stopped
# running, and fails the session (pytest_sessionfinish below).
ALLOWED_SKIPS = (
    "needs a CUDA GPU",  # the CUDA paths, on a machine without one
    "checks the CPU-only behaviour",  # the CPU-only paths, on a machine with a GPU
    "ORTFT_NO_NODE=1",  # a developer's opt-out of the transformers.js check (no Node.js)
)
# A test marked `ort` on the current profile. Allowed only there: on the ort profile nothing
# may skip for want of ORT training (the CI tier of the current profile deselects them anyway).
NO_ORT_TRAINING = "needs the ort profile: onnxruntime-training is not installed"
if ort_training.installed() is None:
    ALLOWED_SKIPS += (NO_ORT_TRAINING,)
# The tiny recipes' backend where a test does not name one: the product's default (ort) on the
# ort profile; on the current profile torch, so that what such a test checks (export, predict,
# resume...) still runs there instead of stopping at the missing ORT training.
DEFAULT_BACKEND = "ort" if ort_training.installed() is not None else "torch"


# The tiers selected by a marker of their own (`make test-learn`: -m "learn and not gpu") import
# only the test files that apply it: importing the whole suite to deselect all but a few of its
# tests cost each of a tier's workers seconds of CPU. A tier marker is applied as written,
# `pytest.mark.<tier>` (tests/test_suite_rules.py checks that no hook adds one).
TIER_MARKERS = ("learn", "consumer", "archs", "profiles")


def selected_tier(markexpr: str) -> str | None:
    """The tier that ``-m markexpr`` requires of every test (``"learn and not gpu"``: learn),
    or None where the expression also admits tests without a tier marker."""
    words = markexpr.split()  # "or" anywhere, even in parentheses, may admit other tests
    return words[0] if words and words[0] in TIER_MARKERS and "or" not in words else None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    tier = selected_tier(config.option.markexpr or "")
    if tier is None or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py":
        return None
    return True if f"mark.{tier}" not in collection_path.read_text() else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ort_training.installed() is not None:
        return
    skip = pytest.mark.skip(reason=NO_ORT_TRAINING)
    for item in items:
        if item.get_closest_marker("ort"):
            item.add_marker(skip)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


_unexpected_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # under xdist every report also reaches the controller, which alone decides the exit code
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not reason.startswith(ALLOWED_SKIPS):
            _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    is_worker = hasattr(session.config, "workerinput")
    if _unexpected_skips and exitstatus == pytest.ExitCode.OK and not is_worker:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unexpected_skips:
        terminalreporter.section("skips that are not allowed (tests/conftest.py ALLOWED_SKIPS)")
        for line in _unexpected_skips:
            terminalreporter.line(line)


POS = [
    "great fun movie",
    "loved the acting",
    "wonderful moving story",
    "a real delight",
    "brilliant film superb cast",
]
NEG = [
    "boring and dull",
    "terrible plot",
    "awful acting bad script",
    "a waste of time",
    "dreadful slow mess",
]

# the tiny corpora's vocabulary (write_corpus, and tests that need texts of varied length)
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "dogs",
    "ran",
    "in",
    "parks",
    "and",
    "birds",
    "sang",
    "over",
    "trees",
]


@pytest.fixture(scope="session")
def task_matrix(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every task trained once per test process (tests/test_task_matrix.py's Matrix): the task
    matrix and the consumer tier share the runs where one process has both (`make
    test-current` puts them in one xdist group). With ORTFT_TEST_MATRIX_DIR (.ci/run sets it),
    once per code and venv: `make test-consumer` reuses the runs `make test` trained, in a
    folder named by ``matrix_key``, so a change to the code or another venv trains anew."""
    from test_task_matrix import Matrix

    shared = os.environ.get("ORTFT_TEST_MATRIX_DIR")
    if not shared:
        return Matrix(tmp_path_factory.mktemp("matrix"))
    root = Path(shared) / matrix_key()
    root.mkdir(parents=True, exist_ok=True)
    return Matrix(root)


def matrix_key() -> str:
    """The venv (``sys.prefix``), every source file of ortft and its tests, and the data they
    train on, hashed: what the matrix's runs depend on."""
    import hashlib

    digest = hashlib.sha256(sys.prefix.encode())
    top = Path(__file__).resolve().parent.parent
    files = sorted([*(top / "ortft").rglob("*.py"), *(top / "tests").glob("*.py")])
    data = [*(top / "tests" / "data").rglob("*"), *(top / "recipes" / "data").rglob("*")]
    for path in [*files, *sorted(data)]:
        if path.is_file():
            digest.update(str(path.relative_to(top)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tokenized-data cache per test session, never the user's ~/.cache/ortft. Session-scoped,
    so that module and session fixtures' runs (set up before any function fixture) use it too:
    a module fixture's run that read ~/.cache/ortft beside a test's run that read this cache
    made a DPO resume test compare runs whose cached reference log-probs other runs had filled."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORTFT_CACHE", str(tmp_path_factory.getbasetemp() / "ortft-cache"))
        yield


@pytest.fixture(autouse=True)
def _environ_object_kept() -> Iterator[None]:
    """``datasets``' ``map(num_proc=...)`` replaces ``os.environ`` with a deep copy of it
    (arrow_dataset.py: ``os.environ = prev_env``). A test's monkeypatch then restores its
    variables in the old object, and every later test and module fixture of the process saw
    the test's values (test_data_arrow's ``other-cache`` as the session's ORTFT_CACHE). Set up
    before the test's monkeypatch, so torn down after its undo: the old object, restored, is
    ``os.environ`` again."""
    environ = os.environ
    yield
    if os.environ is not environ:
        os.environ = environ  # noqa: B003 (the object itself, with its contents, is put back)


def write_classification_csv(path: Path, n: int = 160, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for _ in range(n):
            label = rng.choice(["pos", "neg"])
            base = rng.choice(POS if label == "pos" else NEG)
            w.writerow([f"{base} {rng.choice(['indeed', 'really', 'so', 'truly'])}", label])
    return path


def write_corpus(path: Path, n: int = 80, seed: int = 0) -> Path:
    rng = random.Random(seed)
    words = WORDS
    paras = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(n)]
    path.write_text("\n\n".join(paras))
    return path


def tiny_classifier(data: str, backend: str = DEFAULT_BACKEND, **training: object) -> dict:
    return {
        "model": {
            "from_config": {
                "architecture": "bert",
                "hidden_size": 32,
                "num_layers": 2,
                "num_heads": 2,
            },
            "tokenizer": {"train": {"kind": "wordpiece", "vocab_size": 200}},
            "dropout": 0.0,
        },
        "task": "sequence-classification",
        "data": {"train": data, "max_length": 16},
        "training": {"max_steps": 5, "batch_size": 8, "lr": 1e-3, "log_every": 1, **training},
        "backend": {"name": backend},
    }


# Overfitting one batch: tiny_classifier on 8 rows, one full batch a step, constant lr 1e-2.
# Its loss leaves ln 2 at step 5 and is ~0.29 by step 10 in fp32 (torch 2.6, CPU): a trajectory
# that moves, so a precision or route that does not really update the weights shows.
OVERFIT_STEPS = 10
OVERFIT_MIN_FALL = 0.3  # what fp32 must fall over OVERFIT_STEPS for a comparison to mean much


def overfit_classifier(folder: Path, backend: str = "torch") -> dict:
    write_classification_csv(folder / "overfit.csv", n=8)
    recipe = tiny_classifier("overfit.csv", backend=backend, max_steps=OVERFIT_STEPS, lr=1e-2)
    recipe["training"].update({"scheduler": "constant", "warmup_ratio": 0.0})
    recipe["data"]["eval_fraction"] = 0.0
    recipe["export"] = {"enabled": False}
    return recipe


def assert_falls_like(reference: list[float], other: list[float], share: float) -> None:
    """``other``'s loss falls over the run by at least ``share`` of ``reference``'s fall (and
    not past the reference by more than that share), and ``reference`` falls for real."""
    want = reference[0] - reference[-1]
    got = other[0] - other[-1]
    assert want >= OVERFIT_MIN_FALL, f"the reference fell {want:.3f}: {reference}"
    assert share * want <= got <= (2 - share) * want, (
        f"fell {got:.3f} against {want:.3f}: {other} vs {reference}"
    )


def tiny_encoder(texts: list[str]):
    """(a BertModel without a head: 2 layers, hidden 32; a wordpiece tokenizer trained on
    ``texts``), built in this process with seed 0: the embedding tests' encoder."""
    import torch
    from transformers import BertConfig, BertModel

    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.schema import TrainTokenizer

    torch.manual_seed(0)
    tok = train_tokenizer(texts * 10, TrainTokenizer(kind="wordpiece", vocab_size=120))
    config = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, pad_token_id=tok.pad_token_id, architectures=["BertModel"],
    )  # fmt: skip
    return BertModel(config).eval(), tok


def tiny_causal_lm(data: str, backend: str = DEFAULT_BACKEND, **training: object) -> dict:
    return {
        "model": {
            "from_config": {
                "architecture": "gpt2",
                "hidden_size": 32,
                "num_layers": 2,
                "num_heads": 2,
            },
            "tokenizer": {"train": {"kind": "byte-bpe", "vocab_size": 300}},
            "dropout": 0.0,
        },
        "task": "causal-lm",
        "data": {"train": data, "max_length": 32},
        "training": {"max_steps": 5, "batch_size": 4, "lr": 1e-3, "log_every": 1, **training},
        "backend": {"name": backend},
    }


def write_image_folder(
    root: Path, per_class: int = 8, classes: tuple[str, ...] = ("cat", "dog", "fox"),
    size: tuple[int, int] = (10, 12), seed: int = 0,
) -> Path:  # fmt: skip
    """A folder of class sub-folders of small RGB PNGs, each class a colour the model can
    learn (class i has channel i bright), with noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 60, (*size, 3)).astype(np.uint8)
            pixels[..., c % 3] += 150
            Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    return root


def tiny_image_classifier(data: str, backend: str = DEFAULT_BACKEND, **training: object) -> dict:
    """A ViT of 2 layers, hidden 32, on 8x8 images in 4x4 patches (~19k parameters)."""
    return {
        "model": {
            "from_config": {
                "architecture": "vit",
                "hidden_size": 32,
                "num_layers": 2,
                "num_heads": 2,
                "intermediate_size": 64,
                "options": {"image_size": 8, "patch_size": 4},
            },
            "dropout": 0.0,
        },
        "task": "image-classification",
        "data": {"train": data, "eval_fraction": 0.25},
        "training": {"max_steps": 4, "batch_size": 4, "lr": 3e-3, "log_every": 1, **training},
        "backend": {"name": backend},
    }


SPEECH = Path(__file__).resolve().parent.parent / "recipes" / "data" / "speech"


def write_speech_jsonl(path: Path, n: int = 16, split: str = "train") -> Path:
    """A jsonl of the first ``n`` committed spoken-digit clips of ``split`` (absolute paths:
    recipes/data/speech, 16 kHz FLAC) and their transcripts."""
    lines = (SPEECH / f"{split}.jsonl").read_text().splitlines()[:n]
    rows = [json.loads(x) for x in lines]
    path.write_text(
        "".join(
            json.dumps({"audio": str(SPEECH / r["audio"]), "text": r["text"]}) + "\n" for r in rows
        )
    )
    return path


def tiny_speech_recognizer(data: str, backend: str = DEFAULT_BACKEND, **training: object) -> dict:
    """A Whisper of 1+1 layers, d_model 32, on 3 s windows, its byte-BPE tokenizer trained on
    the transcripts."""
    return {
        "model": {
            "from_config": {
                "architecture": "whisper",
                "hidden_size": 32,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_size": 64,
                "options": {
                    "num_mel_bins": 80,
                    "max_source_positions": 150,
                    "max_target_positions": 24,
                    # at Whisper's 0.02 a 2-step model answers every clip with nothing; 0.3
                    # gives varied transcripts, so PyTorch-vs-ONNX checks compare some text
                    "init_std": 0.3,
                },
            },
            "tokenizer": {"train": {"kind": "byte-bpe", "vocab_size": 280}},
            "dropout": 0.0,
        },
        "task": {"name": "speech-recognition", "max_target_length": 24},
        "data": {"train": data, "eval_fraction": 0.25},
        "training": {"max_steps": 4, "batch_size": 4, "lr": 3e-3, "log_every": 1, **training},
        "backend": {"name": backend},
    }


def write_recipe(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture
def cls_recipe(tmp_path: Path) -> Path:
    write_classification_csv(tmp_path / "train.csv")
    return write_recipe(tmp_path / "cls.yaml", tiny_classifier("train.csv"))


@pytest.fixture
def lm_recipe(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus.txt")
    return write_recipe(tmp_path / "lm.yaml", tiny_causal_lm("corpus.txt"))


def save_pretrained_classifier(
    folder: Path,
    texts: list[str],
    labels: tuple[str, ...] = ("neg", "pos"),
    max_positions: int = 64,
    seed: int = 0,
) -> Path:
    """A tiny pretrained BertForSequenceClassification folder, as `save_pretrained` writes one:
    config.json (id2label = ``labels``), model.safetensors and a WordPiece tokenizer trained on
    ``texts`` (tokenizer.json, tokenizer_config.json)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ortft.backends.torch.models import train_tokenizer
    from ortft.recipe.model import TrainTokenizer

    tok = train_tokenizer(texts, TrainTokenizer(kind="wordpiece", vocab_size=200))
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def consumer_python() -> str:
    """The clean runtime's python (scripts/consumer-env.sh builds it once, under a lock, and
    caches it in ~/.cache/ortft): the consumer tier's modules run exports there."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    res = subprocess.run(
        [str(root / "scripts" / "consumer-env.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip()


@pytest.fixture(scope="session")
def node_modules() -> str:
    """transformers.js, installed by scripts/node-consumer-env.sh (cached). Node is part of the
    tier: missing, the test fails, unless ORTFT_NO_NODE=1 asks to skip it."""
    if os.environ.get("ORTFT_NO_NODE") == "1":
        pytest.skip("ORTFT_NO_NODE=1: the transformers.js check is skipped")
    import shutil
    import subprocess

    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    assert not missing, (
        f"{' and '.join(missing)} not found: the consumer tier runs transformers.js on Node 20 "
        "(install it, or set ORTFT_NO_NODE=1 to skip this check)"
    )
    res = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / "scripts" / "node-consumer-env.sh")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip()
