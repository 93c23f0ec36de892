"""`scehr score` on the 4,000 PhysioNet 2012 set-c stays vs the HTTP service, and its throughput.

    scehr data convert-physionet2012 ../shared/data/physionet2012 data/physionet2012-benchmark
    .venv/bin/python -m benchmarks.score_vs_service [--shards 1 2]

1. Scores the test split with `scehr score` (one process, one ONNX Runtime thread, CPU) and
   sends the very same payloads to the service's batch route (in-process ASGI app, 256 stays
   per request): prints the max |risk| and |score| differences and alert disagreements.
2. Runs N `scehr score --shard I/N` processes at once (one thread each), as the chart's
   Indexed Job does, and prints the aggregate stays/s for each N.
Figures are printed, never asserted; on a shared machine they depend on its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scehr.schemas.payloads import Prediction  # noqa: E402
from scehr.service.app import create_app  # noqa: E402
from scehr.service.offline_scoring import CLASS_FIELDS, read_benchmark, score  # noqa: E402
from scehr.service.settings import Settings  # noqa: E402

SPLIT = REPO / "data" / "physionet2012-benchmark" / "in-hospital-mortality" / "test"


async def served(stays: list[tuple[str, dict]], model_dir: Path,
                 version: str | None = None) -> dict[str, dict]:
    pin = {"versions": {"mortality": version}} if version else {}
    app = create_app(Settings(model_dir=model_dir, device="cpu", tasks=["mortality"], **pin))
    out: dict[str, dict] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x",
                                     timeout=120) as client:
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.05)
            for a in range(0, len(stays), 256):
                part = stays[a:a + 256]
                r = await client.post("/predict/mortality/batch",
                                      json={"stays": [p for _, p in part]})
                r.raise_for_status()
                for (key, _), item in zip(part, r.json()["items"], strict=True):
                    if item.get("prediction") is None:
                        out[key] = None
                        continue
                    pred = Prediction.model_validate(item["prediction"])
                    out[key] = {c.label: {k: f(c) for k, f in CLASS_FIELDS.items()}
                                for c in pred.results}
    return out


def compare(model_dir: Path, work: Path) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    s = score("mortality", SPLIT, work / "scored.jsonl", model_dir=model_dir, device="cpu",
              threads=1, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = {}
    for line in (work / "scored.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[r["id"]] = r["results"] if r["status"] == "ok" else None
    stays = [(key, payload) for key, payload, _ in read_benchmark(SPLIT)]
    t0 = time.perf_counter()
    http = asyncio.run(served(stays, model_dir))
    http_wall = time.perf_counter() - t0
    assert rows.keys() == http.keys()
    worst = {"risk": 0.0, "score": 0.0}
    alerts = 0
    for key, want in http.items():
        if want is None or rows[key] is None:
            alerts += (want is None) != (rows[key] is None)  # an error on one side only
            continue
        for label, fields in want.items():
            got = rows[key][label]
            for k in worst:
                worst[k] = max(worst[k], abs(got[k] - fields[k]))
            alerts += got["alert"] != fields["alert"]
    print(f"stays: {len(rows)} ({s.scored} scored, {s.errors} with errors)")
    print(f"max |risk diff| {worst['risk']:.3g}, max |score diff| {worst['score']:.3g}, "
          f"alert or error-status disagreements {alerts}")
    print(f"scehr score, 1 process, 1 thread: {s.written / wall:.0f} stays/s wall ({wall:.1f} s "
          f"with model load), {s.written / cpu:.0f} stays per CPU-second")
    print(f"HTTP batch route in-process, 256 stays/request: {len(http) / http_wall:.0f} stays/s")


def shards(model_dir: Path, work: Path, counts: list[int]) -> None:
    for n in counts:
        t0 = time.perf_counter()
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        procs = [subprocess.Popen(
            [sys.executable, "-m", "scehr.cli", "score", "mortality", str(SPLIT), "--out",
             str(work / f"n{n}-part{i}.jsonl"), "--shard", f"{i}/{n}", "--threads", "1",
             "--device", "cpu", "--quiet", "--model-dir", str(model_dir)], cwd=REPO,
            stderr=subprocess.DEVNULL) for i in range(n)]
        assert all(p.wait() == 0 for p in procs)
        wall = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
        total = sum(len((work / f"n{n}-part{i}.jsonl").read_text().splitlines())
                    for i in range(n))
        print(f"N={n} shards at once: {total} stays in {wall:.1f} s = {total / wall:.0f} "
              f"stays/s in all, {total / wall / n:.0f} per process (start-up included); "
              f"{total / cpu:.0f} stays per CPU-second")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    ap.add_argument("--shards", type=int, nargs="*", default=[1, 2])
    args = ap.parse_args()
    if not (SPLIT / "listfile.csv").is_file():
        raise SystemExit(f"{SPLIT} missing: run scehr data convert-physionet2012 first")
    with tempfile.TemporaryDirectory() as tmp:
        compare(args.model_dir, Path(tmp))
        shards(args.model_dir, Path(tmp), args.shards)


if __name__ == "__main__":
    main()
