"""Request bytes -> JSON -> a pydantic model, refused exactly as FastAPI refuses a body
parameter: the codecs read their bodies themselves (once, in the endpoint factory), so that
large ones are parsed off the event loop, and keep FastAPI's answers to bad ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

_Body = TypeVar("_Body", bound=BaseModel)


def loads_json(raw: bytes) -> Any:
    """`json.loads`'s result, faster: pydantic's JSON parser (Rust; no Python object per
    token), and `json.loads` for what that parser refuses (lone surrogates, a byte-order mark,
    UTF-16, malformed JSON), which also gives the standard errors. Whatever the Rust parser
    accepts, `json.loads` reads the same (numbers, NaN/Infinity, duplicate keys). Object keys
    come from pydantic's string cache (as `json.loads` shares a body's repeated keys): a FHIR
    Bundle repeats a few dozen keys thousands of times, and shared key objects make building,
    reading (dict look-ups by identity) and freeing the tree faster; values, which may be a
    patient's, are never cached."""
    try:
        return from_json(raw, cache_strings="keys")
    except ValueError:
        return json.loads(raw)


def as_body_parameter(model: type[_Body], raw: bytes,
                      loads: Callable[[bytes], Any] = loads_json) -> _Body:
    """`model` from the request bytes, refused exactly as FastAPI refuses a body parameter:
    422 `json_invalid` at the byte position, 400 for bytes JSON cannot hold, 422 per field."""
    try:
        obj = loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos),
                                       "msg": "JSON decode error",
                                       "ctx": {"error": e.msg}}]) from None
    except (ValueError, RecursionError):  # invalid UTF-8, a 5,000-digit int, deep nesting
        raise HTTPException(400, "There was an error parsing the body") from None
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_input=False)]) from None
