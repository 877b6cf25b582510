"""The files ``ortft predict --input`` names, for a family whose rows are files (images, audio).

``--input`` is a text file of paths, one per line, relative to the file's folder (``-``: stdin,
relative to the working directory; blank lines skipped); a folder: every file under it with one
of the family's extensions (hidden files and folders left out), recursively, sorted by path; or
one such file. Each ``Item`` keeps where it was named, so the family's check of every file
before the first result can stop the command with one line, ``paths.txt:3: imgs/x.png: file
not found`` (a folder's file: its path alone).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ortft.core.errors import InputError


@dataclass(frozen=True)
class Item:
    """One file to predict: where it was named (for errors), what ``input`` shows, the file."""

    where: str  # "paths.txt:3: imgs/x.png", or a folder's file path
    shown: str
    path: Path


def read_list(stream: TextIO, name: str, base: Path, kind: str) -> list[Item]:
    """One item per non-blank line of ``stream`` (named ``name``), paths relative to ``base``
    (``kind``: what the files are, for the message)."""
    items = []
    not_text = InputError(
        f"{name}: not a text file of {kind} paths (give one path per line, or a folder)"
    )
    try:
        for n, line in enumerate(stream, 1):
            shown = line.strip()
            if "\x00" in shown or _undecoded(shown):  # e.g. an image piped into stdin
                raise not_text
            if shown:
                path = (base / shown).expanduser()
                items.append(Item(f"{name}:{n}: {shown}", shown, path))
    except UnicodeDecodeError:  # a file opened as UTF-8
        raise not_text from None
    return items


def _undecoded(text: str) -> bool:
    """Whether ``text`` holds bytes that were not UTF-8 (stdin decodes them to surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_folder(folder: Path, extensions: frozenset[str], kind: str) -> list[Item]:
    """Every ``kind`` file (by extension) under ``folder``, sorted by its path under it."""
    found = sorted(
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.suffix.lower() in extensions and p.is_file()
    )
    rels = [r for r in found if not any(part.startswith(".") for part in r.parts)]
    if not rels:
        raise InputError(f"{folder}: no {kind} files ({', '.join(sorted(extensions))}) in it")
    return [Item(str(folder / r), str(folder / r), folder / r) for r in rels]


def read(input_path: str, extensions: frozenset[str], kind: str) -> list[Item]:
    """The files ``--input`` names: a list file, stdin (``-``), a folder or one file
    (``extensions``: what a ``kind`` file is called, e.g. the family's image formats)."""
    if input_path == "-":
        return read_list(sys.stdin, "<stdin>", Path.cwd(), kind)
    path = Path(input_path)
    if path.is_dir():
        return read_folder(path, extensions, kind)
    if not path.is_file():
        raise InputError(f"{path}: input file or folder not found")
    if path.suffix.lower() in extensions:  # one file named directly
        return [Item(str(path), str(path), path)]
    with open(path, encoding="utf-8") as fh:
        return read_list(fh, str(path), path.parent, kind)
