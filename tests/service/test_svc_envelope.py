"""The batch envelope decoder (one stay per decode call) equals `json.loads`, errors included."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scehr.service.routes.predict import _loads_envelope

values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                      | st.floats(allow_nan=False), lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(stays=st.lists(values, max_size=5), extra=st.dictionaries(st.text(max_size=4), values,
                                                                 max_size=2),
       indent=st.sampled_from([None, 1]))
def test_equals_json_loads(stays: list, extra: dict, indent: int | None) -> None:
    raw = json.dumps({**extra, "stays": stays}, indent=indent).encode()
    assert _loads_envelope(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", [b'{"stays": [1,]}', b'{"stays": [1] ', b'{"stays": [1]} x',
                                 b"{,}", b'{"stays":[1 2]}', b'{"a": 1,}', b""])
def test_errors_as_json_loads(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        _loads_envelope(raw)
