"""Benchmark-layout reader on tiny hand-written files: values, categories, splits, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scehr.schemas.featureset import BENCHMARK_48H
from scehr.schemas.variables import BY_ID
from scehr.training.data import load_split
from scehr.training.data.reader import read_timeseries, resolve_split

HEADER = ("Hours,Capillary refill rate,Diastolic blood pressure,Fraction inspired oxygen,"
          "Glascow coma scale eye opening,Glascow coma scale motor response,"
          "Glascow coma scale total,Glascow coma scale verbal response,Glucose,Heart Rate,"
          "Height,Mean blood pressure,Oxygen saturation,Respiratory rate,"
          "Systolic blood pressure,Temperature,Weight,pH")
FS = BENCHMARK_48H
CH = {v.id: i for i, v in enumerate(FS.variables)}


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCEHR_CACHE_DIR", raising=False)


def _row(hours: float, **cells: str) -> str:
    """One CSV row in HEADER's column order; unnamed channels empty."""
    return ",".join([str(hours), *(cells.get(v.id, "") for v in FS.variables)])


def _write(path: Path, rows: list[str], header: str = HEADER, eol: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(eol.join([header, *rows]) + eol)


def test_values_categories_and_empty_cells(tmp_path: Path) -> None:
    a = tmp_path / "1_episode1_timeseries.csv"
    _write(a, [
        _row(0.25, heart_rate="80", gcs_total="15", capillary_refill_rate="0.0",
             gcs_eye="None", gcs_verbal="1.0 ET/Trach"),
        _row(1.5, heart_rate="", gcs_total="8.0", gcs_motor="Obeys Commands",
             fio2="0.5", temperature="36.6"),
        _row(2.0, gcs_eye="4 Spontaneously", glucose="abc", ph="7.3"),
        _row(3.0, gcs_total="16"),  # not a GCS total category: dropped, counted
        _row(4.0, heart_rate="400"),  # above the outlier bound 390: dropped
        _row(5.0, mean_bp="10"),  # between outlier 0 and valid 14: clipped to 14
    ], eol="\r\n")
    b = tmp_path / "2_episode1_timeseries.csv"
    _write(b, [])  # header only: a stay with no observations
    obs, rep = read_timeseries([a, b], FS, progress=False)
    assert obs.n_stays == 2 and (obs.stay == 0).all()
    got = {(float(t), int(c)): float(v) for t, c, v in zip(obs.time, obs.channel, obs.value,
                                                            strict=True)}
    total = BY_ID["gcs_total"]
    assert got[(0.25, CH["heart_rate"])] == 80.0
    assert got[(0.25, CH["gcs_total"])] == total.categories.index("15")
    assert got[(1.5, CH["gcs_total"])] == total.categories.index("8")
    assert got[(0.25, CH["gcs_eye"])] == BY_ID["gcs_eye"].categories.index("None")
    assert got[(0.25, CH["gcs_verbal"])] == BY_ID["gcs_verbal"].categories.index("1.0 ET/Trach")
    assert got[(0.25, CH["capillary_refill_rate"])] == 0.0
    assert got[(1.5, CH["fio2"])] == 0.5
    assert got[(5.0, CH["mean_bp"])] == 14.0
    assert (1.5, CH["heart_rate"]) not in got and (4.0, CH["heart_rate"]) not in got
    assert rep.invalid[CH["glucose"]] == 1 and rep.invalid[CH["gcs_total"]] == 1
    assert rep.dropped[CH["heart_rate"]] == 1 and rep.clipped[CH["mean_bp"]] == 1
    assert rep.n_rows == 6


def test_columns_by_name_not_position(tmp_path: Path) -> None:
    f = tmp_path / "3_episode1_timeseries.csv"
    _write(f, ["1.0,7.35,90,extra", "2.0,,95,"], header="Hours,pH,Heart Rate,Something")
    obs, rep = read_timeseries([f], FS, progress=False)
    assert sorted(zip(obs.channel.tolist(), obs.value.tolist(), strict=True)) == sorted(
        [(CH["ph"], 7.35), (CH["heart_rate"], 90.0), (CH["heart_rate"], 95.0)])
    assert rep.unknown_columns == ["Something"]


def _dataset(root: Path, n: int = 8, val_files: bool = True) -> Path:
    tdir = root / "in-hospital-mortality"
    stays = [f"{100 + i}_episode1_timeseries.csv" for i in range(n)]
    for part in ("train", "test"):
        for i, s in enumerate(stays):
            _write(tdir / part / s, [_row(1.0, heart_rate=str(70 + i)),
                                     _row(47.5, heart_rate=str(90 + i))])
        lines = ["stay,y_true", *(f"{s},{i % 2}" for i, s in enumerate(stays))]
        (tdir / part / "listfile.csv").write_text("\n".join(lines) + "\n")
    if val_files:
        (tdir / "train_listfile.csv").write_text(
            "stay,y_true\n" + "".join(f"{s},{i % 2}\n" for i, s in enumerate(stays[:6])))
        (tdir / "val_listfile.csv").write_text(
            "stay,y_true\n" + "".join(f"{s},{i % 2}\n" for i, s in enumerate(stays[6:], 6)))
    return tdir


def test_benchmark_split_files_are_used(tmp_path: Path) -> None:
    tdir = _dataset(tmp_path)
    val = load_split(tmp_path, "mortality", "val", progress=False)
    assert list(val.stays) == ["106_episode1_timeseries.csv", "107_episode1_timeseries.csv"]
    assert val.split_source == "train_listfile.csv/val_listfile.csv"
    hr = FS.column_names().index("heart_rate")
    assert val.x[0, 0, hr] == 76.0 and val.x[0, 47, hr] == 96.0 and val.x[0, 20, hr] == 76.0
    assert np.isnan(val.static_raw).all()  # no demographics.csv: all missing
    # the task folder itself works as root too
    assert len(load_split(tdir, "mortality", "train", progress=False)) == 6


def test_valset_of_subject_ids(tmp_path: Path) -> None:
    tdir = _dataset(tmp_path, val_files=False)
    (tdir / "valset.csv").write_text("".join(f"{100 + i},{int(i in (1, 4))}\n"
                                             for i in range(8)))
    val = load_split(tmp_path, "mortality", "val", progress=False)
    assert sorted(val.stays) == ["101_episode1_timeseries.csv", "104_episode1_timeseries.csv"]
    assert val.split_source.startswith("valset.csv")
    assert len(load_split(tmp_path, "mortality", "train", progress=False)) == 6


def test_seeded_split_by_subject(tmp_path: Path) -> None:
    tdir = _dataset(tmp_path, n=40, val_files=False)
    for i in range(5):  # a second stay of subject 100 must land on the same side
        _write(tdir / "train" / f"100_episode{i + 2}_timeseries.csv", [_row(1.0, ph="7.4")])
    with open(tdir / "train" / "listfile.csv", "a") as f:
        f.write("".join(f"100_episode{i + 2}_timeseries.csv,0\n" for i in range(5)))
    spec_tr = resolve_split(tdir, "mortality", "train", seed=0, val_fraction=0.25)
    spec_va = resolve_split(tdir, "mortality", "val", seed=0, val_fraction=0.25)
    subj = lambda t: {s.split("_")[0] for s in t["stay"]}  # noqa: E731
    assert not subj(spec_tr.table) & subj(spec_va.table)
    assert len(spec_tr.table) + len(spec_va.table) == 45
    assert spec_va.source.startswith("seeded split")
    again = resolve_split(tdir, "mortality", "val", seed=0, val_fraction=0.25)
    assert again.table["stay"].tolist() == spec_va.table["stay"].tolist()


def test_phenotypes_period_length_and_demographics(tmp_path: Path) -> None:
    tdir = tmp_path / "phenotyping"
    labels = ["Shock", "Septicemia (except in labor)"]
    for part in ("train", "test"):
        _write(tdir / part / "7_episode1_timeseries.csv",
               [_row(0.5, heart_rate="80"), _row(300.0, heart_rate="90")])
        _write(tdir / part / "8_episode1_timeseries.csv", [_row(3.2, heart_rate="85")])
        (tdir / part / "listfile.csv").write_text(
            f"stay,period_length,{','.join(labels)}\n"
            "7_episode1_timeseries.csv,400.0,1,0\n8_episode1_timeseries.csv,10.5,0,1\n")
        (tdir / part / "demographics.csv").write_text(
            "stay,age,sex_male,height\n7_episode1_timeseries.csv,90,1,170\n")
    a = load_split(tmp_path, "phenotypes", "test", progress=False)
    assert a.x.shape == (2, 240, 76) and a.lengths.tolist() == [240, 11]
    assert a.y.tolist() == [[1, 0], [0, 1]] and a.label_names == tuple(labels)
    assert a.static_raw[0].tolist() == [90.0, 1.0] and np.isnan(a.static_raw[1]).all()
    assert (a.x[1, 11:] == 0).all()


def test_errors_name_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"in-hospital-mortality/train/listfile\.csv"):
        load_split(tmp_path, "mortality", "train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_split(tmp_path / "nope", "mortality", "train")
    tdir = _dataset(tmp_path)
    (tdir / "test" / "103_episode1_timeseries.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"103_episode1_timeseries\.csv"):
        load_split(tmp_path, "mortality", "test", cache=False)
    (tdir / "test" / "listfile.csv").write_text("stay,label\nx,1\n")
    with pytest.raises(ValueError, match="stay,y_true"):
        load_split(tmp_path, "mortality", "test")
    with pytest.raises(ValueError, match="unknown task"):
        load_split(tmp_path, "decompensation", "test")


def test_batched_parsing_gives_the_same_observations(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import scehr.training.data.reader as reader

    paths = []
    for i in range(12):
        p = tmp_path / f"{i}_episode1_timeseries.csv"
        _write(p, [_row(0.5 * k, heart_rate=str(60 + i + k), gcs_total=str(3 + k))
                   for k in range(10)])
        paths.append(p)
    whole, _ = read_timeseries(paths, FS, progress=False)
    monkeypatch.setattr(reader, "BATCH_BYTES", 300)
    batched, rep = read_timeseries(paths, FS, progress=False)
    for k in ("stay", "channel", "time", "value"):
        np.testing.assert_array_equal(getattr(whole, k), getattr(batched, k))
    assert rep.n_rows == 120


def test_header_only_files(tmp_path: Path) -> None:
    f = tmp_path / "9_episode1_timeseries.csv"
    _write(f, [])
    obs, rep = read_timeseries([f, f], FS, progress=False)
    assert len(obs) == 0 and obs.n_stays == 2 and rep.n_rows == 0


def test_listfile_errors_name_the_file_and_the_rule(tmp_path: Path) -> None:
    from scehr.training.data.reader import read_listfile

    p = tmp_path / "listfile.csv"
    p.write_text("stay,period_length,A\ns1,,0\n")
    with pytest.raises(ValueError, match="period_length must be a positive number"):
        read_listfile(p, "phenotypes")
    p.write_text("stay,y_true\ns1,0\ns1,1\n")
    with pytest.raises(ValueError, match="listed twice"):
        read_listfile(p, "mortality")
    task = tmp_path / "in-hospital-mortality"
    (task / "train").mkdir(parents=True)
    (task / "train_listfile.csv").write_text("stay,y_true\na,0\nb,1\n")
    (task / "val_listfile.csv").write_text("stay,y_true\nb,1\nc,0\n")
    with pytest.raises(ValueError, match="share 1 stays"):
        resolve_split(task, "mortality", "train")


def _random_files(root: Path, rng: np.random.Generator, n: int,
                  bad_cells: bool = True) -> list[Path]:
    """Files as real exports come: headers in other orders, ids for names, unknown columns,
    text categories, bad cells (or only "nan" cells, which parse as numbers), unsorted or
    missing times, CRLF, blank lines, header-only."""
    bad_time, bad_value = ("x", "abc") if bad_cells else ("", "nan")
    names = [v.benchmark_name for v in FS.variables]
    headers = [["Hours", *names],
               ["Hours", *reversed(names)],
               ["Hours", "Something", *[v.id for v in FS.variables[::2]]]]
    paths = []
    for i in range(n):
        header = headers[int(rng.integers(len(headers)))]
        rows = []
        t = 0.0
        for _ in range(int(rng.integers(0, 30))):
            t += float(rng.choice([0.0, 0.25, 1.0 / 3, 2.5]))
            hours = rng.choice([repr(t), repr(t), repr(t), repr(max(t - 3, 0)), "", bad_time],
                               p=[0.5, 0.2, 0.2, 0.06, 0.02, 0.02])
            row = [str(hours)]
            for name in header[1:]:
                v = BY_ID.get(name) or next((x for x in FS.variables
                                             if x.benchmark_name == name), None)
                if v is None or rng.random() < 0.6:
                    row.append("" if v is None or rng.random() < 0.9 else "7")
                elif v.is_categorical:
                    cats = [*v.categories, "not a category", f" {v.categories[0]} "]
                    row.append(str(rng.choice(cats)))
                else:
                    lo = v.ranges.valid_low if v.ranges else 0.0
                    hi = v.ranges.valid_high if v.ranges else 100.0
                    x = rng.uniform(lo - 0.2 * (hi - lo), hi * 1.3)
                    row.append(rng.choice([f"{x:.2f}", f"{x:.1f}", bad_value],
                                          p=[0.6, 0.39, 0.01]))
            rows.append(",".join(row))
        if rows and rng.random() < 0.2:
            rows.insert(int(rng.integers(len(rows))), str(rng.choice(["", " "])))
        p = root / f"{i}_episode1_timeseries.csv"
        eol = str(rng.choice(["\n", "\r\n", "mixed"], p=[0.8, 0.1, 0.1]))
        if eol == "mixed":  # LF after the header, CRLF between rows
            p.write_text(",".join(header) + "\n" + "\r\n".join(rows) + "\r\n")
        else:
            _write(p, rows, header=",".join(header), eol=eol)
        paths.append(p)
    return paths


def _assert_reads_as_the_oracle(paths: list[Path]) -> None:
    """read_timeseries gives the line-by-line oracle's observations and counts (on files with
    enough rows, invalid cells and rows without a time for the comparison to mean something)."""
    from tests.oracles.timeseries_rows import read_rows

    obs, rep = read_timeseries(paths, FS, progress=False)
    want, counts = read_rows(paths, FS)
    assert len(want) > 500 and counts["invalid"].sum() > 5 and counts["rows_without_time"] > 0
    for k in ("stay", "channel", "time", "value"):
        np.testing.assert_array_equal(getattr(obs, k), getattr(want, k), err_msg=k)
    assert (rep.n_rows, rep.rows_without_time) == (counts["rows"], counts["rows_without_time"])
    assert rep.unknown_columns == counts["unknown_columns"]
    np.testing.assert_array_equal(rep.invalid, counts["invalid"])


@pytest.mark.parametrize("batch_bytes", [None, 2000])
def test_reader_equals_the_line_by_line_oracle(tmp_path: Path, batch_bytes: int | None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import scehr.training.data.reader as reader
    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    paths = _random_files(tmp_path, np.random.default_rng(7), 60)
    _assert_reads_as_the_oracle(paths)


def test_the_fast_parse_equals_the_line_by_line_oracle(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Files without bad cells are parsed by pyarrow alone (the text parse is made to fail):
    the same observations and counts as the oracle, a "nan" cell counted as invalid."""
    import scehr.training.data.reader as reader

    def no_text_parse(*args: object) -> None:
        raise AssertionError("a group without bad cells went to the text parse")

    monkeypatch.setattr(reader, "_parse_with_pandas", no_text_parse)
    paths = _random_files(tmp_path, np.random.default_rng(11), 60, bad_cells=False)
    _assert_reads_as_the_oracle(paths)


def test_whitespace_only_lines_are_no_rows(tmp_path: Path) -> None:
    """pandas skips them; counted as rows they would shift the next file's rows to this stay
    (a space-only line right after the header once did)."""
    a, b = tmp_path / "1_episode1_timeseries.csv", tmp_path / "2_episode1_timeseries.csv"
    a.write_text(HEADER + "\n \n" + _row(1.0, heart_rate="80") + "\n\t\n")
    _write(b, [_row(2.0, heart_rate="90")])
    obs, rep = read_timeseries([a, b], FS, progress=False)
    assert obs.stay.tolist() == [0, 1] and obs.value.tolist() == [80.0, 90.0]
    assert rep.n_rows == 2


def test_a_line_break_inside_a_cell_is_an_error_not_a_shift(tmp_path: Path) -> None:
    f = tmp_path / "3_episode1_timeseries.csv"
    f.write_text('Hours,Heart Rate,Note\n1.0,80,"two\nlines"\n2.0,90,\n')
    with pytest.raises(ValueError, match="line break inside a cell"):
        read_timeseries([f, f], FS, progress=False)
