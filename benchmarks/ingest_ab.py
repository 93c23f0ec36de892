"""Ingest throughput before/after a change, interleaved in one process on the same stays.

    .venv/bin/python benchmarks/ingest_ab.py --before c149ada [--stays 300] [--passes 15]

Loads `schemas/ingest.py` as it was at git revision `--before` next to the current one and
times both on the stay sets of `ingest_throughput.py`, alternating which goes first in each
pass; the best pass of each counts (on a shared machine the best is steadiest). Ratios are
after / before; they are what to compare, absolute numbers depend on the load.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO
from ingest_throughput import stay_sets

from scehr.schemas import ingest as after


def load_revision(rev: str) -> Any:
    source = subprocess.run(["git", "show", f"{rev}:schemas/ingest.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "ingest_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("ingest_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ingest_before"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def rate(fn: Callable[..., Any], stays: list[Any], fs: Any) -> float:
    t0 = time.perf_counter()
    for s in stays:
        fn([s], fs)
    return len(stays) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' ingest")
    ap.add_argument("--stays", type=int, default=300, help="stays per generated set")
    ap.add_argument("--passes", type=int, default=15, help="timed passes per implementation")
    args = ap.parse_args()
    before = load_revision(args.before)
    print(f"{'stays':32s} {'before/s':>9s} {'after/s':>9s}  ratio")
    for name, fs, stays in stay_sets(args.stays):
        stays = stays * (300 if len(stays) == 1 else 1)
        b, a = [], []
        for i in range(args.passes):
            pair = ((before, b), (after, a)) if i % 2 else ((after, a), (before, b))
            for mod, out in pair:
                out.append(rate(mod.ingest, stays, fs))
        print(f"{name:32s} {max(b):9.0f} {max(a):9.0f}  {max(a) / max(b):.3f}")


if __name__ == "__main__":
    sys.exit(main())
