"""MEDS input: a MEDS dataset written from the extracted MIMIC-III demo gives the same tensors as
reading the extraction directly. Needs ../shared/data (skipped without it)."""

from __future__ import annotations

from pathlib import Path

import meds
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scehr.schemas.featureset import FEATURE_SETS
from scehr.training.data.meds_input import convert_meds, default_code_map, read_meds
from scehr.training.data.mimic3.pipeline import extract
from scehr.training.data.splits import load_split
from tests.conftest import REPO, SHARED_DATA, needs_shared_data

pytestmark = needs_shared_data
FS = FEATURE_SETS["benchmark76-48h"]
CRR_CODE = "LOCAL/capillary_refill"  # no LOINC code in the catalog: declared in the map


def write_meds_from_extraction(data: Path, dest: Path) -> Path:
    """The extraction's mortality stays as MEDS: one event per non-empty cell at
    in-time + hours, LOINC codes, labels at in-time + 48 h, splits from its listfiles."""
    stays = pd.read_csv(data / "root" / "all_stays.csv", parse_dates=["INTIME"])
    intime = {(int(s), i): t for s, i, t in zip(stays.SUBJECT_ID, stays.ICUSTAY_ID,
                                                  stays.INTIME, strict=True)}
    code = {v.benchmark_name: f"LOINC/{v.loinc}" if v.loinc else CRR_CODE for v in FS.variables}
    task = data / "in-hospital-mortality"
    rows, labels, split = [], [], {}
    for part, files in (("train", "train_listfile.csv"), ("tuning", "val_listfile.csv"),
                        ("held_out", "test_listfile.csv")):
        listing = pd.read_csv(task / files)
        folder = task / ("test" if part == "held_out" else "train")
        for stay, y in zip(listing.stay, listing.y_true, strict=True):
            sid, episode = int(stay.split("_")[0]), stay.split("_")[1]
            d = "test" if part == "held_out" else "train"
            ep = pd.read_csv(data / "root" / d / str(sid) / f"{episode}.csv")
            t0 = intime[(sid, int(ep.Icustay[0]))]
            ts = pd.read_csv(folder / stay, dtype=str, keep_default_na=False)
            for _, r in ts.iterrows():
                t = t0 + pd.to_timedelta(round(float(r.Hours) * 3600), unit="s")
                for v in FS.variables:
                    cell = r[v.benchmark_name]
                    if cell == "":
                        continue
                    rows.append((sid, t, code[v.benchmark_name],
                                 None if v.is_categorical else float(cell),
                                 cell if v.is_categorical else None))
            labels.append((sid, t0 + pd.Timedelta(hours=48), bool(y)))
            split[sid] = part
    events = pd.DataFrame(rows, columns=["subject_id", "time", "code", "numeric_value",
                                         "text_value"])
    (dest / meds.data_subdirectory).mkdir(parents=True)
    (dest / "metadata").mkdir()
    pq.write_table(meds.DataSchema.align(pa.Table.from_pandas(events, preserve_index=False)),
                   dest / meds.data_subdirectory / "0.parquet")
    lab = pd.DataFrame(labels, columns=["subject_id", "prediction_time", "boolean_value"])
    pq.write_table(meds.LabelSchema.align(pa.Table.from_pandas(lab, preserve_index=False)),
                   dest / "labels.parquet")
    sp = pd.DataFrame({"subject_id": list(split), "split": list(split.values())})
    pq.write_table(meds.SubjectSplitSchema.align(pa.Table.from_pandas(sp, preserve_index=False)),
                   dest / meds.subject_splits_filepath)
    return dest


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("meds")
    direct = root / "direct"
    extract(SHARED_DATA / "mimic3-demo", direct, progress=lambda _s: None)
    src = write_meds_from_extraction(direct, root / "meds")
    via = root / "via-meds"
    convert_meds(src, src / "labels.parquet", via,
                 code_map={**default_code_map(FS), CRR_CODE: "capillary_refill_rate"})
    return direct, via


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_meds_path_gives_the_direct_tensors(both: tuple[Path, Path], split: str) -> None:
    direct, via = (load_split(p, "mortality", split, FS, cache=False) for p in both)

    def order(stays: np.ndarray) -> np.ndarray:  # by subject, then stay in time order
        keys = [(int(s.split("_")[0]), int(s.split("_")[1].removeprefix("episode")))
                for s in stays]
        return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)

    d, v = order(direct.stays), order(via.stays)
    assert len(d) == len(v) > 0
    assert [s.split("_")[0] for s in direct.stays[d]] == [s.split("_")[0] for s in via.stays[v]]
    np.testing.assert_array_equal(via.lengths[v], direct.lengths[d])
    np.testing.assert_array_equal(via.y[v], direct.y[d])
    np.testing.assert_array_equal(via.x[v], direct.x[d])


def test_meds_schema_is_checked(tmp_path: Path) -> None:
    (tmp_path / meds.data_subdirectory).mkdir()
    pq.write_table(pa.table({"subject_id": ["a"], "code": ["x"]}),
                   tmp_path / meds.data_subdirectory / "0.parquet")
    with pytest.raises(ValueError, match="MEDS schema"):
        read_meds(tmp_path)


def test_unknown_variable_in_code_map_is_named(both: tuple[Path, Path], tmp_path: Path) -> None:
    src = both[0].parent / "meds"
    with pytest.raises(KeyError, match="no_such_variable"):
        convert_meds(src, src / "labels.parquet", tmp_path / "x",
                     code_map={"LOINC/8867-4": "no_such_variable"})


def test_meds_output_scores_with_the_shipped_model(both: tuple[Path, Path], tmp_path: Path
                                                   ) -> None:
    from scehr.cli import main

    split = both[1] / "in-hospital-mortality" / "test"
    out = tmp_path / "scores.csv"
    assert main(["score", str(REPO / "models" / "mortality" / "1.1.1"), str(split), "--out",
                 str(out), "--quiet"]) == 0
    assert len(pd.read_csv(out)) == len(pd.read_csv(split / "listfile.csv"))
