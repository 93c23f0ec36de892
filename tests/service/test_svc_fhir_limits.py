"""The raw-bytes scan of `scehr.service.interop.fhir_limits`: brackets inside strings never count.
"""

from __future__ import annotations

import json

import pytest

from scehr.service.errors import ApiError
from scehr.service.interop.fhir_limits import MAX_DEPTH, FhirLimits, _brackets, check_raw

LIMITS = FhirLimits(max_observations=100)


def _structural(raw: bytes) -> bytes:
    """The brackets of a JSON text outside its strings, by a per-character reference scan."""
    out, inside, escaped = bytearray(), False, False
    for ch in raw.decode():
        if inside:
            inside, escaped = (escaped or ch != '"'), (not escaped and ch == "\\")
        elif ch == '"':
            inside = True
        elif ch in "{}[]":
            out += ch.encode()
    return bytes(out)


@pytest.mark.parametrize("doc", [
    {"a": "{[}]", "b": [{"c": 'x"{{'}, "\\"], "d": "\\\\"},
    {"resourceType": "Bundle", "entry": [{"resource": {"id": "[[[", "note": '"]]]"'}}]},
    ["\\\"{", {"k\"[": ["]"]}, "\\\\\"[" * 3],
])
def test_brackets_outside_strings_match_a_reference_scan(doc: object) -> None:
    raw = json.dumps(doc).encode()
    assert _brackets(raw).tobytes() == _structural(raw)


def test_brackets_in_strings_never_count_towards_depth() -> None:
    check_raw(json.dumps({"text": "[" * (10 * MAX_DEPTH)}).encode(), LIMITS)
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    with pytest.raises(ApiError) as e:
        check_raw(deep, LIMITS)
    assert e.value.detail[0].rule == "fhir_too_deep"


def _observations(real: int, mentions: int) -> bytes:
    """A body with `real` Observation resources and `mentions` other `"Observation"`
    strings (a display text, a reference type)."""
    return json.dumps({"entry": [{"resource": {"resourceType": "Observation"}}] * real
                      + [{"display": "Observation"}] * mentions}).encode()


def test_observation_strings_that_are_not_resource_types_do_not_count() -> None:
    check_raw(_observations(LIMITS.max_observations, 3 * LIMITS.max_observations), LIMITS)


@pytest.mark.parametrize("mentions", [0, 500])
def test_observations_over_the_limit_are_counted_exactly(mentions: int) -> None:
    with pytest.raises(ApiError) as e:
        check_raw(_observations(LIMITS.max_observations + 1, mentions), LIMITS)
    assert e.value.detail[0].rule == "fhir_too_many_observations"
    assert f"holds {LIMITS.max_observations + 1} Observations" in e.value.detail[0].message
