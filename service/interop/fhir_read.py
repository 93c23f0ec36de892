"""FHIR JSON read straight: each Observation read once, into what the stay takes of it.

The lean models (`scehr.service.interop.fhir_lean`) say which elements of an Observation the adapter
reads, with FHIR's types and rules. `ObservationReader.read` reads exactly those elements from
the Observation's JSON without building a model object per element: a primitive in its common
form (a code or URI of visible ASCII, a printable ASCII string, an id of FHIR's alphabet, a
dateTime with seconds and a timezone, a finite number) is taken after a regular expression or a
type check, any other goes through the lean model's own type (`fhir_core.types`); the required
elements and the choice-of-type rule ("one of value[x]", from the library's model:
`fhir_lean.choices`) are the lean model's. What the lean model refuses, the reader refuses
(`Invalid`): the caller then validates the resource with the lean model, whose 422 names the
element and the rule. The result (`ObservationRead`) is what `fhir_in.StayBuilder` lays out as
the stay's columns: id, status, subject and encounter references, effective time, and per value
(the Observation's own and each component's) its first LOINC code, the model's variable it maps
to, the value, its unit and the value[x] read. What a stay repeats (codes, units, references,
times) is checked once per request.

`bundle` reads a complete Bundle (no `link`, `total` nor `entry.search`) whose entries are
objects; any other is left to the lean model (None). tests/service/test_svc_fhir_read.py holds
both to the lean models on generated and mutated resources.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from fhir_core.types import (
    CodeType,
    DecimalType,
    IdType,
    InstantType,
    IntegerType,
    StringType,
    UriType,
)
from pydantic import TypeAdapter, ValidationError
from pydantic_core import TzInfo

from scehr.schemas.variables import LOINC_SYSTEM, Variable, by_loinc
from scehr.service.interop.fhir_lean import TIMES, DateTime, choices

#: An id in the lean `IdType` (its alphabet, at most 64 characters; the library allows 255).
_ID = re.compile(r"[A-Za-z0-9\-.]{1,64}")
#: A code or URI in the lean types: visible ASCII, no whitespace.
_TOKEN = re.compile(r"[!-~]+")
#: A FHIR string the lean `StringType` accepts: printable ASCII, not empty.
_TEXT = re.compile(r"[ -~]+")
#: A dateTime with seconds and a timezone FHIR's pattern and pydantic both accept (the offset
#: within FHIR's -13:59..+14:00 less +14:00, a year from 1000); the date itself is checked by
#: `datetime.fromisoformat`.
_DATE_TIME = re.compile(r"[1-9][0-9]{3}-[01][0-9]-[0-3][0-9]T(?:[01][0-9]|2[0-3]):[0-5][0-9]:"
                        r"[0-5][0-9](Z|([+-])(0[0-9]|1[0-3]):([0-5][0-9]))")
INT32 = 2**31
UCUM = "http://unitsofmeasure.org"
#: What `StayBuilder` says of a value[x] it does not read.
NO_VALUE = "no supported value[x] (valueQuantity, valueInteger, valueString)"
#: The lean models' primitive types, by name.
_TYPES: dict[str, Any] = {"code": CodeType, "uri": UriType, "string": StringType, "id": IdType,
                          "decimal": DecimalType, "integer": IntegerType,
                          "instant": InstantType, "dateTime": DateTime}

Loinc = tuple[str | None, Variable | None]
#: One value of an Observation or of a component: (its first LOINC code, or the one that maps
#: to the variable; the model's variable; value; unit; the value[x] read, or NO_VALUE).
Value = tuple[str | None, Variable | None, float | str | None, str | None, str]


class Invalid(Exception):
    """The lean model refuses the resource: validate it to name the element and the rule."""


@cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    return TypeAdapter(_TYPES[kind])


def _typed(kind: str, value: Any, context: dict[str, Any] | None = None) -> Any:
    """`value` as the lean model's type `kind` gives it; `Invalid` where it refuses it."""
    try:
        return _adapter(kind).validate_python(value, context=context)
    except ValidationError:
        raise Invalid from None


def _token(value: Any, kind: str, seen: set[str]) -> str:
    """A code or URI (`kind`; not None). `seen`: the request's strings of the common form."""
    if type(value) is str and (value in seen or (
            _TOKEN.fullmatch(value) is not None and not seen.add(value))):  # type: ignore[func-returns-value]
        return value
    return _typed(kind, value)  # type: ignore[no-any-return]


def _string(value: Any, seen: set[str]) -> str:
    """A FHIR string (not None), as `_token`."""
    if type(value) is str and (value in seen or (
            _TEXT.fullmatch(value) is not None and not seen.add(value))):  # type: ignore[func-returns-value]
        return value
    return _typed("string", value)  # type: ignore[no-any-return]


def _id(value: Any) -> str:
    return value if type(value) is str and _ID.fullmatch(value) else _typed("id", value)


#: The choice elements a stay's Observations usually give, one of each group (effective[x],
#: value[x]): an Observation or component without any other cannot break the rule.
_USUAL = frozenset({"effectiveDateTime", "valueQuantity"})


@cache
def _choice(fhir_type: str) -> tuple[tuple[frozenset[str], ...], frozenset[str]]:
    """A FHIR type's choice groups (`fhir_lean.choices`), and their elements but `_USUAL`."""
    groups = tuple(frozenset(g) for g in choices(fhir_type))
    return groups, frozenset().union(*groups) - _USUAL


def _one_of_each(raw: dict[str, Any], choice: tuple[tuple[frozenset[str], ...],
                                                     frozenset[str]]) -> None:
    """The lean models' choice-of-type rule (`choice`: a type's `_choice`): at most one
    element of each group given."""
    groups, others = choice
    keys = raw.keys()
    if keys.isdisjoint(others):
        return
    for group in groups:
        both = keys & group
        if len(both) > 1 and sum(raw[k] is not None for k in both) > 1:
            raise Invalid


def date_time(text: str) -> datetime | None:
    """A dateTime with seconds and a timezone, as the lean `DateTime` gives it (pydantic's
    `TzInfo`), when in the common form `_DATE_TIME`; None otherwise."""
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


@dataclass(slots=True)
class ObservationRead:
    """What the stay reads of an Observation."""

    id: str | None
    status: str
    subject: str | None  # subject.reference
    encounter: str | None  # encounter.reference
    when: datetime | None  # the effective date-time (a date, or no time: None)
    value: Value  # its own code and value[x]
    components: tuple[Value, ...]


class ObservationReader:
    """Reads a request's Observations (`read`) for the model whose LOINC codes are `codes`.
    `context`: the request's validation context (`fhir_lean.seen_times`), whose dateTimes it
    shares with the lean models."""

    __slots__ = ("choices", "codes", "context", "loincs", "texts", "times", "tokens", "units")

    def __init__(self, codes: Mapping[str, Variable], context: dict[str, Any]) -> None:
        self.codes, self.context = codes, context
        self.choices = _choice("Observation"), _choice("ObservationComponent")
        self.times: dict[str, Any] | None = context.get(TIMES)
        self.tokens: set[str] = set()  # codes and URIs of the common form
        self.texts: set[str] = set()  # strings of the common form
        self.loincs: dict[tuple[str, str], Loinc] = {}  # by a single coding's (system, code)
        self.units: dict[tuple[Any, Any, Any], str | None] = {}  # by (unit, system, code)

    def read(self, raw: dict[str, Any]) -> ObservationRead:
        """The Observation `raw` as the stay reads it; `Invalid` where the lean model
        refuses it. A status, subject reference or charting time this request has already
        read (a stay repeats them hundreds of times) is taken from the request's caches in
        line, without a call; the element readers below read the rest (the code and unit
        through caches of their own) and fill the caches."""
        if not raw.keys().isdisjoint(self.choices[0][1]):
            _one_of_each(raw, self.choices[0])
        get = raw.get
        status, code, ident = get("status"), get("code"), get("id")
        if status is None or code is None:  # required
            raise Invalid
        subject, encounter, components = get("subject"), get("encounter"), get("component")
        if components is not None and type(components) is not list:
            raise Invalid
        if not (type(status) is str and status in self.tokens):
            status = _token(status, "code", self.tokens)
        if subject is not None:
            ref = subject.get("reference") if type(subject) is dict else None
            subject = ref if type(ref) is str and ref in self.texts else \
                self._reference(subject)
        when = get("effectiveDateTime")
        if not (type(when) is str and self.times is not None and
                type(when := self.times.get(when)) is datetime):
            when = self._when(raw)
        quantity = get("valueQuantity")  # the usual value[x]; `_value` reads any
        return ObservationRead(
            None if ident is None else _id(ident), status, subject,
            None if encounter is None else self._reference(encounter), when,
            (*self._loinc(code), *(self._value(raw) if quantity is None else
                                   self._quantity(quantity))),
            tuple(map(self._component, components)) if components else ())

    def _component(self, raw: Any) -> Value:
        if type(raw) is not dict:
            raise Invalid
        _one_of_each(raw, self.choices[1])
        code = raw.get("code")
        if code is None:  # required
            raise Invalid
        return (*self._loinc(code), *self._value(raw))

    def _date_time(self, text: Any) -> Any:
        """A dateTime, through the request's cache (`fhir_lean.seen_times`): a datetime, or
        a date or year alone as the lean `DateTime` gives them."""
        times = self.times
        if type(text) is str:
            if times is not None and (out := times.get(text)) is not None:
                return out
            out = date_time(text)
            if out is not None:
                if times is not None:
                    times[text] = out
                return out
        return _typed("dateTime", text, self.context)

    # ------------------------------------------------------------ elements

    def _reference(self, holder: Any) -> str | None:
        """The `reference` of a Reference element (None: it has none)."""
        if type(holder) is not dict:
            raise Invalid
        ref = holder.get("reference")
        if type(ref) is str and ref in self.texts:  # a stay names its Patient again and again
            return ref
        return None if ref is None else _string(ref, self.texts)

    def _when(self, raw: dict[str, Any]) -> datetime | None:
        """The effective time: effectiveDateTime when a date-time, else effectiveInstant,
        else the start (or, without one, the end) of effectivePeriod when a date-time."""
        given = raw.get("effectiveDateTime")
        if given is not None:  # then the others are None (`_one_of_each`)
            given = self._date_time(given)
            return given if isinstance(given, datetime) else None
        instant, period = raw.get("effectiveInstant"), raw.get("effectivePeriod")
        if instant is not None:
            return _typed("instant", instant)  # type: ignore[no-any-return]
        if period is None:
            return None
        if type(period) is not dict:
            raise Invalid
        start, end = period.get("start"), period.get("end")
        start = None if start is None else self._date_time(start)
        end = None if end is None else self._date_time(end)
        when = start if start is not None else end
        return when if isinstance(when, datetime) else None

    def _loinc(self, concept: Any) -> Loinc:
        """(first LOINC code, the variable it maps to) of a CodeableConcept; a single coding's
        once per request."""
        if type(concept) is not dict:
            raise Invalid
        coding = concept.get("coding")
        if coding is None:
            return None, None
        if type(coding) is not list:
            raise Invalid
        if len(coding) == 1 and type(c := coding[0]) is dict:
            key = (c.get("system"), c.get("code"))
            if type(key[0]) is str and type(key[1]) is str:
                found = self.loincs.get(key)  # type: ignore[arg-type]
                if found is None:
                    found = self.loincs[key] = loinc_of(  # type: ignore[index]
                        [self._coding(c)], self.codes)
                return found
        return loinc_of([self._coding(c) for c in coding], self.codes)

    def _coding(self, c: Any) -> tuple[str | None, str | None]:
        if type(c) is not dict:
            raise Invalid
        system, code = c.get("system"), c.get("code")
        return (None if system is None else _token(system, "uri", self.tokens),
                None if code is None else _token(code, "code", self.tokens))

    def _value(self, raw: dict[str, Any]) -> tuple[float | str | None, str | None, str]:
        """(value, unit, the value[x] read) of an Observation or a component: valueQuantity
        with a value, else valueInteger, else valueString."""
        q = raw.get("valueQuantity")
        if q is not None:  # then the others are None (`_one_of_each`)
            return self._quantity(q)
        integer, text = raw.get("valueInteger"), raw.get("valueString")
        if integer is not None:
            if not (type(integer) is int and -INT32 <= integer < INT32):
                integer = _typed("integer", integer)
            return float(integer), None, "valueInteger"
        if text is not None:
            return _string(text, self.texts), None, "valueString"
        return None, None, NO_VALUE

    def _quantity(self, q: Any) -> tuple[float | None, str | None, str]:
        """`_value` of a valueQuantity: a JSON number as the float of the library's `Decimal`
        of it; its unit, system and code read once per request for each combination."""
        if type(q) is not dict:
            raise Invalid
        key = (q.get("unit"), q.get("system"), q.get("code"))
        try:
            unit = self.units[key]
        except KeyError:
            unit = self.units[key] = self._unit(*key)
        except TypeError:  # an unhashable element: not a string
            raise Invalid from None
        number = q.get("value")
        if number is None:
            return None, None, NO_VALUE
        kind = type(number)
        if not ((kind is int and -INT32 < number < INT32) or (
                kind is float and math.isfinite(number))):
            number = _typed("decimal", number)
        return float(number), unit, "valueQuantity"

    def _unit(self, unit: Any, system: Any, code: Any) -> str | None:
        return unit_of(None if system is None else _token(system, "uri", self.tokens),
                       None if code is None else _token(code, "code", self.tokens),
                       None if unit is None else _string(unit, self.texts))


# ---------------------------------------------------------------- the Bundle


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


def bundle(raw: dict[str, Any]) -> Bundle | None:
    """The Bundle `raw` as the lean model reads it (its entries' resources not looked at:
    each is read by its own type after), when complete (no `link`, `total` nor
    `entry.search`); None otherwise, or where the lean model refuses it (it then names
    why)."""
    entries = raw.get("entry")
    if "link" in raw or "total" in raw or raw.get("type") is None or (
            entries is not None and type(entries) is not list):
        return None
    tokens: set[str] = set()
    out = []
    try:
        for e in entries or ():
            if type(e) is not dict or "search" in e:
                return None
            resource, url = e.get("resource"), e.get("fullUrl")
            if resource is not None and type(resource) is not dict:
                return None
            out.append(BundleEntry(None if url is None else _token(url, "uri", tokens),
                                   resource))
        ident = raw.get("id")
        return Bundle(None if ident is None else _id(ident), _token(raw["type"], "code", tokens),
                      None if entries is None else out)
    except Invalid:
        return None
