"""Audio files: checked once when a split is encoded, decoded per batch.

Decoded with ``soundfile`` (libsndfile, bundled in its wheel: WAV, FLAC, OGG Vorbis/Opus, MP3)
and resampled with ``scipy.signal.resample_poly``, not with datasets' ``Audio`` feature: that
decodes through torchcodec, which needs torch >= 2.8, and the pinned torch is 2.6.

Decoded samples are never stored: 30 s at 16 kHz is 1.9 MB of float32 per example, so the
encoded split keeps each clip's path (and text); ``load`` decodes a batch's files when the batch
is trained on. ``check`` decodes every file once, which is what finds a damaged file, and says
what was wrong.

Every clip becomes float32 mono at the model's rate: channels are averaged, other rates are
resampled (``resample_poly`` with up/down = rate/orig reduced by their gcd), and a clip longer
than ``max_seconds`` is cut there (Whisper's feature extractor keeps 30 s). ``Notes`` records
each conversion so a run counts them; ``notes_of`` gives the same notes from ``check``'s
``Info`` without decoding again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 1 << 20  # frames per read in check(): a 1-hour 44.1 kHz stereo file is 1.3 GB decoded
# streaming writers put a placeholder size in the data chunk (espeak-ng --stdout: 0x7ffff000)
STREAMING = 0x7FFF0000
# libsndfile's log line for a WAV data chunk longer than the file ("data : 64000 (should be
# 31978)"); it writes "should be" only when the header claims more than the file holds
SHORT_DATA = re.compile(r"^\s*data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)


class BadAudio(Exception):
    """A file that is not usable audio (the reason is the message)."""


@dataclass(frozen=True)
class Info:
    """What ``check`` found: the file's own rate and channels, and the frames it decoded."""

    rate: int
    channels: int
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / self.rate


@dataclass(frozen=True)
class Notes:
    """The conversions ``load`` made: a down-mix of more than one channel, a resample from the
    file's rate, a cut at ``max_seconds``."""

    stereo: bool
    resampled_from: int | None
    cut: bool


def _sf() -> Any:
    import soundfile

    return soundfile


def _reason(err: Exception) -> str:
    """libsndfile's message without its decoration ("Error : ", "Error opening 'x': ", ".")."""
    text = getattr(err, "error_string", None) or str(err) or type(err).__name__
    return text.strip().removeprefix("Error : ").rstrip(".")


def _open(path: str) -> Any:
    """An open ``soundfile.SoundFile``, or ``BadAudio`` for a file that has no usable header."""
    sf = _sf()
    file = Path(path)
    if not file.is_file():
        raise BadAudio("file not found")
    if file.stat().st_size == 0:
        raise BadAudio("empty file (0 bytes)")
    try:
        handle = sf.SoundFile(path)
    except sf.SoundFileError as err:
        # a text file, an unknown format, a cut FLAC/OGG header: "Format not recognised",
        # "Supported file format but file is malformed"
        raise BadAudio(f"not an audio file soundfile can read ({_reason(err)})") from None
    # A truncated WAV decodes without an error: libsndfile reads the frames the file holds
    # (a 2 s 16 kHz PCM_16 WAV cut to half its 64044 bytes: 15989 of 32000 frames, and
    # sf.info reports 15989), so the shortfall is found in its header log instead
    short = SHORT_DATA.search(handle.extra_info)
    if short and int(short[1]) < STREAMING:
        handle.close()
        raise BadAudio(
            f"truncated (the header says {short[1]} bytes of samples, the file holds {short[2]})"
        )
    return handle


def check(path: str) -> Info:
    """The file's rate, channels and decoded frames, after decoding it whole; ``BadAudio``
    naming what is wrong otherwise."""
    sf = _sf()
    with _open(path) as f:
        frames = 0
        try:
            # A truncated FLAC opens (its header says 32000 frames) and fails only when decoded:
            # cut at every 37th byte of a 20171-byte 2 s clip, all 545 cuts raised in read()
            # ("flac decoder lost sync" 471, "Internal psf_fseek() failed" 72) and none
            # returned short; a cut OGG fails at open ("file is malformed")
            while len(block := f.read(BLOCK, dtype="float32", always_2d=True)):
                if not np.isfinite(block).all():  # float WAVs can hold NaN: a NaN loss later
                    raise BadAudio("samples that are not numbers (NaN or infinity)")
                frames += len(block)
        except sf.SoundFileError as err:
            raise BadAudio(f"truncated or damaged ({_reason(err)})") from None
        if frames == 0:
            raise BadAudio("no audio samples (0 frames)")
        return Info(rate=f.samplerate, channels=f.channels, frames=frames)


def _ratio(orig: int, rate: int) -> tuple[int, int]:
    g = gcd(rate, orig)
    return rate // g, orig // g


def _limit(rate: int, max_seconds: float | None) -> int | None:
    """The most samples a clip keeps at ``rate`` (None: no limit)."""
    return None if max_seconds is None else int(max_seconds * rate)


def _kept(limit: int, up: int, down: int) -> int:
    """The most source frames whose resampled length (resample_poly's: ceil(n * up / down))
    fits in ``limit``: a file with more is cut."""
    return limit * down // up


def notes_of(info: Info, rate: int, max_seconds: float | None) -> Notes:
    """The notes ``load(path, rate, max_seconds)`` returns, from ``check(path)``'s ``Info``."""
    up, down = _ratio(info.rate, rate)
    limit = _limit(rate, max_seconds)
    return Notes(
        stereo=info.channels > 1,
        resampled_from=info.rate if info.rate != rate else None,
        cut=limit is not None and info.frames > _kept(limit, up, down),
    )


def load(path: str, rate: int, max_seconds: float | None) -> tuple[np.ndarray, Notes]:
    """``path`` as float32 mono samples at ``rate``, at most ``max_seconds`` long, and the
    conversions made; ``BadAudio`` if it cannot be read (a file changed since ``check``)."""
    from scipy.signal import resample_poly

    sf = _sf()
    limit = _limit(rate, max_seconds)
    with _open(path) as f:
        orig, channels = f.samplerate, f.channels
        up, down = _ratio(orig, rate)
        wanted = -1  # all of it, unless a cut is due
        if limit is not None:
            # a 1-hour file is not decoded to keep 30 s: read the kept frames plus the reach of
            # resample_poly's filter (10 * max(up, down) taps at the up rate), so the kept
            # samples equal those of resampling the whole file (the tests compare them exactly)
            wanted = _kept(limit, up, down) + 10 * max(up, down) // up + 2
        try:
            data = f.read(wanted, dtype="float32", always_2d=True)
        except sf.SoundFileError as err:
            raise BadAudio(f"truncated or damaged ({_reason(err)})") from None
    if len(data) == 0:
        raise BadAudio("no audio samples (0 frames)")
    cut = limit is not None and len(data) > _kept(limit, up, down)
    samples = data.mean(axis=1) if channels > 1 else data[:, 0]
    if orig != rate:
        samples = resample_poly(samples, up, down)
    if cut:
        samples = samples[:limit]
    notes = Notes(stereo=channels > 1, resampled_from=orig if orig != rate else None, cut=cut)
    return np.ascontiguousarray(samples, dtype=np.float32), notes
