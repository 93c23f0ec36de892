"""A fast path for the commonest FHIR resource, an Observation with one value, and for the
Bundle around it.

Validating an Observation with its lean model (`scehr.service.interop.fhir_lean`) is mostly
pydantic building a model object per element (Observation, CodeableConcept, Coding,
Reference, Quantity) and the library's Python dateTime validator. A stay is hundreds of
Observations of one shape: status, code, subject (and encounter), effectiveDateTime and
valueQuantity (or valueInteger). `observation` reads that shape with plain dict and type
checks that accept only a strict subset of what the lean model accepts (ASCII strings without
whitespace for codes and URIs, printable ASCII for strings, ids of the FHIR alphabet; a finite
JSON number for a decimal; a 32-bit int; a dateTime with seconds and a timezone), and gives
the same values (datetimes with pydantic's `TzInfo`, decimals as the library's `Decimal`).
Anything else, malformed or merely unusual (components, valueString, effectivePeriod, nulls,
another value[x]), returns None: the caller validates the resource with the lean model, so
every refusal keeps its location, rule and message. `bundle` does the same for a complete Bundle
(no `link`, `total` or `entry.search`) whose entries are objects.
tests/service/test_svc_fhir_fast.py checks both subsets against the lean models on generated
and mutated resources.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import TzInfo

from scehr.service.interop.fhir_lean import TIMES, DateTime, choices

#: An id, code or URI the lean types accept: visible ASCII, no whitespace (id: its own
#: alphabet, at most 64 characters; the library allows 255).
_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
_TOKEN = re.compile(r"[!-~]+")
#: A FHIR string the lean `StringType` accepts: printable ASCII, not empty.
_TEXT = re.compile(r"[ -~]+")
#: A dateTime with seconds and a timezone FHIR's pattern and pydantic both accept (the offset
#: within FHIR's -13:59..+14:00 less +14:00, a year from 1000); the date itself is checked by
#: `datetime.fromisoformat`.
_DATE_TIME = re.compile(r"[1-9][0-9]{3}-[01][0-9]-[0-3][0-9]T(?:[01][0-9]|2[0-3]):[0-5][0-9]:"
                        r"[0-5][0-9](Z|([+-])(0[0-9]|1[0-3]):([0-5][0-9]))")
INT32 = 2**31
T = TypeVar("T")
#: The validation context key of the strings a request holds that are in `_TOKEN`.
TOKENS = "fastTokens"
#: ... and of its CodeableConcepts of one coding, by (system, code).
CONCEPTS = "fastConcepts"
#: The choice-of-type elements this path reads: effective[x] as a dateTime, value[x] as a
#: Quantity or an integer. Any other (or two values) sends the resource to the lean model,
#: which checks "one of value[x]".
_READ = frozenset({"effectiveDateTime", "valueQuantity", "valueInteger"})
_VALUES = frozenset({"valueQuantity", "valueInteger"})


@dataclass(slots=True)
class Coding:
    system: str | None
    code: str | None


@dataclass(slots=True)
class CodeableConcept:
    coding: list[Coding] | None


@dataclass(slots=True)
class Reference:
    reference: str | None


@dataclass(slots=True)
class Quantity:
    value: Decimal | None
    unit: str | None
    system: str | None
    code: str | None


@dataclass(slots=True)
class Observation:
    """The elements of a lean `Observation` the adapter reads, as the lean model gives them."""

    id: str | None
    status: str
    code: CodeableConcept
    subject: Reference | None
    effectiveDateTime: Any
    valueQuantity: Quantity | None
    valueInteger: int | None
    encounter: Reference | None = None
    effectiveInstant: None = None
    effectivePeriod: None = None
    valueString: None = None
    component: None = None

    @staticmethod
    def get_resource_type() -> str:
        return "Observation"


@cache
def _choice_keys() -> frozenset[str]:
    return frozenset(k for group in choices("Observation") for k in group)


@cache
def _date_time() -> TypeAdapter[Any]:
    return TypeAdapter(DateTime)


class _Fallback(Exception):
    """Not in the subset: validate with the lean model."""


def _opt(raw: dict[str, Any], key: str, ok: set[str]) -> str | None:
    """The code or URI at `key` (None when absent) if in the subset, else `_Fallback`. `ok`:
    the strings of this request already found in it (a stay repeats a few dozen codes)."""
    if key not in raw:
        return None
    value = raw[key]
    if type(value) is str and (value in ok or (
            _TOKEN.fullmatch(value) is not None and not ok.add(value))):  # type: ignore[func-returns-value]
        return value
    raise _Fallback


def _text(value: Any, ok: set[str]) -> bool:
    """A FHIR string in the subset (one of `ok` is)."""
    return type(value) is str and (value in ok or _TEXT.fullmatch(value) is not None)


def reference(holder: Any, ok: set[str], texts: set[str]) -> str | None:
    """The `reference` of a Reference element (None: it has none) when in the subset, else
    `_Fallback`. `texts`: the strings of this request already found FHIR strings (a stay
    names its Patient and Encounter hundreds of times)."""
    if type(holder) is not dict:
        raise _Fallback
    if "reference" not in holder:
        return None
    ref = holder["reference"]
    if type(ref) is not str:
        raise _Fallback
    if ref not in texts:
        if not _text(ref, ok):
            raise _Fallback
        texts.add(ref)
    return ref


Pairs = list[tuple[str | None, str | None]]


def read_codings(raw: Any, ok: set[str], seen: dict[tuple[str, str], T],
                 build: Callable[[Pairs | None], T]) -> T:
    """`build` of a CodeableConcept's (system, code) pairs (None: no `coding` element) when it
    is in the subset, else `_Fallback`. A single coding's result is built once per request
    (`seen`, by (system, code); read only: a stay repeats a few dozen codes)."""
    if type(raw) is not dict:
        raise _Fallback
    if "coding" not in raw:
        return build(None)
    coding = raw["coding"]
    if type(coding) is not list:
        raise _Fallback
    if len(coding) == 1 and type(c := coding[0]) is dict:
        key = (c.get("system"), c.get("code"))
        if type(key[0]) is str and type(key[1]) is str:
            found = seen.get(key)  # type: ignore[arg-type]
            if found is None:
                found = seen[key] = build(  # type: ignore[index]
                    [(_opt(c, "system", ok), _opt(c, "code", ok))])
            return found
    pairs = []
    for c in coding:
        if type(c) is not dict:
            raise _Fallback
        pairs.append((_opt(c, "system", ok), _opt(c, "code", ok)))
    return build(pairs)


def _as_concept(pairs: Pairs | None) -> CodeableConcept:
    return CodeableConcept(None if pairs is None else [Coding(s, c) for s, c in pairs])


def _decimal(value: Any) -> Decimal:
    """The library's `Decimal` of a JSON number (a float through its shortest text)."""
    kind = type(value)
    if kind is int and -INT32 < value < INT32:
        return Decimal(value)
    if kind is float and math.isfinite(value):
        return Decimal(str(value))
    raise _Fallback


def _quantity(raw: Any, ok: set[str]) -> Quantity:
    if type(raw) is not dict or "value" not in raw:
        raise _Fallback
    unit = raw.get("unit")
    if "unit" in raw and not _text(unit, ok):
        raise _Fallback
    return Quantity(_decimal(raw["value"]), unit, _opt(raw, "system", ok),
                    _opt(raw, "code", ok))


def date_time(text: str) -> datetime | None:
    """A dateTime with seconds and a timezone, as the lean `DateTime` gives it (pydantic's
    `TzInfo`), when in the subset `_DATE_TIME`; None otherwise."""
    m = _DATE_TIME.fullmatch(text)
    if m is None:
        return None
    try:
        out = datetime.fromisoformat(text)
    except ValueError:  # e.g. February 30th
        return None
    zone, sign, hours, minutes = m.groups()
    offset = 0 if zone == "Z" else (int(hours) * 3600 + int(minutes) * 60) * (
        -1 if sign == "-" else 1)
    return out.replace(tzinfo=TzInfo(offset))


def _when(text: Any, context: dict[str, Any] | None) -> Any:
    """effectiveDateTime as the lean `DateTime` gives it (through its per-request cache)."""
    if type(text) is not str:
        raise _Fallback
    seen = context.get(TIMES) if context is not None else None
    if seen is not None and text in seen:
        return seen[text]
    out = date_time(text)
    if out is None:
        try:
            out = _date_time().validate_python(text, context=context)
        except ValidationError:
            raise _Fallback from None
    elif seen is not None:
        seen[text] = out
    return out


def observation(raw: dict[str, Any], context: dict[str, Any] | None = None
                ) -> Observation | None:
    """The Observation `raw` as the lean model reads it, when it is in this path's subset;
    None otherwise (then the lean model decides, and names any error)."""
    keys = raw.keys()
    given = keys & _choice_keys()
    if not given <= _READ or given >= _VALUES or "component" in keys or "status" not in keys:
        return None
    ok = context.setdefault(TOKENS, set()) if context is not None else set()
    concepts = context.setdefault(CONCEPTS, {}) if context is not None else {}
    texts: set[str] = set()
    try:
        subject = Reference(reference(raw["subject"], ok, texts)) if "subject" in keys \
            else None
        encounter = Reference(reference(raw["encounter"], ok, texts)) if "encounter" in keys \
            else None
        ident = raw.get("id")
        if "id" in keys and not (type(ident) is str and _ID.fullmatch(ident)):
            return None
        integer = raw.get("valueInteger")
        if "valueInteger" in keys and not (type(integer) is int and -INT32 <= integer < INT32):
            return None
        return Observation(
            ident, _opt(raw, "status", ok),
            read_codings(raw.get("code"), ok, concepts, _as_concept), subject,
            _when(raw["effectiveDateTime"], context) if "effectiveDateTime" in keys else None,
            _quantity(raw["valueQuantity"], ok) if "valueQuantity" in keys else None, integer,
            encounter)
    except _Fallback:
        return None


@dataclass(slots=True)
class BundleEntry:
    fullUrl: str | None
    resource: dict[str, Any] | None
    search: None = None


@dataclass(slots=True)
class Bundle:
    """The elements of a lean `Bundle` the adapter reads: a complete collection (no `link`,
    `total` nor `entry.search`) whose entries are objects."""

    id: str | None
    type: str
    entry: list[BundleEntry] | None
    total: None = None
    link: None = None

    @staticmethod
    def get_resource_type() -> str:
        return "Bundle"


def bundle(raw: dict[str, Any]) -> Bundle | None:
    """The Bundle `raw` as the lean model reads it (its entries' resources not looked at:
    each is validated by its own type after), when in this path's subset; None otherwise."""
    keys = raw.keys()
    if "link" in keys or "total" in keys or "type" not in keys:
        return None
    ok: set[str] = set()
    try:
        ident = raw.get("id")
        if "id" in keys and not (type(ident) is str and _ID.fullmatch(ident)):
            return None
        kind = _opt(raw, "type", ok)
        if "entry" not in keys:
            return Bundle(ident, kind, None)  # type: ignore[arg-type]
        entries = raw["entry"]
        if type(entries) is not list:
            return None
        out = []
        for e in entries:
            if type(e) is not dict or "search" in e:
                return None
            resource = e.get("resource")
            if "resource" in e and type(resource) is not dict:
                return None
            out.append(BundleEntry(_opt(e, "fullUrl", ok), resource))
        return Bundle(ident, kind, out)  # type: ignore[arg-type]
    except _Fallback:
        return None
