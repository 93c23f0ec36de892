"""`ObservationColumns` filled by a reader of its own (as the FHIR reader does), not by ingest;
a stay handed over as columns (`ColumnStay`)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest

from scehr.schemas import ingest
from scehr.schemas.featureset import BENCHMARK_48H, FEATURE_SETS
from scehr.schemas.payloads import Demographics, StayPayload

ADMISSION = datetime(2026, 1, 1, 6)
#: (variable, unit, time, value) in reading order: timestamps and hours, a unit to convert, a
#: category's text, and three rows that break a rule (unknown name, negative time, text value)
ROWS = [("heart_rate", None, ADMISSION + timedelta(hours=1), 80.0),
        ("heart_rate", None, ADMISSION + timedelta(hours=2), 82.0),
        ("Glucose", "mmol/L", 3.0, 7.0),
        ("gcs_eye", None, 4.0, "4 Spontaneously"),
        ("lactat", None, 1.0, 2.0),
        ("heart_rate", None, -1.0, 80.0),
        ("heart_rate", None, 5.0, "fast")]


def test_a_reader_fills_the_columns_in_runs_with_its_own_field_paths() -> None:
    """Rows sharing a name and unit given once per run, the reader's own `locate`: the rules
    accept, convert and refuse exactly what they do for the same rows as a long payload."""
    runs = [2, 1, 1, 1, 2]
    starts = np.cumsum([0, *runs[:-1]])
    cols = ingest.ObservationColumns(
        variable=[ROWS[s][0] for s in starts], unit=[ROWS[s][1] for s in starts],
        time=[r[2] for r in ROWS], value=[r[3] for r in ROWS],
        locate=lambda i: ["entry", i, "resource"], runs=runs, admission=ADMISSION)
    got = ingest._read(cols, BENCHMARK_48H)
    want = ingest.ingest_stay(StayPayload(admission_time=ADMISSION, observations=[
        {"variable": v, "unit": u, "time": t, "value": x} for v, u, t, x in ROWS]), BENCHMARK_48H)
    for k in ("channel", "time", "value", "source"):
        np.testing.assert_array_equal(getattr(got, k), getattr(want, k), strict=True)
    assert got.loc == [["entry", i, "resource"] for i in (0, 1, 2, 3)]
    assert [(p.loc, p.rule) for p in got.problems] == [
        (["entry", 4, "resource", "variable"], "unknown_variable"),
        (["entry", 5, "resource", "time"], "time_negative"),
        (["entry", 6, "resource", "value"], "number_required")]
    assert [p.message for p in got.problems] == [p.message for p in want.problems]


def _ingested(out: ingest.StayIngest) -> tuple[object, ...]:
    return (out.channel.tolist(), out.time.tolist(), out.value.tolist(), out.loc, out.static,
            out.end_hours, [p.model_dump() for p in out.problems],
            [n.model_dump() for n in out.notices])


@pytest.mark.parametrize(("rows", "limit"), [(ROWS[:4], 100), (ROWS, 100), (ROWS[:4], 3),
                                             ([], 100)])
@pytest.mark.parametrize("strict", [False, True])
def test_a_column_stay_is_ingested_as_the_same_long_payload(
        rows: list[tuple[object, ...]], limit: int, strict: bool) -> None:
    """`ColumnStay` (`ingest_columns`): the stay's own rules (the observation limit, the empty
    payload, demographics, the window's end and notices, strict cleaning) as for a payload."""
    extra = {"id": "s1", "end_hours": 30.0,
             "demographics": Demographics(age=64.0, sex="female")}
    cols = ingest.ObservationColumns([r[0] for r in rows], [r[1] for r in rows],
                                     [r[2] for r in rows], [r[3] for r in rows],
                                     admission=ADMISSION)
    stay = ingest.ColumnStay(cols, **extra)  # type: ignore[arg-type]
    payload = StayPayload(admission_time=ADMISSION, **extra, observations=[
        {"variable": v, "unit": u, "time": t, "value": x} for v, u, t, x in rows])
    for fs in (BENCHMARK_48H, FEATURE_SETS["benchmark76-stay"]):
        got = ingest.ingest_stay(stay, fs, strict=strict, max_observations=limit)
        want = ingest.ingest_stay(payload, fs, strict=strict, max_observations=limit)
        assert _ingested(got) == _ingested(want)
        assert got.problems or got.notices
