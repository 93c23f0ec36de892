"""The part of an input file that shard I of N reads, so a shard's work falls as 1/N.

Shards are contiguous parts of the input: byte ranges moved to line starts for line-based files
(JSON Lines, long-form CSV), row ranges for a benchmark listfile, row groups for Parquet. A line
(row) belongs to the part its first byte (its index) falls in, so the N parts cover every line
exactly once, whatever N, on any machine, without reading the rest of the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

BLOCK = 1 << 20


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def index_range(count: int, shard: tuple[int, int]) -> range:
    """Items [count*I/N, count*(I+1)/N): the N ranges partition range(count)."""
    i, n = shard
    return range(count * i // n, count * (i + 1) // n)


def _line_start_at_or_after(f: BinaryIO, offset: int, floor: int) -> int:
    """The offset of the first line that starts at or after `offset` (never before `floor`)."""
    if offset <= floor:
        return floor
    f.seek(offset - 1)
    f.readline()  # the rest of the line holding byte offset-1 (just b"\n" when it ends there)
    return f.tell()


def byte_range(f: BinaryIO, size: int, shard: tuple[int, int], floor: int = 0
               ) -> tuple[int, int]:
    """[start, end) of part I of N of the bytes after `floor` (a header), on line starts."""
    i, n = shard
    span = size - floor
    return (_line_start_at_or_after(f, floor + span * i // n, floor),
            _line_start_at_or_after(f, floor + span * (i + 1) // n, floor))


def count_lines(f: BinaryIO, end: int) -> int:
    """Newlines in the first `end` bytes: the 1-based number of the line at `end` minus one.
    A memchr-speed scan, so a late shard still names lines as a whole-file run does."""
    f.seek(0)
    lines, left = 0, end
    while left > 0:
        block = f.read(min(BLOCK, left))
        if not block:
            break
        lines += block.count(b"\n")
        left -= len(block)
    return lines


def lines_in(path: Path, shard: tuple[int, int], header: bool = False
             ) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) of part I of N of a line-based file; with `header`,
    line 1 is skipped (the caller reads it) and the parts split the lines after it."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        floor = len(f.readline()) if header else 0
        start, end = byte_range(f, size, shard, floor)
        number = count_lines(f, start) if shard[0] else (1 if header else 0)
        f.seek(start)
        pos = start
        while pos < end:
            line = f.readline()
            if not line:
                break
            number += 1
            pos += len(line)
            yield number, line


def line_before(path: Path, offset: int) -> bytes:
    """The whole line that ends just before `offset` (a line start); b"" at offset 0."""
    if offset <= 0:
        return b""
    with open(path, "rb") as f:
        back = offset - 1  # the "\n" ending that line
        start = back
        while start > 0:
            step = min(BLOCK, start)
            f.seek(start - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                start = start - step + nl + 1
                break
            start -= step
        f.seek(start)
        return f.read(offset - start)
