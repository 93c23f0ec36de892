"""The serving path's reading of a fast-path Observation: straight to what the stay needs.

`fhir_fast.observation` gives an Observation of its subset as the lean model would (a
dataclass per element, decimals as `Decimal`), which `StayBuilder.add` then reads attribute by
attribute. When the reader knows the model's variables (`read_bundle`, the CDS Hooks
prefetch), an Observation in that very subset (the same checks, with the same helpers) is read
in one pass into an `ObservationRow`: its id, status, subject and encounter references,
effective time, its first LOINC code and the variable it maps to, and its value, unit and
value[x] kind as `StayBuilder` takes them from the lean model. `StayBuilder` applies its rules
(subject and encounter, status, time, codes, units) to it unchanged; anything outside the
subset returns None and goes the lean way. tests/service/test_svc_fhir_fast.py compares stays
read both ways.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scehr.schemas.variables import LOINC_SYSTEM, Variable, by_loinc
from scehr.service.interop.fhir_fast import (
    _ID,
    _READ,
    INT32,
    TOKENS,
    Pairs,
    _choice_keys,
    _Fallback,
    _opt,
    _text,
    _when,
    read_codings,
    reference,
)

UCUM = "http://unitsofmeasure.org"
#: What `StayBuilder` says of an Observation without a value it reads.
NO_VALUE = "no supported value[x] (valueQuantity, valueInteger, valueString)"

Loinc = tuple[str | None, Variable | None]


@dataclass(slots=True)
class ObservationRow:
    """What `StayBuilder.add` reads of a fast-path Observation, already read."""

    id: str | None
    status: str
    subject: str | None  # subject.reference
    encounter: str | None  # encounter.reference
    when: datetime | None  # effectiveDateTime when a date-time (a date is no time)
    code: str | None  # the first LOINC code, or the one that maps to `variable`
    variable: Variable | None
    value: float | None
    unit: str | None
    kind: str  # the value[x] read, or NO_VALUE
    component: None = None

    @staticmethod
    def get_resource_type() -> str:
        return "Observation"


def unit_of(system: str | None, code: str | None, unit: str | None) -> str | None:
    """A Quantity's unit as the catalog reads it: its UCUM code, else its display unit."""
    return code if code and system in (None, UCUM) else unit


def loinc_of(codings: Iterable[tuple[str | None, str | None]],
             codes: Mapping[str, Variable]) -> Loinc:
    """(first LOINC code, the variable of `codes` it maps to) of (system, code) codings: the
    first code that maps, else the first LOINC code with no variable."""
    first = None
    for system, code in codings:
        if system == LOINC_SYSTEM and code:
            first = first or code
            var = by_loinc(code, codes)
            if var is not None:
                return code, var
    return first, None


#: Keys of an Observation that send it to the lean model: a choice-of-type element this path
#: does not read, and components.
_LEAN_KEYS = frozenset(_choice_keys() - _READ) | {"component"}
_ABSENT = object()


def _quantity(raw: Any, ok: set[str], units: dict[tuple[Any, Any, Any], str | None]
              ) -> tuple[float, str | None]:
    """(value, unit) of a Quantity in the subset: a finite JSON number (an int within 32
    bits) is the float of the library's `Decimal` of it; its unit, system and code are
    checked once per request for each combination."""
    if type(raw) is not dict or "value" not in raw:
        raise _Fallback
    key = (raw.get("unit", _ABSENT), raw.get("system", _ABSENT), raw.get("code", _ABSENT))
    try:
        unit = units[key]
    except KeyError:
        unit = units[key] = _unit(raw, ok)
    except TypeError:  # an unhashable element: not in the subset
        raise _Fallback from None
    number = raw["value"]
    kind = type(number)
    if not ((kind is int and -INT32 < number < INT32)
            or (kind is float and math.isfinite(number))):
        raise _Fallback
    return float(number), unit


def _unit(raw: dict[str, Any], ok: set[str]) -> str | None:
    unit = raw.get("unit")
    if "unit" in raw and not _text(unit, ok):
        raise _Fallback
    return unit_of(_opt(raw, "system", ok), _opt(raw, "code", ok), unit)


class RowReader:
    """Reads a request's Observations (`read`) with its validation context and the model's
    `codes`; what repeats (codes, units) is checked once per request."""

    __slots__ = ("codes", "context", "loinc", "loincs", "ok", "texts", "units")

    def __init__(self, context: dict[str, Any], codes: Mapping[str, Variable]) -> None:
        self.context, self.codes = context, codes
        self.ok: set[str] = context.setdefault(TOKENS, set())
        self.texts: set[str] = set()  # references found FHIR strings
        self.loincs: dict[tuple[str, str], Loinc] = {}
        self.loinc: Callable[[Pairs | None], Loinc] = lambda pairs: loinc_of(pairs or (), codes)
        self.units: dict[tuple[Any, Any, Any], str | None] = {}

    def read(self, raw: dict[str, Any]) -> ObservationRow | None:
        """The Observation `raw` read for the stay, when in the subset of
        `fhir_fast.observation`; None otherwise (the lean model decides)."""
        keys = raw.keys()
        if not keys.isdisjoint(_LEAN_KEYS) or "status" not in keys or (
                "valueQuantity" in keys and "valueInteger" in keys):
            return None
        ok = self.ok
        try:
            subject = reference(raw["subject"], ok, self.texts) if "subject" in keys else None
            encounter = reference(raw["encounter"], ok, self.texts) if "encounter" in keys \
                else None
            ident = raw.get("id")
            if "id" in keys and not (type(ident) is str and _ID.fullmatch(ident)):
                return None
            value: float | None = None
            unit, kind = None, NO_VALUE
            if "valueQuantity" in keys:
                value, unit = _quantity(raw["valueQuantity"], ok, self.units)
                kind = "valueQuantity"
            elif "valueInteger" in keys:
                integer = raw["valueInteger"]
                if not (type(integer) is int and -INT32 <= integer < INT32):
                    return None
                value, kind = float(integer), "valueInteger"
            status = _opt(raw, "status", ok)
            code, var = read_codings(raw.get("code"), ok, self.loincs, self.loinc)
            when = _when(raw["effectiveDateTime"], self.context) \
                if "effectiveDateTime" in keys else None
        except _Fallback:
            return None
        return ObservationRow(ident, status, subject, encounter,  # type: ignore[arg-type]
                              when if isinstance(when, datetime) else None, code, var, value,
                              unit, kind)
