"""The batch envelope decoder equals `json.loads` of the UTF-8 body, errors included, and
runs Python code per JSON object (where the event loop's thread can take the GIL back)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scehr.service.interfaces import json_batch
from scehr.service.interfaces.json_batch import loads_envelope

values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                      | st.floats(allow_nan=False), lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(stays=st.lists(values, max_size=5), extra=st.dictionaries(st.text(max_size=4), values,
                                                                 max_size=2),
       indent=st.sampled_from([None, 1]))
def test_equals_json_loads(stays: list, extra: dict, indent: int | None) -> None:
    raw = json.dumps({**extra, "stays": stays}, indent=indent).encode()
    assert loads_envelope(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", [b'{"stays": [1,]}', b'{"stays": [1] ', b'{"stays": [1]} x',
                                 b"{,}", b'{"stays":[1 2]}', b'{"a": 1,}', b""])
def test_errors_as_json_loads(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads_envelope(raw)


@pytest.mark.parametrize("raw", [b'{"stays": ["\xff"]}', b'\xef\xbb\xbf{"stays": []}',
                                 '{"stays": []}'.encode("utf-16")])
def test_bytes_other_than_utf8_json_are_refused(raw: bytes) -> None:
    """A byte-order mark, UTF-16 and invalid UTF-8 are refused (as before the body was
    decoded by `json.loads` itself, which would read the first two)."""
    with pytest.raises(ValueError):
        loads_envelope(raw)


def test_each_object_is_a_call_into_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """One Python call per JSON object, each stay's own included: a multi-MB body is decoded
    in many short C steps, not one call that holds the GIL (and the event loop) throughout."""
    calls: list[int] = []

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        calls.append(len(obj))
        return obj

    monkeypatch.setattr(json_batch, "_let_the_loop_in", hook)
    stay = {"observations": [{"variable": "heart_rate", "time": t, "value": 80}
                             for t in range(3)]}
    assert loads_envelope(json.dumps({"stays": [stay] * 4}).encode())["stays"] == [stay] * 4
    assert len(calls) == 4 * (3 + 1) + 1  # observations, stays, the envelope
