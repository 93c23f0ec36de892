"""Peak memory of `scehr data convert-meds` as the MEDS dataset grows.

The raw MIMIC-III demo is written once as MEDS the way MIMIC MEDS ETLs write it (one event per
chartevents, labevents and outputevents row; `tests/training/data/meds_from_demo.py`), with
its in-hospital-mortality labels from the direct extraction. For each scale k the dataset is
copied k times, every subject again under a new id (`9<copy><subject>`, in the same split),
each copy of a shard its own shard file, as an ETL writes more shards for more subjects; the
labels and subject splits are copied alike. Each scale is one `scehr data convert-meds` in a
child process whose peak RSS is the kernel's high-water mark (VmHWM, /proc, Linux); the
output is checked to hold every labelled stay.

Memory is no timing: the figures hold on a busy machine. Nothing is written into the repo.

    .venv/bin/python benchmarks/meds_memory.py [--scales 1 5 10] [--subjects-per-chunk 64]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.streaming_memory import measure  # noqa: E402
from scehr.training.data.layout import data_dir  # noqa: E402


def new_ids(ids: pa.Array | pa.ChunkedArray, copy: int) -> pa.Array:
    """Subject ids of copy `copy` (0: the original): `9<copy, 3 digits><id>`."""
    if copy == 0:
        return ids
    return pa.array([int(f"9{copy:03d}{s}") for s in ids.to_pylist()], pa.int64())


def with_ids(table: pa.Table, copy: int) -> pa.Table:
    col = table.schema.get_field_index("subject_id")
    return table.set_column(col, table.schema.field(col),
                            new_ids(table["subject_id"], copy))


def write_scaled(meds_dir: Path, labels: Path, scale: int, dest: Path) -> tuple[Path, Path, int]:
    """`scale` copies of the MEDS dataset and its labels under `dest`; (dataset, labels,
    events)."""
    out = dest / "meds"
    events = 0
    for shard in sorted((meds_dir / "data").rglob("*.parquet")):
        table = pq.read_table(shard)
        for k in range(scale):
            path = out / shard.relative_to(meds_dir).with_name(f"{k}.parquet")
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(with_ids(table, k), path)
            events += len(table)
    (out / "metadata").mkdir(parents=True)
    for name in ("codes.parquet", "dataset.json"):
        shutil.copy(meds_dir / "metadata" / name, out / "metadata" / name)
    for src, path in ((meds_dir / "metadata" / "subject_splits.parquet",
                       out / "metadata" / "subject_splits.parquet"),
                      (labels, dest / "labels.parquet")):
        table = pq.read_table(src)
        pq.write_table(pa.concat_tables([with_ids(table, k) for k in range(scale)]), path)
    return out, dest / "labels.parquet", events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 5, 10])
    ap.add_argument("--subjects-per-chunk", type=int, default=None,
                    help="convert-meds' setting (default: its own)")
    ap.add_argument("--demo", type=Path, default=data_dir() / "mimic3-demo",
                    help="the raw MIMIC-III demo (default: the shared data folder's)")
    args = ap.parse_args()

    from scehr.training.data.mimic3.pipeline import extract
    from tests.training.data.meds_from_demo import (
        MEDS_SPLIT,
        mortality_labels,
        write_labels,
        write_meds_from_demo,
    )

    tmp = Path(tempfile.mkdtemp(prefix="scehr-meds-mem-"))
    try:
        extract(args.demo, tmp / "extracted", progress=lambda _s: None)
        lab = mortality_labels(tmp / "extracted")
        labels = write_labels(lab, tmp / "labels.parquet")
        meds_dir = write_meds_from_demo(
            args.demo, tmp / "meds", {s: MEDS_SPLIT[p] for s, p in zip(
                lab.subject_id, lab.split, strict=True)})
        chunk = ([] if args.subjects_per_chunk is None
                 else ["--subjects-per-chunk", str(args.subjects_per_chunk)])
        print("scehr data convert-meds over the MIMIC-III demo written as MEDS, scaled k times "
              "(peak RSS of the process, MiB)")
        print("| scale | subjects | events | stays | peak RSS |")
        print("|---:|---:|---:|---:|---:|")
        for scale in args.scales:
            data = tmp / f"x{scale}"
            src, scaled_labels, events = write_scaled(meds_dir, labels, scale, data)
            out = data / "out"
            cmd = [sys.executable, "-m", "scehr.cli", "data", "convert-meds", str(src),
                   str(scaled_labels), str(out), *chunk]
            rss, _, _ = measure(cmd, data / "log.txt")
            stays = len(list((out / "in-hospital-mortality").rglob("*_timeseries.csv")))
            if stays != len(lab) * scale:
                raise RuntimeError(f"{stays} stays written for {len(lab) * scale} labels")
            splits = pq.read_table(src / "metadata" / "subject_splits.parquet")
            subjects = len(pc.unique(splits["subject_id"]))
            print(f"| {scale}x | {subjects} | {events} | {stays} | {rss:.0f} |", flush=True)
            shutil.rmtree(data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
