"""Write the spoken-digit clips the speech-recognition recipes train on, or check them.

Source: Debian's espeak-ng (1.51) speaks strings of 3 to 5 digit words ("three one four one"),
drawn with a fixed numpy seed, in 8 English voices at 3 speaking rates. espeak-ng writes
22050 Hz 16-bit WAV; each clip is resampled to 16 kHz (resample_poly 320/441) and written as
mono 16-bit FLAC with soundfile.

Output, under recipes/data/speech/:
    clips/train-0000.flac ...         16 kHz mono PCM_16 FLAC
    train.jsonl, eval.jsonl           {"audio": "clips/...", "text": ..., "voice": ..., "rate": ...}
                                      one object a line; audio paths relative to the jsonl file
    MANIFEST.sha256                   `sha256  clips/x.flac` per clip (sha256sum -c reads it)
    README.md                         source, licence, this command, the split rule

Split (held out twice over): eval's voice/rate pairs (EVAL_PAIRS) are never in train, and no
eval digit string is in train (eval strings are drawn first, train draws skip them).

espeak-ng's audio changes across its versions, so `--check` does not regenerate: it checks that
the committed lists and clips agree (every clip listed exists, decodes at 16 kHz mono, is not
empty, matches MANIFEST.sha256; the split is disjoint) and exits 1 with one line on the first
problem.
    python scripts/make-speech.py [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

OUT = Path(__file__).resolve().parent.parent / "recipes" / "data" / "speech"
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SEED = 28
RATE = 16000
# espeak-ng 1.51 voices that speak here (the mbrola ones need voice files Debian does not
# install: "Cannot find MBROLA voice file"); "+f2" etc. are its voice variants. en-gb ignores a
# variant (en-gb+f3 wrote the same bytes as en-gb), so each voice is checked to sound distinct
VOICES = (
    "en-us",
    "en-us+f2",
    "en-gb",
    "en-gb-scotland+f3",
    "en-gb-x-rp",
    "en-029+f4",
    "en-gb-x-gbclan",
    "en-us-nyc+m3",
)
RATES = (130, 160, 190)  # words per minute (-s); espeak-ng's default is 175
EVAL_PAIRS = (("en-us+f2", 190), ("en-gb-scotland+f3", 130), ("en-029+f4", 160), ("en-gb", 160))
PER_TRAIN_PAIR, PER_EVAL_PAIR = 12, 15  # 20 pairs x 12 = 240 train, 4 x 15 = 60 eval
KEYS = {"audio", "text", "voice", "rate"}


def pairs(split: str) -> list[tuple[str, int]]:
    every = [(v, r) for v in VOICES for r in RATES]
    return [p for p in every if (p in EVAL_PAIRS) == (split == "eval")]


def draw_texts(rng: np.random.Generator, n: int, taken: set[str]) -> list[str]:
    """``n`` distinct digit strings of 3 to 5 words, none in ``taken`` (which grows)."""
    out: list[str] = []
    while len(out) < n:
        text = " ".join(WORDS[d] for d in rng.integers(0, 10, int(rng.integers(3, 6))))
        if text not in taken:
            taken.add(text)
            out.append(text)
    return out


def plan() -> dict[str, list[dict]]:
    """Every clip's row, by split: eval's strings are drawn first, train's skip them."""
    rng, taken = np.random.default_rng(SEED), set[str]()
    rows: dict[str, list[dict]] = {}
    for split, per in (("eval", PER_EVAL_PAIR), ("train", PER_TRAIN_PAIR)):
        combos = pairs(split)
        texts = draw_texts(rng, per * len(combos), taken)
        rows[split] = []
        for i, text in enumerate(texts):
            voice, rate = combos[i % len(combos)]  # round robin: the pairs interleave
            audio = f"clips/{split}-{i:04d}.flac"
            rows[split].append({"audio": audio, "text": text, "voice": voice, "rate": rate})
    return rows


def synthesize(text: str, voice: str, rate: int, out_path: Path) -> float:
    """Speak ``text`` into ``out_path`` (16 kHz mono PCM_16 FLAC); its length in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "out.wav"
        cmd = ["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(wav), text]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not wav.is_file():
            sys.exit(f"make-speech: {' '.join(cmd)} failed: {done.stderr.strip()}")
        samples, orig = sf.read(wav, dtype="float32")
    if orig != 22050 or samples.ndim != 1 or not len(samples):
        sys.exit(f"make-speech: espeak-ng wrote {samples.shape} at {orig} Hz, not 22050 Hz mono")
    resampled = resample_poly(samples, 320, 441)  # 16000 / 22050 reduced by their gcd (50)
    # the filter can overshoot a full-scale peak: clip before the 16-bit conversion (it
    # clipped 6 samples of 8.3 million, in 2 of the 300 clips, all en-gb-x-gbclan at 130)
    pcm = np.clip(np.round(resampled * 32768.0), -32768, 32767).astype(np.int16)
    sf.write(out_path, pcm, RATE, format="FLAC", subtype="PCM_16")
    return len(pcm) / RATE


def check_voices() -> None:
    """Every voice speaks, and no two sound the same (an ignored variant would)."""
    heard: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for voice in VOICES:
            synthesize("zero one two", voice, 160, Path(tmp) / "probe.flac")
            digest = hashlib.sha256((Path(tmp) / "probe.flac").read_bytes()).hexdigest()
            if digest in heard:
                sys.exit(f"make-speech: voice {voice} sounds the same as {heard[digest]}")
            heard[digest] = voice


def espeak_version() -> str:
    if shutil.which("espeak-ng") is None:
        sys.exit(
            "make-speech: espeak-ng is not installed (Debian/Ubuntu: apt-get install espeak-ng)"
        )
    out = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    return out.split("Data at")[0].split(":")[-1].strip()  # "eSpeak NG text-to-speech: 1.51"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_all(out: Path) -> None:
    version = espeak_version()
    check_voices()
    if (out / "clips").exists():
        shutil.rmtree(out / "clips")  # no clip of an earlier plan stays behind
    (out / "clips").mkdir(parents=True)
    rows, seconds = plan(), {}
    for split, split_rows in rows.items():
        seconds[split] = sum(
            synthesize(r["text"], r["voice"], r["rate"], out / r["audio"]) for r in split_rows
        )
        with open(out / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in split_rows)
    listed = sorted(r["audio"] for split_rows in rows.values() for r in split_rows)
    manifest = "".join(f"{sha256(out / p)}  {p}\n" for p in listed)
    (out / "MANIFEST.sha256").write_text(manifest)
    (out / "README.md").write_text(readme(version, rows, seconds))


def readme(version: str, rows: dict[str, list[dict]], seconds: dict[str, float]) -> str:
    n_train, n_eval = len(rows["train"]), len(rows["eval"])
    voices = ", ".join(f"`{v}`" for v in VOICES)
    held = ", ".join(f"`{v}` at {r}" for v, r in EVAL_PAIRS)
    n_pairs = len(VOICES) * len(RATES)
    return f"""\
# speech: spoken digit strings, 16 kHz mono FLAC

{n_train + n_eval} synthetic clips of 3 to 5 spoken digits ("three one four one") with a
held-out split: `train.jsonl` ({n_train} clips, {seconds["train"] / 60:.1f} min) and
`eval.jsonl` ({n_eval} clips, {seconds["eval"] / 60:.1f} min). One JSON object a line, e.g.
`{{"audio": "clips/train-0000.flac", "text": "one seven two", "voice": "en-us", "rate": 130}}`:
`audio` is relative to the jsonl file, `text` is the lowercase words separated by spaces.

**Source.** Spoken by eSpeak NG {version} (Debian's `espeak-ng` package,
https://github.com/espeak-ng/espeak-ng), a formant synthesizer: no recorded voice is in
these clips. Voices (`+f2` etc. are espeak-ng's voice variants):
{voices}.
Rates (`-s`, words per minute): {", ".join(str(r) for r in RATES)}. espeak-ng's 22050 Hz
16-bit WAV is resampled to 16 kHz (scipy `resample_poly`, 320/441) and written as mono 16-bit
FLAC with soundfile.

**Licence.** espeak-ng is GPL-3.0-or-later; its documentation (Debian's
/usr/share/doc/espeak-ng) says nothing about the audio it produces. The GPL version 3 says
(section 2): "The output from running a covered work is covered by this License only if the
output, given its content, constitutes a covered work." These clips are espeak-ng's audio for
digit strings drawn by ortft. The clips, transcripts and lists were made by ortft's
`scripts/make-speech.py` and are dedicated to the public domain under CC0 1.0, as the other
synthetic files in `recipes/data`: https://creativecommons.org/publicdomain/zero/1.0/

**How these files were made.**

    python scripts/make-speech.py           # writes this folder (needs espeak-ng)
    python scripts/make-speech.py --check   # checks the lists, clips and MANIFEST.sha256

espeak-ng's audio changes across its versions, so `--check` does not regenerate it.

**Split.** Held out twice over. The voice/rate pairs {held} are only in `eval.jsonl`
({PER_EVAL_PAIR} clips each); the other {n_pairs - len(EVAL_PAIRS)} of the {n_pairs} pairs
are only in `train.jsonl` ({PER_TRAIN_PAIR} clips each), so each eval voice and each rate is
also in train, at other pairs. No digit string is in both: with numpy's `default_rng({SEED})`
the {n_eval} eval strings are drawn first, then the {n_train} train strings, skipping any
drawn before (all {n_train + n_eval} are distinct).
"""


def read_rows(out: Path, split: str) -> list[dict]:
    path = out / f"{split}.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} is missing")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        row = json.loads(line) if line.strip() else None
        if not isinstance(row, dict) or set(row) != KEYS:
            raise ValueError(f"{path}:{n}: not an object with keys {sorted(KEYS)}")
        if not all(isinstance(row[k], str) for k in ("audio", "text", "voice")):
            raise ValueError(f"{path}:{n}: audio, text and voice must be strings")
        if not 3 <= len(row["text"].split()) <= 5 or set(row["text"].split()) - set(WORDS):
            raise ValueError(f"{path}:{n}: text {row['text']!r} is not 3 to 5 digit words")
        rows.append(row)
    return rows


def check_clip(out: Path, rel: str) -> None:
    path = out / rel
    if not path.is_file():
        raise ValueError(f"{path} is missing")
    try:
        samples, rate = sf.read(path, dtype="float32", always_2d=True)
    except sf.SoundFileError as err:
        raise ValueError(f"{path} does not decode ({err})") from None
    if rate != RATE or samples.shape[1] != 1 or len(samples) == 0:
        raise ValueError(
            f"{path}: {samples.shape[1]} channel(s), {len(samples)} frames at {rate} Hz"
        )


def problem(out: Path) -> str | None:
    """The first thing wrong with the committed folder, or None."""
    try:
        rows = {split: read_rows(out, split) for split in ("train", "eval")}
        for split_rows in rows.values():
            for row in split_rows:
                check_clip(out, row["audio"])
    except (ValueError, json.JSONDecodeError) as err:
        return str(err)
    texts = {s: {r["text"] for r in rs} for s, rs in rows.items()}
    voiced = {s: {(r["voice"], r["rate"]) for r in rs} for s, rs in rows.items()}
    if both := texts["train"] & texts["eval"]:
        return f"digit string {sorted(both)[0]!r} is in train.jsonl and eval.jsonl"
    if both := voiced["train"] & voiced["eval"]:
        return f"voice/rate {sorted(both)[0]} is in train.jsonl and eval.jsonl"
    listed = [r["audio"] for rs in rows.values() for r in rs]
    if twice := sorted({p for p in listed if listed.count(p) > 1}):
        return f"{twice[0]} is listed twice"
    on_disk = {f"clips/{p.name}" for p in (out / "clips").iterdir()}
    if extra := on_disk - set(listed):
        return f"{out / sorted(extra)[0]} is in no jsonl file"
    return manifest_problem(out, listed)


def manifest_problem(out: Path, listed: list[str]) -> str | None:
    """The first clip MANIFEST.sha256 does not vouch for, or None."""
    path = out / "MANIFEST.sha256"
    if not path.is_file():
        return f"{path} is missing"
    sums = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        digest, _, rel = line.partition("  ")
        if len(digest) != 64 or not rel:
            return f"{path}:{n}: not `sha256  path`"
        sums[rel] = digest
    if missing := sorted(set(listed) - set(sums)):
        return f"{out / missing[0]} is not in MANIFEST.sha256"
    if extra := sorted(set(sums) - set(listed)):
        return f"MANIFEST.sha256 lists {extra[0]}, which no jsonl file lists"
    for rel in sorted(listed):
        if sha256(out / rel) != sums[rel]:
            return f"{out / rel} does not match MANIFEST.sha256"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the clips under " + str(OUT))
    args = parser.parse_args()
    if not args.check:
        write_all(OUT)
        print(OUT)
        return
    found = problem(OUT)
    if found:
        print(
            f"make-speech --check: {found}; rerun: python scripts/make-speech.py", file=sys.stderr
        )
        sys.exit(1)
    n = sum(len((OUT / f"{s}.jsonl").read_text().splitlines()) for s in ("train", "eval"))
    print(f"make-speech --check: {OUT}: {n} clips agree with their lists and MANIFEST.sha256")


if __name__ == "__main__":
    main()
