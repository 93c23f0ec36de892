r"""Per-shard CPU time of `scehr score --shard I/N` for N = 1, 4, 16 on one large input of real
stays, side by side in one run, with the fixed start-up (interpreter, imports, model load)
measured apart.

    scehr data convert-physionet2012 --feature-set physionet2012-full \
        ../shared/data/physionet2012 data/p12-full
    .venv/bin/python -m benchmarks.shard_cpu --split data/p12-full/in-hospital-mortality/test \
        [--copies 16] [--shards 1 4 16] [--all-shards]

The split must be converted with the feature set of the model scored (the default mortality
model 1.2.0 reads physionet2012-full), else most stays are refused rows and the figures are
those of validation errors, not of scoring.

The input: the 4,000 set-c stays as API payloads, repeated `--copies` times (16: 64,000 stays)
with ids made unique (`<stay>-<copy>`), in one JSON Lines file. Each shard is its own
`scehr score` process with one ONNX Runtime thread, run one at a time; its CPU time (user +
system, from getrusage of the child) is what a pod with one core would spend. Start-up: the
median of three runs on an empty input. By default shards 0 and N-1 of each N are run (the
last shard also counts the lines before its part); `--all-shards` runs every one.

Target: shard I/16's CPU beyond start-up <= 1.2 x (the whole run's beyond start-up) / 16.
CPU time is less sensitive to other jobs than wall time; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scehr.service.offline_scoring import read_benchmark  # noqa: E402

SPLIT = REPO / "data" / "physionet2012-benchmark" / "in-hospital-mortality" / "test"


def build_input(split: Path, copies: int, path: Path) -> int:
    """The split's stays as payload lines, `copies` times, ids made unique; returns the count."""
    stays = [(key, payload) for key, payload, _ in read_benchmark(split)
             if not isinstance(payload, list)]
    n = 0
    with open(path, "w") as f:
        for copy in range(copies):
            for key, payload in stays:
                f.write(json.dumps({**payload, "id": f"{key}-{copy}"}, separators=(",", ":")))
                f.write("\n")
                n += 1
    return n


def cpu_of(args: list[str]) -> float:
    """CPU seconds (user + system) of one child process running `scehr score ARGS`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "scehr.cli", "score", *args], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    ap.add_argument("--split", type=Path, default=SPLIT)
    ap.add_argument("--copies", type=int, default=16)
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--all-shards", action="store_true")
    args = ap.parse_args()
    if not (args.split / "listfile.csv").is_file():
        raise SystemExit(f"{args.split} missing: run scehr data convert-physionet2012 first")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = work / "stays.jsonl"
        total = build_input(args.split, args.copies, src)
        print(f"input: {total} stays ({src.stat().st_size / 1e6:.0f} MB JSON Lines), "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        common = ["--model-dir", str(args.model_dir), "--device", "cpu", "--threads", "1",
                  "--quiet"]
        (work / "empty.jsonl").write_text("")
        startup = statistics.median(
            cpu_of(["mortality", str(work / "empty.jsonl"), "--out", str(work / f"e{k}.jsonl"),
                    *common]) for k in range(3))
        print(f"fixed start-up (empty input, median of 3): {startup:.2f} CPU-s", flush=True)
        whole_beyond = None
        print(f"{'N':>3} {'shard':>6} {'stays':>7} {'CPU s':>8} {'beyond start-up':>16} "
              f"{'x (whole/N)':>12} {'stays/CPU-s':>12} {'load':>5}")
        for n in args.shards:
            for i in range(n) if args.all_shards else sorted({0, n - 1}):
                out = work / f"n{n}-part{i}.jsonl"
                cpu = cpu_of(["mortality", str(src), "--out", str(out), "--shard", f"{i}/{n}",
                              *common])
                stays = out.read_bytes().count(b"\n")
                beyond = cpu - startup
                if n == 1:
                    whole_beyond = beyond
                ratio = (f"{beyond / (whole_beyond / n):.3f}" if whole_beyond else "-")
                print(f"{n:>3} {f'{i}/{n}':>6} {stays:>7} {cpu:>8.2f} {beyond:>16.2f} "
                      f"{ratio:>12} {stays / beyond:>12.0f} {os.getloadavg()[0]:>5.1f}",
                      flush=True)
                out.unlink()
        if whole_beyond is not None and 16 in args.shards:
            print(f"target: shard I/16 beyond start-up <= 1.2 x {whole_beyond / 16:.2f} = "
                  f"{1.2 * whole_beyond / 16:.2f} CPU-s")


if __name__ == "__main__":
    main()
