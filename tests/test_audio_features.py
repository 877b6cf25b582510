"""features.onnx (ortft.families.speech.features) against transformers' WhisperFeatureExtractor: the
default call (its torch path when torch is installed, as here) within TOLERANCE, and its numpy
path to float32 rounding, on numpy-made audio and the committed speech clips.

The measurements behind TOLERANCE: ``.venv/bin/python tests/test_audio_features.py`` prints the
worst difference per case and extractor, against both paths, and the run times.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from transformers import Wav2Vec2FeatureExtractor, WhisperFeatureExtractor
from transformers.models.whisper import feature_extraction_whisper as fe_module

from ortft.core.errors import InputError
from ortft.families.speech import features as af

ROOT = Path(__file__).resolve().parent.parent
CLIPS = ROOT / "recipes" / "data" / "speech" / "clips"
SR = 16000
# The numpy path works in float64 and rounds to float32 where the graph does (after log10): one
# float32 step near 1 (1.2e-7 measured); a float32 STFT is 1e-4 to 9e-3 off, which this catches.
NUMPY_TOL = 1e-6


def _voiced(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-like: a 120-220 Hz pitch glide with harmonics, syllable bursts and silent gaps."""
    t = np.arange(int(seconds * SR)) / SR
    pitch = 120 + 100 * (0.5 + 0.5 * np.sin(2 * np.pi * 0.7 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / SR
    wave = sum(np.sin(k * phase) / k for k in range(1, 25))
    envelope = np.clip(np.sin(2 * np.pi * 3 * t), 0, None) ** 2  # half the time exactly zero
    noise = 0.01 * np.random.default_rng(seed).standard_normal(t.size)
    return (0.3 * wave * envelope + noise * envelope).astype(np.float32)


def _cases(n_samples: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(SR) / SR
    return {
        "tone_440hz_1s": (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32),
        "white_noise": (0.1 * rng.standard_normal(n_samples // 2)).astype(np.float32),
        "silence": np.zeros(SR, np.float32),  # all -10 before the max - 8 clamp
        "longer_than_n_samples": (0.3 * rng.standard_normal(n_samples + 12345)).astype(np.float32),
        "voiced": _voiced(2.5),
    }


def _speech_clips(count: int) -> dict[str, np.ndarray]:
    """The committed clips (16 kHz mono FLAC), decoded as a client would."""
    import soundfile as sf

    out = {}
    for path in sorted(CLIPS.glob("*.flac"))[:count]:
        audio, rate = sf.read(str(path), dtype="float32")
        assert rate == SR and audio.ndim == 1, (path, rate, audio.shape)
        out[path.name] = audio
    return out


def _reference(fe, samples: np.ndarray, numpy_path: bool = False) -> np.ndarray:
    if not numpy_path:
        return fe(samples, sampling_rate=SR, return_tensors="np").input_features
    torch_on = fe_module.is_torch_available
    fe_module.is_torch_available = lambda: False  # __call__ picks its path by this
    try:
        return fe(samples, sampling_rate=SR, return_tensors="np").input_features
    finally:
        fe_module.is_torch_available = torch_on


def _diffs(fe, path: Path, samples: np.ndarray) -> tuple[float, float]:
    """Max abs difference from the default call and from the numpy path."""
    got = af.run(path, samples)
    shape = (1, fe.feature_size, fe.nb_max_frames)
    assert got.shape == shape and got.dtype == np.float32, (got.shape, got.dtype)
    default, numpy = (_reference(fe, samples, flag) for flag in (False, True))
    return (float(np.abs(got - default).max()), float(np.abs(got - numpy).max()))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[WhisperFeatureExtractor, Path]:
    fe = WhisperFeatureExtractor(feature_size=80, chunk_length=4)
    path = tmp_path_factory.mktemp("features") / "features.onnx"
    desc = af.write(fe, path)
    json.dumps(desc)  # goes into export.json as is
    assert desc["n_samples"] == 4 * SR and desc["feature_size"] == 80 and desc["opset"] == 17
    return fe, path


@pytest.mark.parametrize("case", list(_cases(4 * SR)))
def test_matches_the_extractor(small, case: str) -> None:
    fe, path = small
    to_default, to_numpy = _diffs(fe, path, _cases(fe.n_samples)[case])
    assert to_default <= af.TOLERANCE, to_default
    assert to_numpy <= NUMPY_TOL, to_numpy


def test_silence_is_flat(small) -> None:
    fe, path = small  # max - 8 clamps everything: log10(1e-10) = -10 -> (-10 + 4) / 4
    assert np.all(af.run(path, np.zeros(0, np.float32)) == np.float32(-1.5))


def test_matches_on_speech_clips(small) -> None:
    fe, path = small
    clips = _speech_clips(4)
    assert clips
    for name, audio in clips.items():
        to_default, to_numpy = _diffs(fe, path, audio)
        assert to_default <= af.TOLERANCE and to_numpy <= NUMPY_TOL, (name, to_default, to_numpy)


def test_whisper_default_30s(tmp_path: Path) -> None:
    fe = WhisperFeatureExtractor()  # openai/whisper-*'s: 80 mels, 30 s, 3000 frames
    path = tmp_path / "features.onnx"
    af.write(fe, path)
    to_default, to_numpy = _diffs(fe, path, _voiced(7.0, seed=1))
    assert to_default <= af.TOLERANCE and to_numpy <= NUMPY_TOL, (to_default, to_numpy)


def test_128_mels(tmp_path: Path) -> None:
    fe = WhisperFeatureExtractor(feature_size=128, chunk_length=8)  # whisper-large-v3's mels
    path = tmp_path / "features.onnx"
    assert af.write(fe, path)["outputs"] == {"input_features": "float32 [1, 128, 800]"}
    for samples in (_voiced(3.0), _cases(fe.n_samples)["white_noise"]):
        to_default, to_numpy = _diffs(fe, path, samples)
        assert to_default <= af.TOLERANCE and to_numpy <= NUMPY_TOL, (to_default, to_numpy)


@pytest.mark.parametrize("settings", [{"padding_side": "left"}, {"padding_value": 0.25}])
def test_padding_settings(tmp_path: Path, settings: dict) -> None:
    fe = WhisperFeatureExtractor(feature_size=80, chunk_length=2, **settings)
    path = tmp_path / "features.onnx"
    af.write(fe, path)
    to_default, to_numpy = _diffs(fe, path, _voiced(1.2))
    assert to_default <= af.TOLERANCE and to_numpy <= NUMPY_TOL, (to_default, to_numpy)


def test_graph_is_portable(small) -> None:
    import onnx

    model = onnx.load(str(small[1]))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8 and [o.version for o in model.opset_import] == [17]
    assert {n.op_type for n in model.graph.node} >= {"STFT", "MatMul", "Pad", "ReduceMax"}


def test_refuses_what_it_does_not_reproduce() -> None:
    with pytest.raises(InputError, match="dither=0.0001"):
        af.build(WhisperFeatureExtractor(chunk_length=4, dither=1e-4))
    with pytest.raises(InputError, match="not a WhisperFeatureExtractor"):
        af.build(Wav2Vec2FeatureExtractor())

    class Louder(WhisperFeatureExtractor):
        def _np_extract_fbank_features(self, waveform_batch, device):
            return super()._np_extract_fbank_features(waveform_batch * 2, device)

    assert "Louder overrides _np_extract_fbank_features" in af.supported_problem(Louder())
    assert af.supported_problem(WhisperFeatureExtractor()) is None


def test_run_wants_one_mono_clip(small) -> None:
    with pytest.raises(InputError, match=r"shape \[2, 100\]"):
        af.run(small[1], np.zeros((2, 100), np.float32))


# --------------------------------------------------------------------------- the measurements


def _median_s(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(out_dir: Path) -> None:
    """Worst differences per case for 4 s/80, 30 s/80 and 8 s/128 extractors, and run times
    (one thread each: onnxruntime's, torch's, numpy's FFT)."""
    import torch

    torch.set_num_threads(1)
    extractors = [(80, 4), (80, 30), (128, 8)]
    for mels, seconds in extractors:
        fe = WhisperFeatureExtractor(feature_size=mels, chunk_length=seconds)
        path = out_dir / f"features-{mels}-{seconds}s.onnx"
        af.write(fe, path)
        cases = {**_cases(fe.n_samples), **_speech_clips(10**6)}
        worst: dict[str, list[float]] = {}
        for name, samples in cases.items():
            group = worst.setdefault("speech_clips" if name.endswith(".flac") else name, [0, 0])
            group[:] = np.maximum(group, _diffs(fe, path, samples)).tolist()
        for name, (d, n) in worst.items():
            print(f"{mels} mels {seconds:2d} s  {name:22s} default {d:.2e}  numpy path {n:.2e}")
        print(f"{mels} mels {seconds:2d} s  time: {_times(fe, path, _voiced(seconds))}")


def _times(fe, path: Path, clip: np.ndarray) -> str:
    graph = _median_s(lambda: af.run(path, clip, threads=1))
    default, numpy = (_median_s(lambda f=f: _reference(fe, clip, f)) for f in (False, True))
    return (
        f"graph (1 thread) {graph * 1e3:.0f} ms, extractor torch path {default * 1e3:.0f} ms, "
        f"numpy path {numpy * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp))
