"""`ObservationColumns` filled by a reader of its own (as a FHIR decoder would), not by ingest."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np

from scehr.schemas import ingest
from scehr.schemas.featureset import BENCHMARK_48H
from scehr.schemas.payloads import StayPayload

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
