r"""Do a stay's results depend on which stays share its ONNX Runtime run? Measured on the 4,000
PhysioNet 2012 set-c stays, for each mortality model version given; the split must be
converted with the version's feature set (1.1.0: benchmark76-48h, the converter's default;
1.2.0: physionet2012-full), else most stays are refused and the figures cover few stays.

    scehr data convert-physionet2012 ../shared/data/physionet2012 data/p12-b17
    scehr data convert-physionet2012 --feature-set physionet2012-full \
        ../shared/data/physionet2012 data/p12-full
    .venv/bin/python -m benchmarks.chunk_invariance --versions 1.1.0 \
        --split data/p12-b17/in-hospital-mortality/test
    .venv/bin/python -m benchmarks.chunk_invariance --versions 1.2.0 \
        --split data/p12-full/in-hospital-mortality/test

1. Run level: the stays tensorized once, then run in ORT runs of R rows for every R from 1 to
   the model's batch size (every run size any `--chunk-size` produces: a chunk is cut into runs
   of at most that many rows): max |difference| of the probabilities against runs of the batch
   size, and how many stays differ at all.
2. End to end: `scehr score` with several chunk sizes from 1 to the default 256: max |risk| and
   |score| difference against the default chunking, and whether the files are byte-identical;
   then the HTTP batch route (in-process app, 256 stays a request) against `scehr score`.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.score_vs_service import served  # noqa: E402
from scehr.schemas.payloads import StayPayload  # noqa: E402
from scehr.service.batcher import run_chunked  # noqa: E402
from scehr.service.offline_scoring import read_benchmark, resolve_model, score  # noqa: E402
from scehr.service.pipeline import prepare  # noqa: E402
from scehr.service.registry import load_model  # noqa: E402
from scehr.service.settings import Settings  # noqa: E402

SPLIT = REPO / "data" / "physionet2012-benchmark" / "in-hospital-mortality" / "test"
CHUNK_SIZES = (1, 2, 3, 4, 5, 7, 31, 32, 33, 100, 255, 256)


def run_level(version: str, split: Path, models: Path) -> None:
    folder, task = resolve_model("mortality", models, version)
    settings = Settings(model_dir=models, device="cpu", workers=1, intra_op_threads=1)
    model = load_model(folder, task, settings)
    stays = [StayPayload.model_validate(p) for _, p, _ in read_benchmark(split)
             if not isinstance(p, list)]
    prep = prepare(model.spec, stays, max_observations=settings.max_observations)
    assert prep.inputs is not None
    ref = run_chunked(model.run, prep.inputs, model.max_batch_size).probability
    worst, differ = 0.0, 0
    for rows in range(1, model.max_batch_size + 1):
        p = run_chunked(model.run, prep.inputs, rows).probability
        d = np.abs(p.astype(np.float64) - ref).max(axis=1)
        worst, differ = max(worst, float(d.max())), max(differ, int((d > 0).sum()))
    print(f"{version}: {prep.inputs.rows} stays, ORT runs of 1..{model.max_batch_size} rows vs "
          f"{model.max_batch_size}: max |probability diff| {worst:.3g}, at most {differ} stays "
          "differ in one run size")


def rows_of(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def end_to_end(version: str, split: Path, models: Path, work: Path) -> None:
    files = {}
    for size in CHUNK_SIZES:
        files[size] = work / f"{version}-c{size}.jsonl"
        score("mortality", split, files[size], model_dir=models, version=version, device="cpu",
              threads=1, chunk_size=size, progress=False)
    ref = rows_of(files[256])
    worst, same_bytes = 0.0, True
    for path in files.values():
        same_bytes &= path.read_bytes() == files[256].read_bytes()
        for key, row in rows_of(path).items():
            for label, fields in row["results"].items():
                for k in ("risk", "score"):
                    worst = max(worst, abs(fields[k] - ref[key]["results"][label][k]))
    print(f"{version}: scehr score, chunk sizes {', '.join(map(str, CHUNK_SIZES))}: max |risk or "
          f"score diff| vs 256: {worst:.3g}; files byte-identical: {same_bytes}")
    stays = [(k, p) for k, p, _ in read_benchmark(split)]
    http = asyncio.run(served(stays, models, version))
    worst, status = 0.0, 0
    for key, want in http.items():
        got = ref[key]["results"] if ref[key]["status"] == "ok" else None
        if want is None or got is None:
            status += (want is None) != (got is None)
            continue
        for label, fields in want.items():
            for k in ("risk", "score"):
                worst = max(worst, abs(got[label][k] - fields[k]))
    print(f"{version}: HTTP batch route vs scehr score on {len(http)} stays: max |risk or score "
          f"diff| {worst:.3g}, {status} status disagreements")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    ap.add_argument("--versions", nargs="+", default=["1.2.0"])
    ap.add_argument("--split", type=Path, default=SPLIT)
    args = ap.parse_args()
    if not (args.split / "listfile.csv").is_file():
        raise SystemExit(f"{args.split} missing: run scehr data convert-physionet2012 first")
    with tempfile.TemporaryDirectory() as tmp:
        for version in args.versions:
            run_level(version, args.split, args.model_dir)
            end_to_end(version, args.split, args.model_dir, Path(tmp))


if __name__ == "__main__":
    main()
