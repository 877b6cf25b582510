"""Speech recognition end to end: bad audio files (error / skip), the conversions a run counts
(stereo, another rate, a clip over the window, a transcript over task.max_target_length),
`ortft predict` on audio files, an exact resume, and the recipe checks. Every run is the tiny
Whisper of conftest (3 s windows) on the committed 16 kHz FLAC clips; one trained run is
shared by the predict and resume tests."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import tiny_speech_recognizer, write_recipe, write_speech_jsonl
from helpers import losses, run_cli, summary
from scipy.signal import resample_poly
from typer.testing import CliRunner

from ortft.cli.app import app

GOOD = 8  # committed clips in each bad-file run: the bad row is row GOOD + 1
WINDOW = 3.0  # seconds: the tiny recipe's max_source_positions 150 / 50 a second


def _recipe(folder: Path, train: Path, checkpoint: dict | None = None, **training: object) -> Path:
    r = tiny_speech_recognizer(str(train), backend="torch", **training)
    r["data"]["eval_fraction"] = 0.0  # rows numbered as in the file, every one in train
    r["export"] = {"enabled": False}
    if checkpoint:
        r["checkpoint"] = checkpoint
    return write_recipe(folder / "r.yaml", r)


def _samples(jsonl: Path, i: int = 0) -> np.ndarray:
    """The float32 samples of the i-th clip ``jsonl`` names (16 kHz mono)."""
    path = json.loads(jsonl.read_text().splitlines()[i])["audio"]
    x, rate = sf.read(path, dtype="float32")
    assert rate == 16000 and x.ndim == 1
    return x


def _long_clip(path: Path, jsonl: Path) -> Path:
    """A 4 s clip (committed clips back to back): over the 3 s window."""
    x = np.concatenate([_samples(jsonl, i) for i in range(4)])[:64000]
    assert len(x) == 64000
    sf.write(path, x, 16000, subtype="PCM_16")
    return path


@dataclass
class _Done:
    returncode: int
    stdout: str
    stderr: str


def _cli(*args: object) -> _Done:
    """``ortft ARGS`` in this process (the commands that stop before training, and predict:
    a subprocess would spend ~4 s of its ~6 importing torch and transformers again)."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception  # a traceback the CLI let through
    return _Done(res.exit_code, res.stdout, res.stderr)


def _error_line(result) -> str:
    """The one error line of a run that stopped with exit 2, its last line on stderr."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert lines == result.stderr.splitlines()[-1:], result.stderr[-2000:]
    return lines[0]


# --------------------------------------------------------------------------- bad files


def _truncated_flac(path: Path, jsonl: Path) -> None:
    clip = Path(json.loads(jsonl.read_text().splitlines()[0])["audio"])
    data = clip.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header is whole: it opens, decoding fails


BAD = {  # the bad file's name -> (how to make it, the reason the error names)
    "empty.wav": (lambda p, j: p.write_bytes(b""), "empty file (0 bytes)"),
    "header-only.wav": (
        lambda p, j: sf.write(p, np.zeros(0, np.float32), 16000, subtype="PCM_16"),
        "no audio samples (0 frames)",
    ),
    "notes.wav": (lambda p, j: p.write_text("not audio\n"), "not an audio file soundfile can read"),
    "gone.wav": (lambda p, j: None, "file not found"),
    "cut.flac": (_truncated_flac, "truncated or damaged"),
}


def _with_rows(tmp_path: Path, extra: list[tuple[Path, str]], n: int = GOOD) -> Path:
    """A jsonl of ``n`` committed clips, then ``extra`` (path, transcript) rows."""
    jsonl = write_speech_jsonl(tmp_path / "train.jsonl", n)
    with jsonl.open("a") as fh:
        for path, text in extra:
            fh.write(json.dumps({"audio": str(path), "text": text}) + "\n")
    return jsonl


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_file_stops_the_run_with_one_line(tmp_path: Path, name: str) -> None:
    make, reason = BAD[name]
    jsonl = write_speech_jsonl(tmp_path / "good.jsonl", 1)
    bad = tmp_path / name
    make(bad, jsonl)
    rows = _with_rows(tmp_path, [(bad, "one two")])
    recipe = _recipe(tmp_path, rows)
    run = tmp_path / "run"
    result = _cli("train", recipe, "--output-dir", run, "data.on_bad_file=error")
    line = _error_line(result)
    assert line.startswith(f"error: {rows}: row {GOOD + 1}: {bad}: {reason}"), line
    assert line.endswith("(data.on_bad_file=skip leaves such files out)"), line
    # no run started: no checkpoint, no metrics, no summary (the lock and processor/ are there)
    started = [p.name for p in run.glob("*") if p.name not in ("processor", ".ortft.lock")]
    assert started == [], started


# --------------------------------------------------------------------------- the shared run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One 6-step run (checkpoint at step 3) on 12 good clips, every bad file of BAD (skipped)
    and one clip of each conversion: stereo, 8 kHz, 4 s, a 30-word transcript."""
    tmp = tmp_path_factory.mktemp("speech")
    jsonl = write_speech_jsonl(tmp / "good.jsonl", 12)
    bad = []
    for name, (make, _) in BAD.items():
        make(tmp / name, jsonl)
        bad.append(tmp / name)
    x = _samples(jsonl, 0)
    sf.write(tmp / "stereo.flac", np.stack([x, x], axis=1), 16000, subtype="PCM_16")
    sf.write(tmp / "8k.wav", resample_poly(x, 1, 2).astype(np.float32), 8000, subtype="PCM_16")
    _long_clip(tmp / "long.wav", jsonl)
    words = " ".join(["one", "two", "three", "four", "five", "six"] * 5)  # 30 words
    extra = [(p, "one two") for p in bad] + [
        (tmp / "stereo.flac", "one"),
        (tmp / "8k.wav", "two"),
        (tmp / "long.wav", "three"),
        (Path(json.loads(jsonl.read_text().splitlines()[1])["audio"]), words),
    ]
    checkpoint = {"save_every": 3, "keep_last": 3}
    recipe = _recipe(tmp, _with_rows(tmp, extra, n=12), checkpoint, max_steps=6)
    run = tmp / "run"
    result = run_cli("train", recipe, "--output-dir", run, "data.on_bad_file=skip", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"tmp": tmp, "run": run, "recipe": recipe, "bad": bad, "stderr": result.stderr,
            "jsonl": jsonl}  # fmt: skip


def test_skip_leaves_bad_files_out_and_counts_them_and_the_conversions(trained: dict) -> None:
    seen = summary(trained["run"])["data"]["audio"]["train"]
    assert seen == {
        "rows": 12 + 5 + 4,
        "used": 12 + 4,
        "skipped": 5,
        "stereo": 1,
        "resampled": {"8000": 1},
        "cut": 1,
        "transcripts_truncated": 1,
    }
    err = trained["stderr"]
    for path, (_, reason) in zip(trained["bad"], BAD.values(), strict=True):
        assert f"warning: skipped {path}: {reason}" in err, err[-3000:]
    assert "warning: train: 1 clips cut at the length limit" in err, err[-3000:]
    assert "warning: train: 1 transcripts truncated to task.max_target_length" in err
    assert summary(trained["run"])["steps"] == 6


def test_a_resumed_run_ends_with_the_same_losses(trained: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    for name in ("final", "step-000006", "summary.json"):  # as if killed after step 3
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    again = run_cli("train", trained["recipe"], "--output-dir", run, "data.on_bad_file=skip",
                    timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary(run)["resumed_from"].endswith("step-000003")
    assert losses(run) == losses(trained["run"])  # the same clips, batches and loss: bit for bit
    assert len(losses(run)) == 6


# --------------------------------------------------------------------------- predict


def _predict(run: Path, *args: object):
    return _cli("predict", run, *args)


@pytest.fixture(scope="module")
def clips(trained: dict) -> Path:
    """A folder of 3 committed clips (as c.flac, a.flac, b.flac), a 4 s WAV and a note."""
    folder = trained["tmp"] / "clips"
    folder.mkdir()
    lines = trained["jsonl"].read_text().splitlines()
    for name, line in zip("cab", lines, strict=False):
        shutil.copy(json.loads(line)["audio"], folder / f"{name}.flac")
    shutil.copy(trained["tmp"] / "long.wav", folder / "long.wav")
    (folder / "notes.txt").write_text("not audio\n")
    return folder


NAMES = ["clips/c.flac", "clips/long.wav", "clips/a.flac"]  # as the list gives them


@pytest.fixture(scope="module")
def listed(trained: dict, clips: Path):
    """`ortft predict RUN --input paths.txt --json` on NAMES (relative to the list)."""
    listing = clips.parent / "paths.txt"  # the working directory is elsewhere (the repo)
    listing.write_text("\n".join(NAMES) + "\n")
    res = _predict(trained["run"], "--input", listing, "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def test_predict_transcribes_a_list_in_order_and_notes_a_cut_clip(listed, clips: Path) -> None:
    got = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["index"] for r in got] == [0, 1, 2]
    assert [r["input"] for r in got] == NAMES
    assert all(set(r) == {"index", "input", "text", "seconds", "cut"} for r in got)
    assert all(isinstance(r["text"], str) for r in got)
    want = [round(sf.info(str(clips.parent / n)).duration, 3) for n in NAMES]
    assert [r["seconds"] for r in got] == want and got[1]["seconds"] == 4.0
    assert [r["cut"] for r in got] == [False, True, False]
    note = [ln for ln in listed.stderr.splitlines() if "clips/long.wav" in ln]
    assert len(note) == 1 and f"transcribing its first {WINDOW:.0f} s" in note[0], listed.stderr


def test_final_loads_in_the_transformers_pipeline(trained: dict, clips: Path) -> None:
    """final/ is a Hugging Face Whisper folder (model, processor, tokenizer, generation
    config) that ``pipeline("automatic-speech-recognition")`` loads and runs. Its transcripts
    equal ``ortft predict``'s on the trained shipped recipe (tests/test_quickstart_slow.py);
    this 6-step model's output is special tokens around a few letters, which the pipeline's
    ``_decode_asr`` joins differently ("ff" vs " f")."""
    from transformers import pipeline

    asr = pipeline("automatic-speech-recognition", model=str(trained["run"] / "final"))
    samples, rate = sf.read(str(clips / "a.flac"), dtype="float32")
    out = asr({"raw": samples, "sampling_rate": rate})
    assert type(asr.model).__name__ == "WhisperForConditionalGeneration"
    assert isinstance(out["text"], str)


def test_predict_on_a_folder_lists_its_audio_files_sorted(
    trained: dict, clips: Path, listed
) -> None:
    res = _predict(trained["run"], "--input", clips)  # plain: path<TAB>transcript
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert all(line.count("\t") == 1 for line in lines), lines
    shown = [line.split("\t")[0] for line in lines]
    assert shown == [str(clips / n) for n in ("a.flac", "b.flac", "c.flac", "long.wav")]
    # no notes.txt; the files the list named get its transcripts (greedy: the same file, the
    # same text)
    listed_texts = {
        Path(r["input"]).name: r["text"] for r in map(json.loads, listed.stdout.splitlines())
    }
    plain_texts = dict((Path(p).name, t) for p, t in (ln.split("\t") for ln in lines))
    assert {n: plain_texts[n] for n in listed_texts} == listed_texts


@pytest.mark.parametrize("name", ["gone.wav", "empty.wav", "notes.wav"])
def test_predict_stops_at_a_bad_file_with_one_line(trained: dict, clips: Path, name: str) -> None:
    reason = BAD[name][1]
    listing = clips.parent / f"bad-{name}.txt"
    # after 16 good clips, a batch: without the check first, those 16 would be printed
    listing.write_text("clips/a.flac\n" * 16 + f"{name}\n")
    res = _predict(trained["run"], "--input", listing, "--json")
    assert res.stdout == ""  # every file is checked before the first transcript
    line = _error_line(res)
    assert line.startswith(f"error: {listing}:17: {name}: {reason}"), line
    assert "changed" not in line, line  # found by the check, not while transcribing


# --------------------------------------------------------------------------- recipe checks


def _tiny(tmp_path: Path, change) -> Path:
    # 8 clips: 6 train after the 0.25 held out, a batch of 4 (a recipe that would train)
    r = tiny_speech_recognizer(str(write_speech_jsonl(tmp_path / "t.jsonl", 8)), backend="torch")
    r["export"] = {"enabled": False}
    change(r)
    return write_recipe(tmp_path / "r.yaml", r)


def test_validate_refuses_a_whisper_without_a_tokenizer(tmp_path: Path) -> None:
    recipe = _tiny(tmp_path, lambda r: r["model"].pop("tokenizer"))
    line = _error_line(_cli("validate", recipe))
    assert line == (f"error: {recipe}: a model built from_config needs model.tokenizer.path or "
                    "model.tokenizer.train")  # fmt: skip


def test_validate_refuses_streaming_audio(tmp_path: Path) -> None:
    recipe = _tiny(tmp_path, lambda r: r["data"].update(streaming=True, eval_fraction=0.0))
    line = _error_line(_cli("validate", recipe))
    want = "data.streaming: speech-recognition reads stored data (a list of files)"
    assert line == f"error: {recipe}: {want}"


def _wordpiece(r: dict) -> None:
    r["model"]["tokenizer"]["train"]["kind"] = "wordpiece"


def test_validate_refuses_a_wordpiece_whisper_tokenizer(tmp_path: Path) -> None:
    """A recipe-only problem: `ortft validate` finds it (ortft.recipe.rules), not the run."""
    recipe = _tiny(tmp_path, _wordpiece)
    line = _error_line(_cli("validate", recipe))
    assert line.startswith(f"error: {recipe}: model.tokenizer.train.kind=wordpiece"), line


# --------------------------------------------------------------------------- data forms


def test_a_folder_with_a_metadata_file_names_its_clips(tmp_path: Path) -> None:
    """A folder of clips with a metadata.jsonl (datasets' audiofolder layout): its rows, the
    paths made absolute against the folder; a folder with neither metadata nor class folders
    is one error line."""
    from ortft import tasks
    from ortft.core.errors import InputError
    from ortft.data.rows import read_rows
    from ortft.data.spec import DataSection

    folder = tmp_path / "clips"
    folder.mkdir()
    rows = [
        json.loads(x)
        for x in write_speech_jsonl(tmp_path / "t.jsonl", 2).read_text().split("\n")
        if x
    ]
    for i, r in enumerate(rows):
        shutil.copy(r["audio"], folder / f"{i}.flac")
    lines = [json.dumps({"audio": f"{i}.flac", "text": r["text"]}) for i, r in enumerate(rows)]
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    spec = DataSection(train="clips")
    task = tasks.get("speech-recognition")
    got = list(read_rows(spec, tmp_path, spec.train, "train", task))
    assert got == [
        {"audio": str(folder / f"{i}.flac"), "text": r["text"]} for i, r in enumerate(rows)
    ]
    (folder / "metadata.jsonl").unlink()
    with pytest.raises(InputError, match="nor a metadata.jsonl or metadata.csv"):
        list(
            read_rows(
                DataSection(train="clips", label_column="x"), tmp_path, "clips", "train", task
            )
        )


@pytest.mark.ort
def test_backend_auto_probes_both_backends_on_audio_batches(tmp_path: Path) -> None:
    """backend.name=auto times torch and ort on the first collated audio batches (features,
    not input_ids) and trains on the faster; both probes ran (no error recorded)."""
    recipe = _tiny(tmp_path, lambda r: r["backend"].update(name="auto"))
    res = run_cli("train", recipe, "--output-dir", tmp_path / "run", "--json",
                  "training.max_steps=1", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    probe = json.loads(res.stdout)["backend"]["probe"]
    assert set(probe["backends"]) == {"torch", "ort"}, probe
    assert all("median_step_s" in b for b in probe["backends"].values()), probe
    assert probe["chosen"] in ("torch", "ort")


@pytest.mark.ort
def test_ort_trains_whisper_like_pytorch_front_end_encoder_and_decoder_in_ort(
    tmp_path: Path,
) -> None:
    """The conv front-end, the encoder and the decoder run in ORT's graph (no fallback), and
    the per-step losses equal PyTorch's."""
    import onnx

    recipe = _tiny(tmp_path, lambda r: r["training"].update(max_steps=3))
    ort = run_cli("train", recipe, "--output-dir", tmp_path / "ort", "backend.name=ort",
                  "backend.save_onnx=true", timeout=600)  # fmt: skip
    assert ort.returncode == 0, ort.stderr[-3000:]
    ref = run_cli("train", recipe, "--output-dir", tmp_path / "torch", timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    backend = summary(tmp_path / "ort")["backend"]
    assert backend["used"] == "ort" and not backend["fallback"] and backend["ort_exports"] >= 1
    assert np.allclose(losses(tmp_path / "ort"), losses(tmp_path / "torch"), rtol=1e-4, atol=1e-5)
    graphs = sorted((tmp_path / "ort" / "ort_graphs").glob("*.onnx"))
    assert graphs, "ORTModule saved no graph"
    ops = {
        n.op_type for g in graphs for n in onnx.load(str(g), load_external_data=False).graph.node
    }
    assert {"Conv", "Softmax", "MatMul"} <= ops  # conv front-end and attention ran in ORT
