"""The two install profiles and the versions their lock files pin.

``ort``: onnxruntime-training 1.19.2 with the torch 2.6 it was built for (requirements/lock.txt
on Python 3.11, lock-py312.txt on 3.12): every backend. ``current``: today's torch, transformers,
onnx and onnxruntime (inference only; requirements/lock-current.txt): backend.name=torch, export
and inference. Which one this is follows from whether ORT training is installed. Torch-free:
only package metadata and the lock files are read.
"""

from __future__ import annotations

import re
from pathlib import Path

import ortft
from ortft.env import ort_training

ORT, CURRENT = "ort", "current"
PROFILES = (ORT, CURRENT)
# the Pythons each profile's lock installs on (ORT training has wheels for 3.11 and 3.12 only)
PYTHONS = {ORT: ort_training.PYTHONS, CURRENT: ((3, 11), (3, 12), (3, 13))}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")


class NoLockFile(LookupError):
    """Neither the package nor its source checkout holds the profile's lock file."""


def active() -> str:
    """``ort`` where ONNX Runtime training is installed, else ``current``."""
    return ORT if ort_training.installed() is not None else CURRENT


def lock_names(profile: str, python: tuple[int, int] = (3, 11)) -> list[str]:
    """The requirement files that pin ``profile``'s stack on ``python``."""
    if profile == CURRENT:
        return ["lock-current.txt"]
    if profile != ORT:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if tuple(python) >= (3, 12):
        # set-up installs torch-ort there from its own file: it declares onnxruntime-training,
        # which has no cp312 wheel (the -cpu build stands in)
        return ["lock-py312.txt", "torch-ort.txt"]
    return ["lock.txt"]


def requirement_dirs() -> list[Path]:
    """Where the lock files are: inside the package (a wheel carries them there), then the
    source checkout's requirements/ (an editable install)."""
    package = Path(ortft.__file__).resolve().parent
    return [package / "requirements", package.parent / "requirements"]


def lock_file(profile: str, python: tuple[int, int] = (3, 11)) -> Path | None:
    """The profile's main lock file, or None when neither place has it."""
    name = lock_names(profile, python)[0]
    return next((d / name for d in requirement_dirs() if (d / name).is_file()), None)


def pins(profile: str, python: tuple[int, int] = (3, 11)) -> dict[str, str]:
    """{distribution: version} as the profile's lock pins it; names normalised (lower case,
    ``-``). Raises NoLockFile when the lock is in neither place."""
    main = lock_file(profile, python)
    if main is None:
        where = " or ".join(str(d) for d in requirement_dirs())
        raise NoLockFile(f"no {lock_names(profile, python)[0]} in {where}")
    found: dict[str, str] = {}
    for name in lock_names(profile, python):
        path = main.parent / name
        if path.is_file():
            found.update(parse(path.read_text()))
    return found


def parse(text: str) -> dict[str, str]:
    """The ``name==version`` lines of a requirements file; comments and options are skipped."""
    found = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            found[normalise(match.group(1))] = match.group(2)
    return found


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
