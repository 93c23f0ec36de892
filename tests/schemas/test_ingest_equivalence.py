"""The column-wise ingest against the frozen per-row reference, field by field.

Randomized payloads (valid ones, unknown variables, units and categories, missing units,
strings for numbers, negative and late times, ISO timestamps and timezones, values the
cleaning rule drops or clips, wide form, strict mode, observation limits), hand-picked edge
cases, and checks that the fast path really is the one taken for acceptable stays.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scehr.schemas import ingest as fast
from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY, FEATURE_SETS, FeatureSet
from scehr.schemas.payloads import Observation, StayPayload
from tests.oracles import ingest_reference as reference
from tests.oracles.ingest_cases import assert_same_result, assert_same_stay, random_stay

REPO = Path(__file__).resolve().parents[2]
#: Problems of the stay as a whole, found without the per-row path.
STAY_RULES = {"implausible_value", "out_of_range_dropped", "out_of_range_clipped", "empty_payload",
              "too_many_observations"}


def both(stays: list[StayPayload], fs: FeatureSet, **kw: Any) -> None:
    assert_same_result(reference.ingest(stays, fs, **kw), fast.ingest(stays, fs, **kw))


def stay(obs: list[dict[str, Any]], **kw: Any) -> StayPayload:
    return StayPayload.model_validate({"observations": obs, **kw})


def hr(value: Any = 80.0, time: Any = 1.0, **kw: Any) -> dict[str, Any]:
    return {"variable": "heart_rate", "time": time, "value": value, **kw}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fs", [BENCHMARK_48H, BENCHMARK_STAY], ids=lambda f: f.name)
def test_random_payloads_match_the_reference(seed: int, fs: FeatureSet) -> None:
    rng = np.random.default_rng(seed)
    max_hours = 60.0 if fs.window_hours is not None else 230.0
    payloads = [StayPayload.model_validate(random_stay(
        rng, bad=float(rng.choice([0.0, 0.0, 0.002, 0.01, 0.05])), max_hours=max_hours))
        for _ in range(60)]
    for i, p in enumerate(payloads):
        for kw in ({}, {"strict": True}, {"max_observations": 25}):
            a = reference.ingest_stay(p, fs, **kw)
            b = fast.ingest_stay(p, fs, **kw)
            assert_same_stay(a, b, f"payload {i} {kw}")
    both(payloads, fs)
    both(payloads, fs, strict=True)


def test_the_examples_and_full_stays_match_the_reference() -> None:
    for name, fs in (("mortality_stay_benchmark17.json", BENCHMARK_48H),
                     ("mortality_stay.json", FEATURE_SETS["physionet2012-full"]),
                     ("phenotypes_stay.json", BENCHMARK_STAY)):
        p = StayPayload.model_validate(json.loads((REPO / "examples" / name).read_text()))
        both([p], fs)
        both([p, p], fs, strict=True)


def test_fast_path_is_taken_exactly_when_no_row_has_a_problem(monkeypatch) -> None:
    calls: list[int] = []
    per_row = fast._add_rows

    def spy(*args: Any) -> None:
        calls.append(1)
        per_row(*args)

    monkeypatch.setattr(fast, "_add_rows", spy)
    rng = np.random.default_rng(99)
    taken = 0
    for _ in range(300):
        p = StayPayload.model_validate(random_stay(rng, bad=0.01))
        ref = reference.ingest_stay(p, BENCHMARK_48H, strict=True)
        calls.clear()
        assert_same_stay(ref, fast.ingest_stay(p, BENCHMARK_48H, strict=True))
        row_problems = [q for q in ref.problems if q.rule not in STAY_RULES]
        assert bool(calls) == bool(row_problems), [q.rule for q in ref.problems]
        taken += not calls
    assert taken > 100  # the sample holds plenty of acceptable stays


def test_cleaning_sign_of_zero_and_window_edges() -> None:
    # np.clip turns -0.0 into 0.0 where the valid low is 0: the result must keep doing so.
    zeros = [hr(-0.0), hr(0.0, 2.0), hr(-0.0, -0.0), {"variable": "ph", "time": 3,
                                                        "value": -0.0}]
    for fs in (BENCHMARK_48H, BENCHMARK_STAY):
        both([stay(zeros)], fs)
        both([stay([hr(time=-0.0), hr(time=0.0)])], fs)
        both([stay([hr(time=0.0), hr(time=-0.0)])], fs)
    late = [hr(time=t) for t in (48.0, 48.0 + 1e-7, 48.000002, 240.0, 47.0)]
    both([stay(late)], BENCHMARK_48H)
    both([stay(late)], BENCHMARK_STAY)
    both([stay([hr(time=240.0001)])], BENCHMARK_STAY)
    dropped = [{"variable": "ph", "time": 1, "value": 735},
               {"variable": "ph", "time": 50, "value": 0.1}]
    both([stay(dropped)], BENCHMARK_48H)  # every row dropped: last time falls back to 0
    both([stay(dropped)], BENCHMARK_STAY, strict=True)


def test_spellings_units_and_categories() -> None:
    obs = [
        {"variable": " HEART RATE ", "time": 1, "value": 80},
        {"variable": "Glascow coma scale total", "time": 1, "value": 15},
        {"variable": "gcs_total", "time": 2, "value": "15.0"},
        {"variable": "gcs_eye", "time": 2, "value": 4},
        {"variable": "gcs_eye", "time": 3, "value": " 4 "},
        {"variable": "gcs_eye", "time": 3, "value": "4.0"},
        {"variable": "capillary_refill_rate", "time": 3, "value": " Delayed "},
        {"variable": "capillary_refill_rate", "time": 3, "value": 1, "unit": ""},
        {"variable": "temperature", "time": 4, "value": 98.6, "unit": " °f "},
        {"variable": "glucose", "time": 4, "value": 7, "unit": "MMOL/L"},
        {"variable": "fio2", "time": 4, "value": 40, "unit": "percent"},
        {"variable": "fio2", "time": 5, "value": 0.4, "unit": "1"},
        {"variable": "weight", "time": 5, "value": 180, "unit": "lbs"},
        {"variable": "height", "time": 5, "value": 1.8, "unit": "m"},
        {"variable": "heart_rate", "time": 6, "value": 80, "unit": ""},
        {"variable": "systolic_bp", "time": 6, "value": 120, "unit": "mm[Hg]"},
    ]
    for fs in (BENCHMARK_48H, BENCHMARK_STAY):
        both([stay(obs)], fs)
        for bad in (
            {"variable": "gcs_eye", "time": 1, "value": 2.5},
            {"variable": "gcs_eye", "time": 1, "value": "bogus"},
            {"variable": "gcs_eye", "time": 1, "value": 4, "unit": " "},
            {"variable": "gcs_eye", "time": 1, "value": 4, "unit": "mmHg"},
            {"variable": "heart_rate", "time": 1, "value": "80"},
            {"variable": "heart_rate", "time": 1, "value": 80, "unit": " "},
            {"variable": "heart_rate", "time": 1, "value": 80, "unit": "mmHg"},
            {"variable": "glucose", "time": 1, "value": 7},
            {"variable": "glucose", "time": 1, "value": 7, "unit": ""},
            {"variable": "heartrate", "time": 1, "value": 80},
            {"variable": "", "time": 1, "value": 80},
        ):
            both([stay([*obs, bad, *obs])], fs)
            both([stay([*obs, bad])], fs, strict=True)


def test_iso_timestamps_and_timezones() -> None:
    naive, aware = "2026-01-01T06:00:00", "2026-01-01T06:00:00+02:00"
    for adm in (None, naive, aware):
        for times in ([f"2026-01-01T07:{m:02d}:00" for m in (0, 30)],
                      [f"2026-01-01T07:{m:02d}:00+02:00" for m in (0, 30)],
                      ["2026-01-01T07:00:00", "2026-01-01T07:00:00Z"],
                      ["2026-01-01T05:00:00", 3.5], [1.5, "2026-01-03T08:00:00"]):
            kw = {} if adm is None else {"admission_time": adm}
            for fs in (BENCHMARK_48H, BENCHMARK_STAY):
                both([stay([hr(time=t) for t in times], **kw)], fs)


def test_wide_form() -> None:
    def wide(columns: dict[str, list[Any]], hours: list[float] | None = None,
             units: dict[str, str] | None = None) -> StayPayload:
        return StayPayload.model_validate({"wide": {
            "hours": hours or [0.5, 1.5, 2.5], "columns": columns, "units": units or {}}})

    good = {"Heart Rate": [80, None, 82], "glucose": [None, 7, None],
            "gcs_eye": ["3 To speech", None, 4], "heart_rate": [None, 81, None]}
    units = {"glucose": "mmol/L"}
    for fs in (BENCHMARK_48H, BENCHMARK_STAY):
        both([wide(good, units=units)], fs)
        both([wide(good, units={**units, "nope": "kg"})], fs)
        both([wide(good)], fs)  # glucose without its unit
        both([wide({**good, "short": [1, 2], "lactate": [1, None, 2]}, units=units)], fs)
        both([wide({"heart_rate": [400, None, -5], "ph": [None, 6.0, 11]})], fs)
        both([wide({"heart_rate": [400, None, -5]})], fs, strict=True)
        both([wide({"heart_rate": [None, None, None]})], fs)
        both([wide({})], fs)
        both([wide({"heart_rate": [80, 81, 82]}, hours=[-1, 0, 300])], fs)
        both([wide(good, units=units)], fs, max_observations=3)


def test_limits_and_empty_payloads() -> None:
    many = [hr(time=i % 40) for i in range(30)]
    for fs in (BENCHMARK_48H, BENCHMARK_STAY):
        both([stay([]), stay(many), stay(many, demographics={"sex": "male"})], fs)
        both([stay(many)], fs, max_observations=29)
        both([stay(many)], fs, max_observations=30)
        both([stay([], demographics={"age": 50})], fs)


def test_constructed_payloads_with_unvalidated_types() -> None:
    """Objects pydantic never produces (bools, ints) still give the reference's answer."""
    def built(*obs: tuple[str, Any, Any, str | None]) -> StayPayload:
        return StayPayload.model_construct(observations=[
            Observation.model_construct(variable=v, time=t, value=x, unit=u)
            for v, t, x, u in obs])

    for s in (built(("gcs_eye", 1.0, True, None), ("gcs_eye", 2.0, 1.0, None)),
              built(("capillary_refill_rate", 1.0, 1.0, None),
                    ("capillary_refill_rate", 2.0, True, None)),
              built(("heart_rate", 1, 80, None), ("heart_rate", 2, 81, None)),
              built(("heart_rate", 1.0, 80, None), ("heart_rate", 2.0, 81.5, None)),
              built(("heart_rate", 1.0, True, None), ("ph", 2.0, 7.4, None)),
              built(("gcs_eye", 1.0, 4, None), ("gcs_total", 1, 15, None))):
        both([s], BENCHMARK_48H)


def test_memo_limit_and_threads(monkeypatch) -> None:
    """Past the memo's capacity, and from many threads, the answers stay the reference's."""
    monkeypatch.setattr(fast, "_MEMO_LIMIT", 8)
    fs = dataclasses.replace(BENCHMARK_48H, name="memo-test")  # fresh tables
    rng = np.random.default_rng(5)
    payloads = [StayPayload.model_validate(random_stay(rng, bad=0.01)) for _ in range(40)]
    refs = [reference.ingest_stay(p, fs) for p in payloads]
    assert len(fast._tables(fs).pairs) == 0
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for p, r in zip(payloads, refs, strict=True):
                assert_same_stay(r, fast.ingest_stay(p, fs))
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    t = fast._tables(fs)
    assert t.n_pairs == 8 and t.n_categories <= 8  # full, and never past the limit


def test_wide_tables_take_the_per_column_path_when_acceptable(monkeypatch) -> None:
    """An acceptable wide table is read column by column, no cell visited on its own
    (`_add_rows`), and gives the reference's rows, field paths and notices; in any other the
    refused cells are judged one by one."""
    generic: list[int] = []
    cells = fast._add_rows

    def spy(*args: Any) -> Any:
        generic.append(1)
        return cells(*args)

    monkeypatch.setattr(fast, "_add_rows", spy)
    rng = np.random.default_rng(17)
    taken = fell_back = 0
    for i in range(400):
        d = random_stay(rng, bad=0.0 if i % 2 else 0.02)
        if "wide" not in d:
            continue
        p = StayPayload.model_validate(d)
        for fs in (BENCHMARK_48H, BENCHMARK_STAY):
            generic.clear()
            assert_same_stay(reference.ingest_stay(p, fs), fast.ingest_stay(p, fs), f"{i}")
            taken += not generic
            fell_back += bool(generic)
    assert taken > 40 and fell_back > 0
