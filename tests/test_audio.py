"""Audio files in the data path: WAV/FLAC/OGG decoded to float32 mono at the model's rate (the
down-mix, the resample, the cut, and the notes that count them), bad files named, and the
committed spoken-digit clips checked. Files are made here with numpy + soundfile (no espeak)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from ortft.families.speech import audio

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT / "recipes" / "data" / "speech"
SCRIPT = ROOT / "scripts" / "make-speech.py"
FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "ogg": ("OGG", "VORBIS")}


def tone(seconds: float, rate: int, hz: float = 440.0, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def write(path: Path, samples: np.ndarray, rate: int, subtype: str | None = None) -> str:
    fmt, default = FORMATS.get(path.suffix[1:], ("WAV", "PCM_16"))
    sf.write(path, samples, rate, format=fmt, subtype=subtype or default)
    return str(path)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


def agree(path: str, rate: int = 16000, max_seconds: float | None = 30.0) -> audio.Notes:
    """load's notes, after asserting check + notes_of predict them without decoding twice."""
    samples, notes = audio.load(path, rate, max_seconds)
    assert audio.notes_of(audio.check(path), rate, max_seconds) == notes
    assert samples.dtype == np.float32 and samples.ndim == 1
    return notes


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("ext", sorted(FORMATS))
def test_a_16_khz_mono_clip_loads_unchanged(tmp_path: Path, ext: str) -> None:
    x = tone(1.0, 16000)
    path = write(tmp_path / f"a.{ext}", x, 16000)
    assert audio.check(path) == audio.Info(rate=16000, channels=1, frames=16000)
    assert audio.check(path).seconds == 1.0
    samples, notes = audio.load(path, 16000, 30.0)
    assert notes == audio.Notes(stereo=False, resampled_from=None, cut=False)
    assert samples.shape == (16000,)
    if ext == "ogg":  # Vorbis is lossy: the tone survives, the samples only nearly
        assert np.corrcoef(samples, x)[0, 1] > 0.99
    else:  # 16-bit PCM: within one quantization step
        assert np.abs(samples - x).max() <= 1 / 32768
    assert agree(path) == notes


def test_stereo_is_down_mixed_by_the_mean_of_its_channels(tmp_path: Path) -> None:
    left, right = tone(0.5, 16000, 440), tone(0.5, 16000, 660, amp=0.25)
    path = write(tmp_path / "st.flac", np.stack([left, right], axis=1), 16000)
    assert audio.check(path).channels == 2
    samples, notes = audio.load(path, 16000, None)
    assert notes.stereo and notes.resampled_from is None and not notes.cut
    assert np.abs(samples - (left + right) / 2).max() <= 1 / 32768
    assert agree(path) == notes


def test_8_khz_is_resampled_to_16_khz_and_keeps_its_pitch(tmp_path: Path) -> None:
    path = write(tmp_path / "low.wav", tone(1.0, 8000), 8000)
    samples, notes = audio.load(path, 16000, 30.0)
    assert notes == audio.Notes(stereo=False, resampled_from=8000, cut=False)
    assert len(samples) == 16000  # twice the 8000 frames
    assert peak_hz(samples, 16000) == pytest.approx(440, abs=1)  # 1 Hz bins: 1 s of samples
    assert np.abs(samples[1000:-1000]).max() == pytest.approx(0.5, abs=0.01)
    assert agree(path) == notes


def test_a_40_s_clip_is_cut_at_30_s(tmp_path: Path) -> None:
    path = write(tmp_path / "long.flac", tone(40.0, 16000), 16000)
    assert audio.check(path).seconds == 40.0
    samples, notes = audio.load(path, 16000, 30.0)
    assert notes.cut and len(samples) == 30 * 16000
    assert agree(path) == notes
    assert not audio.load(path, 16000, None)[1].cut  # no limit: the whole clip
    assert len(audio.load(path, 16000, None)[0]) == 40 * 16000


@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_a_cut_clip_reads_only_what_it_keeps_and_matches_resampling_it_whole(
    tmp_path: Path, rate: int
) -> None:
    x = (np.random.default_rng(0).standard_normal(int(3.3 * rate)) * 0.1).astype(np.float32)
    path = write(tmp_path / "noise.wav", x, rate, subtype="FLOAT")
    samples, notes = audio.load(path, 16000, 2.0)
    up, down = {8000: (2, 1), 22050: (320, 441), 44100: (160, 441)}[rate]
    assert notes.cut and notes.resampled_from == rate
    assert np.array_equal(samples, resample_poly(x, up, down)[: 2 * 16000])


@pytest.mark.parametrize(("rate", "kept"), [(8000, 8000), (16000, 16000), (22050, 22050)])
def test_notes_of_agrees_with_load_at_the_cut(tmp_path: Path, rate: int, kept: int) -> None:
    """One second at 16 kHz keeps ``kept`` source frames: one frame more is a cut."""
    for frames in (kept - 1, kept, kept + 1):
        x = 0.5 * np.sin(np.arange(frames, dtype=np.float32) / 10)
        path = write(tmp_path / f"{frames}.wav", x, rate)
        assert audio.check(path).frames == frames
        samples, notes = audio.load(path, 16000, 1.0)
        assert notes.cut == (frames > kept)
        assert len(samples) <= 16000
        assert agree(path, 16000, 1.0) == notes


def test_a_streamed_wav_with_a_placeholder_size_is_not_truncated(tmp_path: Path) -> None:
    """espeak-ng --stdout (and other pipes) can't seek back: the data size says 0x7ffff000."""
    path = tmp_path / "stream.wav"
    write(path, tone(0.25, 16000), 16000)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 0x7FFFF024)  # RIFF size
    data[40:44] = struct.pack("<I", 0x7FFFF000)  # data chunk size (the header is 44 bytes)
    path.write_bytes(bytes(data))
    assert audio.check(str(path)).frames == 4000


# --------------------------------------------------------------------------- bad files


def _cut(path: Path, keep: float) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return str(path)


def bad_files(tmp: Path) -> dict[str, str]:
    """path -> the reason ``check`` (and ``load``) must give."""
    (tmp / "empty.wav").write_bytes(b"")
    (tmp / "notes.wav").write_text("not audio, a text file named .wav\n")
    nan = tone(0.5, 16000)
    nan[100] = np.nan
    return {
        str(tmp / "absent.wav"): "file not found",
        str(tmp / "empty.wav"): r"empty file \(0 bytes\)",
        write(tmp / "header.wav", np.zeros((0, 1), np.float32), 16000): r"^no audio samples",
        str(tmp / "notes.wav"): r"^not an audio file soundfile can read \(Format not recog",
        # the FLAC header says 32000 frames; decoding the rest loses sync
        _cut(Path(write(tmp / "cut.flac", tone(2.0, 16000), 16000)), 0.5): "^truncated or dam",
        # libsndfile would quietly read the 15989 frames left of 32000
        _cut(Path(write(tmp / "cut.wav", tone(2.0, 16000), 16000)), 0.5): "^truncated.*64000",
        _cut(Path(write(tmp / "cut.ogg", tone(2.0, 16000), 16000)), 0.5): "not an audio file",
        write(tmp / "nan.wav", nan, 16000, subtype="FLOAT"): "not numbers",
    }


def test_check_names_what_is_wrong_with_a_file(tmp_path: Path) -> None:
    for path, reason in bad_files(tmp_path).items():
        with pytest.raises(audio.BadAudio, match=reason):
            audio.check(path)


def test_load_names_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    """A file that changed since it was checked: load says why, as check does."""
    for path, reason in bad_files(tmp_path).items():
        if not path.endswith("nan.wav"):  # check's own guard: load returns what it decodes
            with pytest.raises(audio.BadAudio, match=reason):
                audio.load(path, 16000, None)


# --------------------------------------------------------------------------- shipped clips


def make_speech() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_speech", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_clips_pass_make_speech_check() -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (SPEECH / "train.jsonl").read_text().splitlines()]
    assert rows[0].keys() == {"audio", "text", "voice", "rate"}
    notes = agree(str(SPEECH / rows[0]["audio"]))  # the task's view: 16 kHz mono, as it is
    assert notes == audio.Notes(stereo=False, resampled_from=None, cut=False)


def test_make_speech_check_finds_a_changed_clip_or_a_leaky_split(tmp_path: Path) -> None:
    script = make_speech()
    copy = tmp_path / "speech"
    shutil.copytree(SPEECH, copy)
    assert script.problem(copy) is None
    train, held = (copy / "train.jsonl").read_text(), (copy / "eval.jsonl").read_text()

    first_eval = json.loads(held.splitlines()[0])
    leak = {**json.loads(train.splitlines()[0]), "text": first_eval["text"]}
    (copy / "train.jsonl").write_text(json.dumps(leak) + "\n" + train)
    assert "is in train.jsonl and eval.jsonl" in script.problem(copy)

    leak = {**json.loads(train.splitlines()[0]), "voice": first_eval["voice"]}
    leak["rate"] = first_eval["rate"]
    (copy / "train.jsonl").write_text(json.dumps(leak) + "\n" + train)
    assert "voice/rate" in script.problem(copy)

    (copy / "train.jsonl").write_text(train)
    clip = copy / first_eval["audio"]
    data, rate = sf.read(clip, dtype="int16")
    data[len(data) // 2] ^= 1  # one sample's lowest bit: still a good FLAC
    sf.write(clip, data, rate, format="FLAC", subtype="PCM_16")
    assert "does not match MANIFEST.sha256" in script.problem(copy)

    write(copy / "clips" / "stray.flac", tone(0.1, 16000), 16000)
    assert "is in no jsonl file" in script.problem(copy)

    (copy / "clips" / "stray.flac").unlink()
    write(clip, tone(0.5, 8000), 8000)
    assert "at 8000 Hz" in script.problem(copy)
