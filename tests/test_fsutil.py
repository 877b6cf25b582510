"""ortft.core.fsutil: atomic files and folders (replace without a gap, clean up on failure)."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest

from ortft.core import fsutil


def _old_folder(tmp_path: Path) -> Path:
    final = tmp_path / "final"
    final.mkdir()
    (final / "model.bin").write_text("old weights")
    (final / "only-old.txt").write_text("x")
    return final


def test_atomic_dir_creates_a_new_folder(tmp_path: Path) -> None:
    final = tmp_path / "deep" / "out"
    with fsutil.atomic_dir(final) as tmp:
        assert tmp.name == f".out.tmp-{os.getpid()}" and tmp.parent == final.parent
        (tmp / "a.txt").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
    assert (final / "a.txt").read_text() == "a" and (final / "sub" / "b.txt").read_text() == "b"
    assert sorted(p.name for p in final.parent.iterdir()) == ["out"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "set-aside"])
def test_replace_swaps_in_the_new_content_and_drops_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:  # the fallback of systems without RENAME_EXCHANGE
        monkeypatch.setattr(fsutil, "_exchange", lambda a, b: False)
    final = _old_folder(tmp_path)
    with fsutil.atomic_dir(final) as tmp:
        (tmp / "model.bin").write_text("new weights")
    assert (final / "model.bin").read_text() == "new weights"
    assert not (final / "only-old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temp, no old copy left


def test_renameat2_exchange_is_used_on_linux(tmp_path: Path) -> None:
    assert os.uname().sysname == "Linux"  # ortft supports Linux only (README)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("from a")
    (b / "x").write_text("from b")
    assert fsutil._exchange(a, b) is True
    assert (a / "x").read_text() == "from b" and (b / "x").read_text() == "from a"


def test_old_folder_stays_readable_while_the_new_one_is_written(tmp_path: Path) -> None:
    """A reader polling ``final`` during a replace always finds it, whole (old or new)."""
    final = _old_folder(tmp_path)
    seen: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append((final / "model.bin").read_text())
            except OSError:
                seen.append("MISSING")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(200):
            with fsutil.atomic_dir(final, fsync=False) as tmp:
                (tmp / "model.bin").write_text(f"weights {i}")
    finally:
        stop.set()
        thread.join()
    assert "MISSING" not in seen and "" not in seen
    assert (final / "model.bin").read_text() == "weights 199"


def test_a_failing_writer_leaves_the_old_folder_and_no_temp(tmp_path: Path) -> None:
    final = _old_folder(tmp_path)
    with pytest.raises(OSError, match="No space left"), fsutil.atomic_dir(final) as tmp:
        (tmp / "model.bin").write_text("half of the new")
        assert (final / "model.bin").read_text() == "old weights"  # untouched while writing
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (final / "model.bin").read_text() == "old weights"
    assert (final / "only-old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_keyboard_interrupt_also_removes_the_temp(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), fsutil.atomic_dir(final) as tmp:
        (tmp / "x").write_text("x")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "set-aside"])
def test_a_failing_swap_leaves_the_old_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    final = _old_folder(tmp_path)
    real_replace = os.replace

    def no_space(*_args: object) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    def replace(src: object, dst: object) -> None:
        if ".tmp-" in str(src):  # the new folder's rename in; setting the old aside works
            no_space()
        real_replace(src, dst)

    if exchange:
        monkeypatch.setattr(fsutil, "_exchange", no_space)
    else:
        monkeypatch.setattr(fsutil, "_exchange", lambda a, b: False)
        monkeypatch.setattr(fsutil.os, "replace", replace)
    with pytest.raises(OSError, match="No space left"), fsutil.atomic_dir(final) as tmp:
        (tmp / "model.bin").write_text("new weights")
    assert (final / "model.bin").read_text() == "old weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_write_json_atomic_is_valid_json_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text("{ torn")
    fsutil.write_json_atomic(path, {"steps": 3, "path": tmp_path, "nested": {"x": [1, 2]}})
    data = json.loads(path.read_text())
    assert data == {"steps": 3, "path": str(tmp_path), "nested": {"x": [1, 2]}}
    assert path.read_text().endswith("}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_failing_file_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}\n')
    with pytest.raises(TypeError), fsutil.atomic_file(path) as fh:
        fh.write('{"new": ')
        raise TypeError("serializer failed half-way")
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_atomic_file_binary_keeps_the_name(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "cache.npz"
    with fsutil.atomic_file(path, "wb") as fh:
        np.savez(fh, a=np.arange(3))
    with np.load(path) as z:
        assert z["a"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.npz"]


def test_write_text_atomic(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    fsutil.write_text_atomic(path, "héllo\n")
    assert path.read_text(encoding="utf-8") == "héllo\n"


def test_remove_stale_removes_matching_temps_only(tmp_path: Path) -> None:
    stale_dir = tmp_path / ".step-000004.tmp-12345"
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"partial")
    stale_file = tmp_path / ".step-000006.tmp-777"
    stale_file.write_text("x")
    keep = tmp_path / "step-000002"
    keep.mkdir()
    other = tmp_path / ".final.tmp-1"
    other.mkdir()
    removed = fsutil.remove_stale(tmp_path, ".step-*.tmp-*")
    assert sorted(p.name for p in removed) == [stale_dir.name, stale_file.name]
    assert not stale_dir.exists() and not stale_file.exists()
    assert keep.exists() and other.exists()
    assert fsutil.remove_stale(tmp_path / "missing", "*") == []
