"""Payload validation: every rule names the field path, cleaning gives warnings or errors."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY
from scehr.schemas.ingest import ingest, ingest_stay
from scehr.schemas.payloads import StayPayload
from scehr.schemas.tensorize import discretize


def stay(obs: list[dict], **kw) -> StayPayload:
    return StayPayload.model_validate({"observations": obs, **kw})


def rules(s) -> list[tuple[tuple, str]]:
    return [(tuple(p.loc), p.rule) for p in s.problems]


def test_each_problem_names_its_field_and_rule() -> None:
    s = ingest_stay(stay([
        {"variable": "lactate", "time": 1, "value": 2},
        {"variable": "glucose", "time": 1, "value": 100},
        {"variable": "temperature", "time": 1, "value": 37, "unit": "K"},
        {"variable": "gcs_total", "time": 1, "value": 16},
        {"variable": "heart_rate", "time": -1, "value": 80},
        {"variable": "heart_rate", "time": 2, "value": "fast"},
        {"variable": "heart_rate", "time": "2026-01-01T00:00:00", "value": 80},
    ]), BENCHMARK_48H)
    assert rules(s) == [
        (("observations", 0, "variable"), "unknown_variable"),
        (("observations", 1, "unit"), "unit_required"),
        (("observations", 2, "unit"), "unit_not_accepted"),
        (("observations", 3, "value"), "unknown_category"),
        (("observations", 4, "time"), "time_negative"),
        (("observations", 5, "value"), "number_required"),
        (("observations", 6, "time"), "admission_time_required"),
    ]
    assert "mg/dL" in s.problems[1].allowed


def test_nan_and_infinity_are_rejected_by_the_model() -> None:
    with pytest.raises(ValidationError):
        StayPayload.model_validate_json(
            '{"observations": [{"variable": "heart_rate", "time": 1, "value": NaN}]}')
    with pytest.raises(ValidationError):
        stay([{"variable": "heart_rate", "time": float("inf"), "value": 80}])


def test_exactly_one_form_and_no_extra_fields() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        StayPayload.model_validate({})
    with pytest.raises(ValidationError):
        stay([], extra=1)


def test_empty_payload_and_observation_limit() -> None:
    assert rules(ingest_stay(stay([]), BENCHMARK_48H)) == [(("observations",), "empty_payload")]
    many = [{"variable": "heart_rate", "time": 1, "value": 80}] * 5
    s = ingest_stay(stay(many), BENCHMARK_48H, max_observations=4)
    assert rules(s) == [(("observations",), "too_many_observations")]


def test_cleaning_warns_and_strict_turns_it_into_errors() -> None:
    obs = [{"variable": "glucose", "time": 1, "value": 2500, "unit": "mg/dL"},
           {"variable": "temperature", "time": 2, "value": 20, "unit": "Cel"},
           {"variable": "heart_rate", "time": 47, "value": 80}]
    s = ingest_stay(stay(obs), BENCHMARK_48H)
    codes = {(n.code, n.variable) for n in s.notices}
    assert ("value_dropped", "glucose") in codes and ("value_clipped", "temperature") in codes
    assert s.value.tolist() == [26.0, 80.0]
    strict = ingest_stay(stay(obs), BENCHMARK_48H, strict=True)
    assert [p.rule for p in strict.problems] == ["out_of_range_dropped", "out_of_range_clipped"]


def test_implausible_values_become_missing_naming_the_rule() -> None:
    obs = [{"variable": "heart_rate", "time": 1, "value": 0},
           {"variable": "Systolic blood pressure", "time": 1, "value": 0},
           {"variable": "ph", "time": 2, "value": 735},  # pH x 100: divided
           {"variable": "ph", "time": 3, "value": 6.4},  # inside the benchmark's range, not pH
           {"variable": "heart_rate", "time": 4, "value": 80}]
    s = ingest_stay(stay(obs), BENCHMARK_48H)
    notes = [(n.code, n.variable, n.loc) for n in s.notices if n.code.startswith("value_")]
    assert notes == [("value_rescaled", "ph", ["observations", 2]),
                     ("value_implausible", "heart_rate", ["observations", 0]),
                     ("value_implausible", "systolic_bp", ["observations", 1]),
                     ("value_implausible", "ph", ["observations", 3])]
    msg = next(n.message for n in s.notices if n.code == "value_implausible")
    assert "rule: heart_rate > 0" in msg and "80" not in msg
    assert s.value.tolist() == [7.35, 80.0] and s.source.tolist() == [2, 4]
    strict = ingest_stay(stay(obs), BENCHMARK_48H, strict=True)
    assert [(p.rule, p.allowed) for p in strict.problems] == [
        ("implausible_value", "heart_rate > 0"), ("implausible_value", "systolic_bp > 0"),
        ("implausible_value", "ph >= 6.5 and <= 8 (x100 values divided by 100)")]


def test_payloads_name_variables_by_id_alias_or_loinc_code() -> None:
    from scehr.schemas.featureset import FEATURE_SETS

    full = FEATURE_SETS["physionet2012-full"]
    obs = [{"variable": "lactate", "time": 1, "value": 2.0},
           {"variable": "BUN", "time": 1, "value": 20, "unit": "mg/dL"},
           {"variable": "2160-0", "time": 1, "value": 88.42, "unit": "umol/L"},  # creatinine
           {"variable": "76213-8", "time": 1, "value": 60},  # invasive diastolic pressure
           {"variable": "ICUType", "time": 0, "value": "sicu"}]
    s = ingest_stay(stay(obs), full)
    assert not s.problems
    got = {full.variables[c].id: v for c, v in zip(s.channel.tolist(), s.value.tolist(),
                                                    strict=True)}
    assert got == pytest.approx({"lactate": 2.0, "bun": 20.0, "creatinine": 1.0,
                                 "invasive_diastolic_bp": 60.0, "icu_type": 3.0})
    # In the benchmark set the same invasive code is the merged diastolic channel.
    bench = ingest_stay(stay([{"variable": "76213-8", "time": 1, "value": 60}]), BENCHMARK_48H)
    assert BENCHMARK_48H.variables[int(bench.channel[0])].id == "diastolic_bp"
    unknown = ingest_stay(stay([{"variable": "lactate", "time": 1, "value": 2.0}]),
                          BENCHMARK_48H)
    assert [p.rule for p in unknown.problems] == ["unknown_variable"]
    # a catalog variable this feature set does not read says so; a typo does not
    assert "not an input of this model (feature set benchmark76-48h)" in \
        unknown.problems[0].message
    typo = ingest_stay(stay([{"variable": "lactat", "time": 1, "value": 2.0}]), BENCHMARK_48H)
    assert typo.problems[0].message == "unknown variable 'lactat'"


def test_iso_times_with_admission_and_wide_form_match_long_form() -> None:
    long = stay([
        {"variable": "heart_rate", "time": "2026-01-01T02:30:00", "value": 90},
        {"variable": "Glucose", "time": "2026-01-01T05:00:00", "value": 7, "unit": "mmol/L"},
        {"variable": "gcs_eye", "time": "2026-01-01T05:00:00", "value": 3},
    ], admission_time="2026-01-01T00:00:00")
    wide = StayPayload.model_validate({"wide": {
        "hours": [2.5, 5.0],
        "columns": {"Heart Rate": [90, None], "glucose": [None, 7],
                    "Glascow coma scale eye opening": [None, "3 To speech"]},
        "units": {"glucose": "mmol/L"},
    }})
    a, b = ingest([long], BENCHMARK_48H), ingest([wide], BENCHMARK_48H)
    xa, _ = discretize(a.observations, BENCHMARK_48H, a.end_hours)
    xb, _ = discretize(b.observations, BENCHMARK_48H, b.end_hours)
    np.testing.assert_array_equal(xa, xb)


def test_warnings_for_short_stay_and_unobserved_channels() -> None:
    s = ingest_stay(stay([{"variable": "heart_rate", "time": 3, "value": 80}]), BENCHMARK_48H)
    codes = [n.code for n in s.notices]
    assert "stay_shorter_than_window" in codes and codes.count("channel_not_observed") == 16


def test_one_bad_stay_does_not_affect_the_others() -> None:
    good = stay([{"variable": "heart_rate", "time": 1, "value": 80}], demographics={"age": 70})
    bad = stay([{"variable": "nope", "time": 1, "value": 80}])
    r = ingest([bad, good, good], BENCHMARK_STAY)
    assert r.ok == [1, 2] and r.observations.n_stays == 2
    assert r.static_raw[:, 0].tolist() == [70.0, 70.0] and np.isnan(r.static_raw[0, 1])
