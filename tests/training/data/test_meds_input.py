"""MEDS input: a MEDS dataset written from the raw MIMIC-III demo tables as a MIMIC MEDS ETL
writes it (`meds_from_demo`) gives, for every mortality stay, the time series of reading the
demo directly (`extract-mimic3`), whatever the order of same-time events and the split names.
Small MEDS datasets written here check each rule on its own. The demo tests need
../shared/data (skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import meds
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from scehr.schemas.featureset import FEATURE_SETS
from scehr.training.data.meds_input import convert_meds, parse_split_map, read_meds
from scehr.training.data.reader import read_timeseries
from scehr.training.data.splits import load_split
from tests.conftest import REPO, SHARED_DATA, needs_shared_data
from tests.training.data.meds_from_demo import (
    MEDS_SPLIT,
    mortality_labels,
    write_labels,
    write_meds_from_demo,
)

FS = FEATURE_SETS["benchmark76-48h"]
CH = {v.id: i for i, v in enumerate(FS.variables)}
OTHER_NAMES = {"train": "development", "val": "validation", "test": "testing"}


# ---------------------------------------------------------------- the demo, both ways


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The direct extraction, its mortality labels and splits as MEDS tables, and the raw demo
    written as MEDS twice: in table order with MEDS' split names, and with the events of each
    subject and time shuffled and other split names."""
    from scehr.training.data.mimic3.pipeline import extract

    root = tmp_path_factory.mktemp("meds-demo")
    direct = root / "direct"
    extract(SHARED_DATA / "mimic3-demo", direct, progress=lambda _s: None)
    lab = mortality_labels(direct)
    labels = write_labels(lab, root / "labels.parquet")
    split = dict(zip(lab.subject_id, lab.split, strict=True))
    plain = write_meds_from_demo(SHARED_DATA / "mimic3-demo", root / "meds",
                                 {s: MEDS_SPLIT[p] for s, p in split.items()})
    shuffled = write_meds_from_demo(SHARED_DATA / "mimic3-demo", root / "meds-shuffled",
                                    {s: OTHER_NAMES[p] for s, p in split.items()}, seed=1)
    return {"direct": direct, "labels": labels, "lab": lab, "plain": plain,
            "shuffled": shuffled, "root": root}


def _series(path: Path) -> tuple[np.ndarray, ...]:
    """A stay's cleaned time series as the reader sees it: (channel, hours, value), float32."""
    o = read_timeseries([path], FS, progress=False)[0]
    order = np.lexsort((o.channel, o.time))
    return o.channel[order], o.time[order].astype(np.float32), o.value[order].astype(np.float32)


def _equal_stays(demo: dict[str, object], via: Path) -> list[str]:
    """The direct path's mortality stays whose time series the MEDS output equals."""
    lab = demo["lab"].sort_values(["subject_id", "prediction_time"])  # type: ignore[union-attr]
    k = lab.groupby("subject_id").cumcount() + 1
    same = []
    for stay, split, sid, n in zip(lab.stay, lab.split, lab.subject_id, k, strict=True):
        folder = "test" if split == "test" else "train"
        a = _series(Path(demo["direct"]) / "in-hospital-mortality" / folder / stay)  # type: ignore[arg-type]
        b = _series(via / "in-hospital-mortality" / folder / f"{sid}_episode{n}_timeseries.csv")
        if all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True)) \
                and len(a[0]) == len(b[0]):
            same.append(stay)
    return same


@needs_shared_data
def test_the_demo_meds_follows_the_standard(demo: dict[str, object]) -> None:
    src = Path(demo["plain"])  # type: ignore[arg-type]
    shards = sorted((src / meds.data_subdirectory).rglob("*.parquet"))
    assert {p.parent.name for p in shards} == {"train", "tuning", "held_out"}
    for shard in shards:
        table = pq.read_table(shard)
        meds.DataSchema.validate(table)
        df = table.select(["subject_id", "time"]).to_pandas()
        assert df.equals(df.sort_values(["subject_id", "time"], kind="stable",
                                        na_position="first"))
    meds.CodeMetadataSchema.validate(pq.read_table(src / meds.code_metadata_filepath))
    meds.SubjectSplitSchema.validate(pq.read_table(src / meds.subject_splits_filepath))
    meds.DatasetMetadataSchema.validate(json.loads(
        (src / meds.dataset_metadata_filepath).read_text()))
    data = read_meds(src).to_pandas()
    assert {meds.birth_code, meds.death_code} <= set(data.code)
    assert data.code.str.startswith("HOSPITAL_ADMISSION//").any()
    assert data.code.str.startswith("ICU_ADMISSION//").any()
    # one event per table row: the demo's CHARTEVENTS, LABEVENTS and OUTPUTEVENTS rows
    assert data.code.str.match(r"^(LAB|OUTPUT)//\d+//").sum() == 758_355 + 76_074 + 11_320
    codes = pq.read_table(src / meds.code_metadata_filepath).to_pandas()
    glucose = codes[codes.code == "LAB//50931//mg/dL"].parent_codes.iloc[0]
    assert list(glucose) == ["LOINC/2345-7"]


@needs_shared_data
@pytest.mark.parametrize("which", ["plain", "shuffled"])
def test_meds_from_the_raw_demo_equals_the_direct_path(demo: dict[str, object], which: str
                                                       ) -> None:
    via = Path(demo["root"]) / f"via-{which}"  # type: ignore[arg-type]
    split_map = None if which == "plain" else {v: k for k, v in OTHER_NAMES.items()}
    counts = convert_meds(Path(demo[which]), Path(demo["labels"]), via,  # type: ignore[arg-type]
                          split_map=split_map)
    assert counts["labels"] == 57
    assert len(_equal_stays(demo, via)) == 57
    for split in ("train", "val", "test"):
        d = load_split(Path(demo["direct"]), "mortality", split, FS, cache=False)  # type: ignore[arg-type]
        v = load_split(via, "mortality", split, FS, cache=False)
        order_d, order_v = np.argsort(d.stays), np.argsort(v.stays)
        assert [s.split("_")[0] for s in d.stays[order_d]] == \
            [s.split("_")[0] for s in v.stays[order_v]]
        np.testing.assert_array_equal(v.y[order_v], d.y[order_d])
        np.testing.assert_array_equal(v.x[order_v], d.x[order_d])


@needs_shared_data
def test_other_split_names_need_a_map(demo: dict[str, object], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'development'.*--split-map"):
        convert_meds(Path(demo["shuffled"]), Path(demo["labels"]), tmp_path)  # type: ignore[arg-type]


@needs_shared_data
def test_no_code_that_maps_is_an_error(demo: dict[str, object], tmp_path: Path) -> None:
    """Without the item map and without codes.parquet nothing of MIMIC's maps: exit 1, said."""
    from scehr.cli import main

    src = tmp_path / "meds"
    (src / "metadata").mkdir(parents=True)
    plain = Path(demo["plain"])  # type: ignore[arg-type]
    (src / "data").symlink_to(plain / "data")
    for f in (meds.subject_splits_filepath, meds.dataset_metadata_filepath):
        (src / f).write_bytes((plain / f).read_bytes())
    assert main(["data", "convert-meds", str(src), str(demo["labels"]), str(tmp_path / "out"),
                 "--items", "none"]) == 1
    assert not (tmp_path / "out" / "in-hospital-mortality").exists()


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` by its relative path, but the provenance (it names the source)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "provenance.json"}


@needs_shared_data
def test_meds_converts_a_few_subjects_at_a_time_to_the_same_files(
        demo: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards of many row groups, read one row group and a few whole subjects at a time (never
    the whole dataset), give the stay files, listfiles and label tables of converting each
    shard whole, byte for byte, and the same counts."""
    lab = demo["lab"]
    split = dict(zip(lab.subject_id, lab.split, strict=True))  # type: ignore[union-attr]
    grouped = write_meds_from_demo(SHARED_DATA / "mimic3-demo", tmp_path / "meds",
                                   {s: MEDS_SPLIT[p] for s, p in split.items()},
                                   row_group_size=20_000)
    shards = sorted((grouped / meds.data_subdirectory).rglob("*.parquet"))
    assert sum(pq.ParquetFile(f).metadata.num_row_groups for f in shards) > 3 * len(shards)
    labels = Path(demo["labels"])  # type: ignore[arg-type]
    whole = convert_meds(Path(demo["plain"]), labels, tmp_path / "whole",  # type: ignore[arg-type]
                         subjects_per_chunk=10**6)
    import scehr.training.data.meds_input as meds_input

    def no_whole_read(*_a: object) -> None:
        raise AssertionError("the conversion read every shard at once")

    monkeypatch.setattr(meds_input, "read_meds", no_whole_read)
    reference = _files(tmp_path / "whole")
    assert len(reference) == 57 + 2 + 2 + 3  # stays, listfile and labels of each part, splits
    for per_chunk in (1, 7):
        out = tmp_path / f"chunks-{per_chunk}"
        counts = convert_meds(grouped, labels, out, subjects_per_chunk=per_chunk)
        assert counts == whole
        assert _files(out) == reference


@needs_shared_data
def test_converted_meds_streams_as_it_loads(demo: dict[str, object], tmp_path: Path) -> None:
    """convert-meds then `scehr train --stream`: the streamed splits of the output are the
    in-memory ones (stays, normalizer, coverage, every batch)."""
    from tests.training.data.test_streaming import SPLITS, assert_same_batches, both

    via = tmp_path / "via"
    convert_meds(Path(demo["plain"]), Path(demo["labels"]), via,  # type: ignore[arg-type]
                 subjects_per_chunk=5)
    mem, streamed = both("mortality", via)
    assert mem.normalizer.to_dict() == streamed.normalizer.to_dict()
    assert mem.coverage == streamed.coverage
    assert sum(len(getattr(mem, s)) for s in SPLITS) == 57
    for s in SPLITS:
        a, b = getattr(mem, s), getattr(streamed, s)
        assert a.stays == b.stays
        assert_same_batches(a, b, list(torch.arange(len(a)).split(8)))


@needs_shared_data
def test_unknown_variable_in_code_map_is_named(demo: dict[str, object], tmp_path: Path
                                               ) -> None:
    with pytest.raises(KeyError, match="no_such_variable"):
        convert_meds(Path(demo["plain"]), Path(demo["labels"]), tmp_path / "x",  # type: ignore[arg-type]
                     code_map={"LOINC/8867-4": "no_such_variable"})


@needs_shared_data
def test_meds_output_scores_with_the_shipped_model(demo: dict[str, object], tmp_path: Path
                                                   ) -> None:
    from scehr.cli import main

    via = tmp_path / "via"
    assert main(["data", "convert-meds", str(demo["plain"]), str(demo["labels"]), str(via)]) == 0
    split = via / "in-hospital-mortality" / "test"
    out = tmp_path / "scores.csv"
    assert main(["score", str(REPO / "models" / "mortality" / "1.1.1"), str(split), "--out",
                 str(out), "--quiet"]) == 0
    assert len(pd.read_csv(out)) == len(pd.read_csv(split / "listfile.csv"))


# ---------------------------------------------------------------- each rule on a small dataset

T0 = pd.Timestamp("2100-01-01 00:00")


def _small(tmp_path: Path, events: list[tuple[float, str, float | None, str | None]], *,
           codes: pd.DataFrame | None = None, split: str = "train") -> tuple[Path, Path]:
    """A MEDS dataset of subject 1 with `events` (hours after T0, code, numeric, text) and a
    label at T0 + 48 h."""
    src = tmp_path / "meds"
    (src / "data").mkdir(parents=True)
    (src / "metadata").mkdir()
    ev = pd.DataFrame([(1, T0 + pd.Timedelta(hours=h), c, n, t) for h, c, n, t in events],
                      columns=["subject_id", "time", "code", "numeric_value", "text_value"])
    pq.write_table(meds.DataSchema.align(pa.Table.from_pandas(ev, preserve_index=False)),
                   src / "data" / "0.parquet")
    pq.write_table(meds.SubjectSplitSchema.align(pa.table({"subject_id": [1],
                                                           "split": [split]})),
                   src / meds.subject_splits_filepath)
    if codes is not None:
        pq.write_table(meds.CodeMetadataSchema.align(pa.Table.from_pandas(
            codes, preserve_index=False)), src / meds.code_metadata_filepath)
    labels = tmp_path / "labels.parquet"
    pq.write_table(meds.LabelSchema.align(pa.table({
        "subject_id": [1], "prediction_time": [T0 + pd.Timedelta(hours=48)],
        "boolean_value": [False]})), labels)
    return src, labels


def _converted(tmp_path: Path, events: list[tuple[float, str, float | None, str | None]],
               **kw: object) -> dict[int, list[tuple[float, float]]]:
    """Channel -> [(hours, value)] of the one stay written from `events`."""
    codes = kw.pop("codes", None)
    src, labels = _small(tmp_path, events, codes=codes)  # type: ignore[arg-type]
    convert_meds(src, labels, tmp_path / "out", **kw)  # type: ignore[arg-type]
    train = tmp_path / "out" / "in-hospital-mortality" / "train"
    [stay] = pd.read_csv(train / "listfile.csv").stay
    o = read_timeseries([train / stay], FS, progress=False)[0]
    out: dict[int, list[tuple[float, float]]] = {}
    for c, t, v in zip(o.channel.tolist(), o.time.tolist(), o.value.tolist(), strict=True):
        out.setdefault(c, []).append((t, v))
    return out


def test_units_are_converted_by_the_catalog(tmp_path: Path) -> None:
    got = _converted(tmp_path, [(1, "VITAL//TEMP//°F", 98.6, None),
                                (2, "VENT//FIO2//%", 50.0, None),
                                (3, "VITAL//WEIGHT//lb", 176.0, None)],
                     code_map={"VITAL//TEMP//°F": "temperature", "VENT//FIO2//%": "fio2",
                               "VITAL//WEIGHT//lb": "weight"})
    assert got[CH["temperature"]] == [(1.0, pytest.approx(37.0))]
    assert got[CH["fio2"]] == [(2.0, 0.5)]
    assert got[CH["weight"]] == [(3.0, pytest.approx(176 * 0.453592))]


#: Glucose by its LOINC code, its unit in codes.parquet.
GLUCOSE = pd.DataFrame({"code": ["LOINC/2345-7"], "description": ["glucose"],
                        "parent_codes": [None], "unit": ["mg/dL"]})


def test_a_stem_in_the_code_map_covers_its_units(tmp_path: Path) -> None:
    got = _converted(tmp_path, [(1, "VITAL//TEMP//°F", 98.6, None),
                                (2, "VITAL//TEMP//Cel", 37.5, None)],
                     code_map={"VITAL//TEMP": "temperature"})
    assert got[CH["temperature"]] == [(1.0, pytest.approx(37.0)), (2.0, 37.5)]


def test_same_time_values_keep_the_largest_in_any_order(tmp_path: Path) -> None:
    events = [(1, "LOINC/2345-7", 140.0, "140"), (1, "LOINC/2345-7", 90.0, "90")]
    first = _converted(tmp_path / "a", events, codes=GLUCOSE)
    again = _converted(tmp_path / "b", events[::-1], codes=GLUCOSE)
    assert first[CH["glucose"]] == again[CH["glucose"]] == [(1.0, 140.0)]


def test_an_event_without_a_value_never_blanks_one(tmp_path: Path) -> None:
    got = _converted(tmp_path, [(1, "LOINC/2345-7", 79.0, "79"),
                                (1, "LOINC/2345-7", None, "NEG"),
                                (2, "LOINC/2345-7", None, None)], codes=GLUCOSE)
    assert got[CH["glucose"]] == [(1.0, 79.0)]


def test_capillary_refill_text_is_a_category(tmp_path: Path) -> None:
    got = _converted(tmp_path, [(1, "CRR", None, "Normal <3 secs"),
                                (2, "CRR", None, "Abnormal >3 secs")],
                     code_map={"CRR": "capillary_refill_rate"})
    assert got[CH["capillary_refill_rate"]] == [(1.0, 0.0), (2.0, 1.0)]


def test_parent_codes_and_code_units_map_without_a_code_map(tmp_path: Path) -> None:
    codes = pd.DataFrame({"code": ["LAB//7//UNK", "LAB//8//bpm"],
                          "description": ["fio2", "heart rate"],
                          "parent_codes": [["LOINC/3150-0"], ["LOINC/8867-4"]],
                          "unit": ["%", None]})
    got = _converted(tmp_path, [(1, "LAB//7//UNK", 40.0, "40"), (1, "LAB//8//bpm", 80.0, "80")],
                     codes=codes)
    assert got[CH["fio2"]] == [(1.0, 0.4)]
    assert got[CH["heart_rate"]] == [(1.0, 80.0)]


def test_no_code_maps_is_an_error(tmp_path: Path) -> None:
    src, labels = _small(tmp_path, [(1, "LAB//8//bpm", 80.0, "80")])
    with pytest.raises(ValueError, match=r"no code of .* maps to a variable"):
        convert_meds(src, labels, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_split_names_map(tmp_path: Path) -> None:
    src, labels = _small(tmp_path, [(1, "LOINC/8867-4", 80.0, None)], split="fold_3")
    with pytest.raises(ValueError, match=r"'fold_3'.*--split-map"):
        convert_meds(src, labels, tmp_path / "a")
    convert_meds(src, labels, tmp_path / "b", split_map=parse_split_map("fold_3=test"))
    listing = pd.read_csv(tmp_path / "b" / "in-hospital-mortality" / "test_listfile.csv")
    assert listing.stay.tolist() == ["1_episode1_timeseries.csv"]
    with pytest.raises(ValueError, match="NAME=train"):
        parse_split_map("fold_3=holdout")


# ---------------------------------------------------------------- the ecosystem's formats


def _aces_cohort(tmp_path: Path) -> tuple[Path, Path]:
    """Six subjects with vital signs every 2 hours, all held out, and their labels as ACES
    writes them: one parquet per data shard, with its integer, float and categorical columns."""
    rng = np.random.default_rng(0)
    rows = []
    for sid in range(1, 7):
        for h in range(0, 48, 2):
            for code, mean in (("LOINC/8867-4", 80 + 5 * sid), ("LOINC/8480-6", 120 - 5 * sid),
                               ("LOINC/8462-4", 60.0), ("LOINC/8478-0", 80.0),
                               ("LOINC/9279-1", 18.0), ("LOINC/59408-5", 97.0),
                               ("LOINC/8310-5//Cel", 37.0), ("LOINC/2345-7//mg/dL", 120.0)):
                rows.append((sid, T0 + pd.Timedelta(hours=h), code, mean + rng.normal(), None))
            rows.append((sid, T0 + pd.Timedelta(hours=h), "LOINC/9269-2", None, "15"))
    src = tmp_path / "meds"
    (src / "data" / "held_out").mkdir(parents=True)
    (src / "metadata").mkdir()
    ev = pd.DataFrame(rows, columns=["subject_id", "time", "code", "numeric_value",
                                     "text_value"])
    pq.write_table(meds.DataSchema.align(pa.Table.from_pandas(ev, preserve_index=False)),
                   src / "data" / "held_out" / "0.parquet")
    pq.write_table(meds.SubjectSplitSchema.align(pa.table({
        "subject_id": list(range(1, 7)), "split": ["held_out"] * 6})),
        src / meds.subject_splits_filepath)
    labels = tmp_path / "aces"
    for shard, sids in (("train", [1, 2, 3]), ("held_out", [4, 5, 6])):
        (labels / shard).mkdir(parents=True)
        pq.write_table(pa.table({
            "subject_id": pa.array(sids, pa.int64()),
            "prediction_time": pa.array([T0 + pd.Timedelta(hours=48)] * 3, pa.timestamp("us")),
            "boolean_value": [s % 2 == 0 for s in sids],
            "integer_value": pa.nulls(3, pa.int64()), "float_value": pa.nulls(3, pa.float32()),
            "categorical_value": pa.nulls(3, pa.string())}), labels / shard / "0.parquet")
    return src, labels


def test_aces_labels_in_and_meds_evaluation_predictions_out(tmp_path: Path) -> None:
    import polars as pl
    from meds_evaluation.evaluate import evaluate_binary_classification
    from meds_evaluation.schema import PredictionSchema

    from scehr.cli import main

    src, labels = _aces_cohort(tmp_path)
    out = tmp_path / "out"
    assert main(["data", "convert-meds", str(src), str(labels), str(out)]) == 0
    split = out / "in-hospital-mortality" / "test"
    assert len(pd.read_csv(split / "listfile.csv")) == 6
    scores = tmp_path / "scores.csv"
    assert main(["score", str(REPO / "models" / "mortality" / "1.1.1"), str(split), "--out",
                 str(scores), "--quiet"]) == 0
    preds = tmp_path / "predictions.parquet"
    assert main(["data", "meds-predictions", str(scores), str(split), "--out",
                 str(preds)]) == 0
    table = pq.read_table(preds)
    PredictionSchema.validate(table)
    got = table.to_pandas().sort_values("subject_id")
    assert got.subject_id.tolist() == list(range(1, 7))
    assert got.boolean_value.tolist() == [s % 2 == 0 for s in range(1, 7)]
    assert (got.prediction_time == T0 + pd.Timedelta(hours=48)).all()
    risk = pd.read_csv(scores).set_index("id").filter(like=".risk").iloc[:, 0]
    by_stay = pq.read_table(split / "meds_labels.parquet").to_pandas().set_index("subject_id")
    np.testing.assert_allclose(got.predicted_boolean_probability,
                               risk[by_stay.loc[got.subject_id, "stay"]].to_numpy(), rtol=1e-6)
    metrics = evaluate_binary_classification(pl.read_parquet(preds))
    assert 0.0 <= metrics["samples_equally_weighted"]["roc_auc_score"] <= 1.0


def test_the_meds_dev_recipe_commands_parse() -> None:
    """Every scehr line of the MEDS-DEV recipe is a valid command line (placeholders filled)."""
    import shlex

    import yaml

    from scehr.cli import build_parser

    recipe = yaml.safe_load((REPO / "configs" / "meds-dev" / "scehr" / "model.yaml").read_text())
    lines = [line for step in recipe["commands"]["supervised"].values()
             for line in step.splitlines() if line.strip()]
    assert len(lines) == 6
    for line in lines:
        argv = shlex.split(line.format(dataset_dir="meds", labels_dir="labels",
                                       output_dir="out", model_initialization_dir="init"))
        assert argv[0] == "scehr"
        parser, _ = build_parser(argv[1])
        args = parser.parse_args(argv[1:])
        assert callable(args.func), line


def test_a_subject_in_two_shards_is_named(tmp_path: Path) -> None:
    """Read a few subjects at a time, a subject whose events two shards hold would be written
    twice, the second over the first: MEDS keeps a subject in one shard, so it is refused."""
    src, labels = _small(tmp_path, [(1.0, "LOINC/8867-4", 80.0, None)])
    (src / "data" / "1.parquet").write_bytes((src / "data" / "0.parquet").read_bytes())
    with pytest.raises(ValueError, match="subject 1 has events in more than one place"):
        convert_meds(src, labels, tmp_path / "out")
