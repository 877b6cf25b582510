"""features.onnx: Whisper's log-mel ``input_features`` as an ONNX graph, so that a client with only
onnxruntime and an audio decoder feeds the decoded clip (float32 [n], mono, at the extractor's
sampling rate, any length) and gets what ``WhisperFeatureExtractor(samples, sampling_rate=...,
return_tensors="np").input_features`` gives.

What the extractor does (transformers 5.24, ``__call__`` with its defaults), and the graph:

- **pad / truncate** to ``n_samples`` (``chunk_length`` seconds): the first ``n_samples`` samples,
  then ``padding_value`` on the extractor's ``padding_side`` (``Slice`` and a constant ``Pad``).
- **centre padding**: ``n_fft // 2`` samples reflected at each end (``Pad``, mode reflect).
- **STFT**: the periodic Hann window (``window_function(n_fft, "hann")``, a constant), frames
  every ``hop_length`` samples, one-sided: ONNX ``STFT`` (opset 17), in float64 as the numpy
  path's FFT, then the power spectrum (``ReduceSumSquare`` over real and imaginary parts).
- **mel**: the last frame dropped, ``MatMul`` by the extractor's ``mel_filters`` [n_freq, n_mels]
  (float64), ``log10(max(x, 1e-10))`` (``Log`` times 1 / ln 10), then float32.
- **range**: ``max(x, x.max() - 8)`` over the whole clip (padding included), then
  ``(x + 4) / 4``, transposed to [1, n_mels, frames].

Why the STFT runs in float64: ORT 1.19's CPU STFT (``dft_naive`` for n_fft = 400, not a power
of two) takes each twiddle as ``cos(float(k * n) * -2pi / N)``, an angle up to 1253 rad held in
float32 (1e-4 rad steps). In float32 it is 3.5e-5 of the peak off an exact DFT (white noise,
30 s), where a float32 matrix DFT is 8e-7 off; the features are then 2e-3 (1 s tone) to 9e-3
(speech, 128 mels) off the extractor, 100x what its own torch and numpy paths differ by. In
float64 the same op is 7e-14 off and as fast, and the graph equals the numpy path to one or two
float32 steps. Opset 17, IR 8 (both the lowest that work).

Time for one clip, one thread each, on two shared busy cores: 4 s 24-33 ms (the extractor's
numpy path 20-24 ms, its torch path 1-3 ms); 30 s 0.17-0.36 s (numpy 50-130 ms, torch 11-17 ms).
The STFT is most of it; a float64 frame ``Gather`` and DFT ``MatMul`` took 37 ms for 30 s.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError

# Max abs difference from the extractor's default call allowed, in input_features units
# ((log10 + 4) / 4; 1e-3 is 0.04 dB). With torch installed that call takes the extractor's float32
# torch.stft path, which differs from its own float64 numpy path by up to 8.1e-5 (a 0.5 DC offset
# and 1e-3 noise), 7.1e-5 (the 300 committed speech clips, 128 mels), 5.7e-5 (same, 80 mels),
# 2.4e-5 (1 s tone); the graph equals the numpy path to 1.2e-7-2.4e-7 (one or two float32 steps)
# on every case: ``.venv/bin/python tests/test_audio_features.py``. 1e-3 leaves 12x room for
# other torch builds' FFTs; a float32 STFT (2e-3 on the tone, 9e-3 on speech) is outside it.
TOLERANCE = 1e-3

OPSET, IR_VERSION = 17, 8  # STFT needs opset 17; IR 8 is the lowest that carries it
_LOG10 = 1.0 / math.log(10.0)
# The methods the extractor's default call runs; a subclass that overrides one may do otherwise.
_PIPELINE = (
    "__call__",
    "pad",
    "_pad",
    "_truncate",
    "_get_padding_strategies",
    "_np_extract_fbank_features",
    "_torch_extract_fbank_features",
)


@dataclass(frozen=True)
class _Plan:
    """What the extractor does to one clip."""

    n_fft: int
    hop_length: int
    n_samples: int
    frames: int  # after the last one is dropped
    sampling_rate: int
    padding_value: float
    pad_left: bool
    mel_filters: np.ndarray  # [n_freq, n_mels]


def supported_problem(feature_extractor: Any) -> str | None:
    """None when ``build`` reproduces this extractor, else a one-line reason naming the setting."""
    plan = _plan(feature_extractor)
    return plan if isinstance(plan, str) else None


def build(feature_extractor: Any) -> Any:
    """features.onnx as an ``onnx.ModelProto`` (checked), for this extractor's settings."""
    return _model(_checked(feature_extractor))


def write(feature_extractor: Any, path: Path) -> dict[str, Any]:
    """Write features.onnx to ``path``; return its description for export.json."""
    import onnx

    from ortft.export.onnx_tools import check_portable

    plan = _checked(feature_extractor)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(_model(plan), str(path))
    check_portable(path)
    n_mels = plan.mel_filters.shape[1]
    return {
        "inputs": {"samples": f"float32 [n] (mono, {plan.sampling_rate} Hz, any length)"},
        "outputs": {"input_features": f"float32 [1, {n_mels}, {plan.frames}]"},
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "n_fft": plan.n_fft,
        "hop_length": plan.hop_length,
        "n_samples": plan.n_samples,
        "feature_size": n_mels,
        "sampling_rate": plan.sampling_rate,
        "tolerance": TOLERANCE,
    }


def run(path: Path, samples: np.ndarray, threads: int = 0) -> np.ndarray:
    """features.onnx on one clip (float [n]): input_features, float32 [1, n_mels, frames]."""
    clip = np.asarray(samples, dtype=np.float32)
    if clip.ndim != 1:
        raise InputError(f"{path}: samples must be one mono clip [n], got shape {list(clip.shape)}")
    session = _session(str(path), Path(path).stat().st_mtime_ns, threads)
    return session.run(None, {"samples": clip})[0]


@functools.lru_cache(maxsize=4)
def _session(path: str, mtime_ns: int, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- reading the extractor


def _checked(fe: Any) -> _Plan:
    plan = _plan(fe)
    if isinstance(plan, str):
        raise InputError(f"features.onnx: {plan}")
    return plan


def _plan(fe: Any) -> _Plan | str:
    """The extractor's settings, or why the graph cannot reproduce it."""
    name = type(fe).__name__
    mro = [cls.__name__ for cls in type(fe).__mro__]
    if "WhisperFeatureExtractor" not in mro:
        return f"{name} is not a WhisperFeatureExtractor (the only audio extractor it reproduces)"
    for cls in type(fe).__mro__:
        if cls.__name__ == "WhisperFeatureExtractor":
            break
        own = sorted(set(vars(cls)) & set(_PIPELINE))
        if own:
            return f"{cls.__name__} overrides {', '.join(own)}, which the graph does not reproduce"
    if float(getattr(fe, "dither", 0.0)) != 0.0:
        return f"dither={fe.dither} adds random noise, which a graph cannot reproduce (use 0.0)"
    side = getattr(fe, "padding_side", "right")
    if side not in ("right", "left"):
        return f"padding_side={side!r} is neither 'right' nor 'left'"
    n_fft, hop, n_samples = int(fe.n_fft), int(fe.hop_length), int(fe.n_samples)
    if hop <= 0 or n_fft <= 1 or n_samples <= n_fft // 2:
        return f"n_fft={n_fft}, hop_length={hop}, n_samples={n_samples} leave no frames"
    mel = np.asarray(fe.mel_filters, dtype=np.float64)
    if mel.ndim != 2 or mel.shape[0] != n_fft // 2 + 1:
        return f"mel_filters {list(mel.shape)} is not [n_fft // 2 + 1 = {n_fft // 2 + 1}, n_mels]"
    # audio_utils.spectrogram: 1 + (n + 2 (n_fft // 2) - n_fft) // hop frames, the last dropped
    frames = (n_samples + 2 * (n_fft // 2) - n_fft) // hop
    return _Plan(
        n_fft,
        hop,
        n_samples,
        frames,
        int(fe.sampling_rate),
        float(fe.padding_value),
        side == "left",
        mel,
    )


def _window(n_fft: int) -> np.ndarray:
    """The extractor's window: ``window_function(n_fft, "hann")``, periodic Hann."""
    from transformers.audio_utils import window_function

    return np.asarray(window_function(n_fft, "hann"), dtype=np.float64)


# --------------------------------------------------------------------------- the graph

_F32, _F64 = 1, 11  # onnx.TensorProto.FLOAT, DOUBLE


class _Builder:
    """Appends nodes with unique output names; a Python float input becomes a float32 scalar."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []

    def op(self, op_type: str, *inputs: str | float, out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        names = [self.const(v, np.float32) if isinstance(v, float) else v for v in inputs]
        name = out or f"{op_type}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, names, [name], **attrs))
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        from onnx import numpy_helper

        name = f"const_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


def _model(plan: _Plan) -> Any:
    import onnx

    opsets = [onnx.helper.make_opsetid("", OPSET)]
    model = onnx.helper.make_model(_graph(plan), opset_imports=opsets, ir_version=IR_VERSION)
    model.producer_name = "ortft"
    onnx.checker.check_model(model, full_check=True)
    return model


def _graph(plan: _Plan) -> Any:
    from onnx import helper

    g = _Builder()
    x = g.op("Cast", _to_length(g, "samples", plan), to=_F64)  # spectrogram's float64 promotion
    half = plan.n_fft // 2
    x = g.op("Pad", x, g.const([half, half]), mode="reflect")  # [n_samples + 2 half]
    x = g.op("Reshape", x, g.const([1, -1, 1]))  # STFT's [batch, length, 1] real signal
    window, n_fft = g.const(_window(plan.n_fft), np.float64), g.const(plan.n_fft)
    spec = g.op("STFT", x, g.const(plan.hop_length), window, n_fft, onesided=1)
    power = g.op("ReduceSumSquare", spec, axes=[3], keepdims=0)  # [1, frames + 1, n_freq]
    power = g.op("Slice", power, g.const([0]), g.const([plan.frames]), g.const([1]))
    mel = g.op("MatMul", power, g.const(plan.mel_filters, np.float64))  # [1, frames, n_mels]
    floor, to_log10 = g.const(1e-10, np.float64), g.const(_LOG10, np.float64)
    log = g.op("Cast", g.op("Mul", g.op("Log", g.op("Max", mel, floor)), to_log10), to=_F32)
    # from here float32, as the extractor's numpy path (and its torch path) goes on
    low = g.op("Sub", g.op("ReduceMax", log, keepdims=1), 8.0)  # over the whole clip
    scaled = g.op("Mul", g.op("Add", g.op("Max", log, low), 4.0), 0.25)  # (x + 4) / 4, exact
    g.op("Transpose", scaled, out="input_features", perm=[0, 2, 1])
    n_mels = plan.mel_filters.shape[1]
    return helper.make_graph(
        g.nodes,
        "whisper_features",
        [helper.make_tensor_value_info("samples", _F32, ["n"])],
        [helper.make_tensor_value_info("input_features", _F32, [1, n_mels, plan.frames])],
        initializer=g.inits,
    )


def _to_length(g: _Builder, x: str, plan: _Plan) -> str:
    """SequenceFeatureExtractor.pad: keep the first n_samples, pad with padding_value up to it."""
    x = g.op("Slice", x, g.const([0]), g.const([plan.n_samples]), g.const([0]))
    short = g.op("Sub", g.const([plan.n_samples]), g.op("Shape", x))
    zero = g.const([0])
    pads = g.op("Concat", *((short, zero) if plan.pad_left else (zero, short)), axis=0)
    return g.op("Pad", x, pads, g.const(plan.padding_value, np.float32), mode="constant")
