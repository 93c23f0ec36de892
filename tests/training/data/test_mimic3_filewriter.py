"""The extraction's threaded file writer: whole files, in any chunking, and errors that surface."""

from __future__ import annotations

from pathlib import Path

import pytest

from scehr.training.data.mimic3.filewriter import FileWriter


def test_files_hold_their_chunks_in_order(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    view = memoryview(data)
    with FileWriter(workers=3, max_pending=1000) as files:  # smaller than most files: no deadlock
        files.mkdirs([tmp_path / "a" / "b", tmp_path / "c"])
        for k in range(50):
            files.write(tmp_path / "a" / "b" / f"{k}.csv", b"head\n", view[:k * 7], view[k * 7:])
        files.write(tmp_path / "c" / "empty.csv")
    for k in range(50):
        assert (tmp_path / "a" / "b" / f"{k}.csv").read_bytes() == b"head\n" + data
    assert (tmp_path / "c" / "empty.csv").read_bytes() == b""


def test_rewrites_replace_old_content(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_bytes(b"a much longer old content\n")
    with FileWriter() as files:
        files.write(tmp_path / "x.csv", b"new\n")
    assert (tmp_path / "x.csv").read_bytes() == b"new\n"


def test_a_failed_write_is_raised(tmp_path: Path) -> None:
    files = FileWriter(workers=2)
    files.write(tmp_path / "missing-folder" / "x.csv", b"1\n")
    with pytest.raises(FileNotFoundError, match="missing-folder"):
        files.close()
