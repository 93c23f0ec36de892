"""MEDS shards read by row groups (training/data/meds_shards.py): the same events as reading
every shard whole, from only the row groups that hold the subjects asked for."""

from __future__ import annotations

from pathlib import Path

import meds
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scehr.training.data import meds_shards
from scehr.training.data.meds_input import read_meds
from scehr.training.data.meds_shards import iter_subjects, read_subjects, row_groups

ROWS_PER_GROUP = 16


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards of 20 subjects each (1 to 14 events), sorted by subject and time, written in
    row groups of 16 rows, so many subjects run on from one row group into the next."""
    root = tmp_path_factory.mktemp("meds-shards")
    rng = np.random.default_rng(0)
    (root / meds.data_subdirectory / "train").mkdir(parents=True)
    for shard, first in (("train/0", 100), ("train/1", 500)):
        rows = []
        for subject in range(first, first + 20):
            t0 = pd.Timestamp("2150-01-01") + pd.Timedelta(days=int(rng.integers(0, 99)))
            for k in range(int(rng.integers(1, 15))):
                rows.append((subject, t0 + pd.Timedelta(minutes=30 * k), f"LAB//{k % 4}",
                             float(rng.normal()), None if k % 3 else "text"))
        table = pa.Table.from_pandas(pd.DataFrame(rows, columns=[
            "subject_id", "time", "code", "numeric_value", "text_value"]), preserve_index=False)
        pq.write_table(meds.DataSchema.align(table),
                       root / meds.data_subdirectory / f"{shard}.parquet",
                       row_group_size=ROWS_PER_GROUP)
    return root


def test_the_footers_give_every_row_group_and_its_subjects(dataset: Path) -> None:
    groups = row_groups(dataset)
    whole = read_meds(dataset)
    assert sum(g.rows for g in groups) == whole.num_rows
    assert len(groups) > 8 and all(g.rows <= ROWS_PER_GROUP for g in groups)
    for g in groups:
        ids = pq.ParquetFile(g.path).read_row_group(g.index)["subject_id"].to_numpy()
        assert (g.first, g.last) == (ids.min(), ids.max())


def test_subjects_read_equal_the_whole_read_and_touch_only_their_groups(
        dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = row_groups(dataset)
    whole = read_meds(dataset).to_pandas()
    touched: list[tuple[Path, int]] = []
    read = meds_shards._read
    monkeypatch.setattr(meds_shards, "_read",
                        lambda g, c: touched.append((g.path, g.index)) or read(g, c))
    for subjects in ([103], [100, 119, 507], [105, 106, 107, 508], [9999]):
        touched.clear()
        got = read_subjects(groups, subjects).to_pandas()
        want = whole[whole.subject_id.isin(subjects)].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want)
        need = {(g.path, g.index) for g in groups if any(g.first <= s <= g.last
                                                           for s in subjects)}
        assert set(touched) == need
        assert len(touched) < len(groups)
    cols = read_subjects(groups, [101], columns=["subject_id", "code"])
    assert cols.column_names == ["subject_id", "code"]


@pytest.mark.parametrize("per_batch", [1, 3, 50])
def test_iterated_subjects_come_whole_and_once(dataset: Path, per_batch: int) -> None:
    groups = row_groups(dataset)
    whole = read_meds(dataset).to_pandas()
    batches = [t.to_pandas() for t in iter_subjects(groups, per_batch)]
    assert all(0 < b.subject_id.nunique() <= per_batch for b in batches)
    seen = [s for b in batches for s in b.subject_id.unique()]
    assert len(seen) == len(set(seen)) == whole.subject_id.nunique()
    pd.testing.assert_frame_equal(pd.concat(batches, ignore_index=True), whole)


def test_a_table_off_the_meds_schema_is_named(tmp_path: Path) -> None:
    (tmp_path / meds.data_subdirectory).mkdir()
    pq.write_table(pa.table({"subject_id": [1], "when": [0]}),
                   tmp_path / meds.data_subdirectory / "0.parquet")
    with pytest.raises(ValueError, match=r"0\.parquet does not follow the MEDS schema"):
        read_subjects(row_groups(tmp_path), [1])
    with pytest.raises(FileNotFoundError, match="no MEDS data under"):
        row_groups(tmp_path / "nothing")
