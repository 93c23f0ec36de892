"""Text in payloads: a lone UTF-16 surrogate is refused on every path, at no per-string cost
on the JSON one (where pydantic's own parser already refuses it)."""

from __future__ import annotations

import json
import sys
from types import FrameType
from typing import Any

import pytest
from pydantic import ValidationError

from scehr.schemas.payloads import StayPayload

_OBS = {"variable": "heart_rate", "time": 1.0, "value": 80.0, "unit": "bpm"}


def _errors(make: Any) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as e:
        make()
    return e.value.errors(include_url=False, include_input=False)


@pytest.mark.parametrize(("stay", "loc"), [
    ({"id": "\ud800", "observations": [_OBS]}, ("id",)),
    ({"observations": [{**_OBS, "variable": "hr\udfff"}]}, ("observations", 0, "variable")),
    ({"observations": [{**_OBS, "unit": "\ud800"}]}, ("observations", 0, "unit")),
    ({"observations": [{**_OBS, "value": "x\ud800"}]},
     ("observations", 0, "value", "function-after[_unicode_text(), str]")),
    ({"wide": {"hours": [1.0], "columns": {"hr\ud800": [80.0]}}},
     ("wide", "columns", None, "[key]")),  # None: the key as pydantic prints it
])
def test_a_lone_surrogate_from_python_is_refused_by_its_field(stay: dict, loc: tuple) -> None:
    """Python input (a batch's stays, a FHIR Bundle's, `json.loads` of a refused body): the
    field's path, with the union member named as it always was, and the rule."""
    errs = _errors(lambda: StayPayload.model_validate(stay))
    found = [tuple(None if want is None else part for part, want in zip(e["loc"], loc,
                                                                       strict=False))
             + e["loc"][len(loc):] for e in errs if e["type"] == "string_unicode"]
    assert found == [loc]


def test_a_lone_surrogate_in_json_is_refused_by_the_parser() -> None:
    """The premise of skipping the check on JSON input: the escape never becomes a string."""
    raw = json.dumps({"id": "\ud800", "observations": [_OBS]}).encode()
    assert [e["type"] for e in _errors(lambda: StayPayload.model_validate_json(raw))] == \
        ["json_invalid"]
    pair = json.dumps({"id": "\U0001f600", "observations": [_OBS]}).encode()
    assert StayPayload.model_validate_json(pair).id == "\U0001f600"


def test_json_input_calls_no_python_per_string() -> None:
    """A 29 kB stay has about 900 strings: a Python call each was 0.08 ms of a 2.5 ms request."""
    raw = json.dumps({"id": "a", "observations": [_OBS] * 50}).encode()
    calls: list[str] = []

    def count(frame: FrameType, event: str, _: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_unicode_text":
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        StayPayload.model_validate_json(raw)
    finally:
        sys.setprofile(None)
    assert calls == []
    sys.setprofile(count)
    try:
        StayPayload.model_validate(json.loads(raw))
    finally:
        sys.setprofile(None)
    assert len(calls) == 1 + 50 * 2  # the id, each observation's variable and unit
