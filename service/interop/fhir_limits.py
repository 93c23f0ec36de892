"""Limits on a FHIR (or CDS Hooks) body checked before its expensive parse.

FHIR validation costs about a millisecond per Observation and recurses once per nesting level,
so a Bundle over a limit is refused from its raw bytes first: nesting depth, the number of
JSON objects and the length of number literals come from a scan at C speed (bytes methods,
numpy running parity of the quotes and depth of the brackets, a count of `"Observation"`
bounding the Observations, a regular expression counting them only when that bound is over
the limit; never a Python loop over the body), then the exact entry and Observation counts
from the plain JSON parse, all before FHIR validation sees a byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from scehr.schemas.payloads import Problem
from scehr.service.errors import ApiError

#: Deepest JSON nesting accepted: FHIR resources nest ~12 levels (Bundle.entry.resource.
#: component.code.coding.extension...); extensions inside extensions need a few more.
MAX_DEPTH = 64
#: Longest number literal accepted (characters): a float64 needs 25 at most.
MAX_NUMBER_CHARS = 400
#: JSON objects per entry allowed, on average: an Observation has ~8 (entry, resource, code,
#: coding, subject, valueQuantity, effectivePeriod, meta).
OBJECTS_PER_ENTRY = 16
#: Entries besides the Observations (Patient, Encounter, Location, Procedures...).
OTHER_ENTRIES = 1_000

#: Every byte but the brackets and the quote: what `_brackets` keeps of a body.
_NOT_MARKS = bytes(range(256)).translate(None, b'{}[]"')
_QUOTE = ord('"')
_OPEN = ord("{")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("{"), ord("[")]] = 1
_STEP[[ord("}"), ord("]")]] = -1
_OBSERVATION = re.compile(rb'"resourceType"\s*:\s*"Observation"')
#: The characters of a JSON number literal as 1, every other byte as 0: a number longer than
#: the limit is a run of 1s (a substring search, not a regular expression).
_NUMBER_CHARS = bytes(int(chr(b) in "-+.0123456789eE") for b in range(256))
_LONG_NUMBER = b"\x01" * (MAX_NUMBER_CHARS + 1)


@dataclass(frozen=True)
class FhirLimits:
    """Per request: at most `max_observations` Observations (the stay limit of every route)."""

    max_observations: int

    @property
    def max_entries(self) -> int:
        return self.max_observations + OTHER_ENTRIES

    @property
    def max_objects(self) -> int:
        return OBJECTS_PER_ENTRY * self.max_entries


def _refuse(rule: str, message: str, allowed: str, loc: list[str | int] | None = None
            ) -> ApiError:
    return ApiError(422, "fhir_limit", [Problem(loc=loc or ["body"], rule=rule,
                                                message=message, allowed=allowed)])


def _unescaped(raw: bytes) -> bytes:
    """The body without its escaped backslashes and quotes: every quote left delimits a
    string."""
    return raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw


def structure(raw: bytes) -> bytes:
    """The body without its string literals: brackets, separators, numbers and literals."""
    return b"".join(_unescaped(raw).split(b'"')[0::2])


def _brackets(raw: bytes) -> np.ndarray:
    """The body's brackets outside its string literals, in order (a quote toggles "inside a
    string"; only brackets and quotes are looked at, as one small array)."""
    marks = np.frombuffer(_unescaped(raw).translate(None, _NOT_MARKS), dtype=np.uint8)
    quote = marks == _QUOTE
    # parity of the quotes so far, in one byte per mark: a running count in int32 would write
    # four times the memory, a large body's worth of fresh pages
    inside = np.bitwise_xor.accumulate(quote.view(np.uint8))
    return marks[(inside | quote) == 0]  # neither inside a string nor a quote


def check_raw(raw: bytes, limits: FhirLimits) -> None:
    """Observation count, object count, depth and number length from the raw bytes; 422
    `fhir_limit` naming the rule when over. Malformed JSON passes here and is refused by the
    parser after."""
    # contained ones too: an upper bound. Every match holds its own `"Observation"`, so that
    # string's count bounds the matches: the regular expression runs only above the limit
    observations = raw.count(b'"Observation"')
    if observations > limits.max_observations:
        observations = len(_OBSERVATION.findall(raw))
    if observations > limits.max_observations:
        raise _refuse("fhir_too_many_observations", f"the body holds {observations} "
                      "Observations", f"<= {limits.max_observations} (the observations a "
                      "stay may have)")
    brackets = _brackets(raw)
    objects = int(np.count_nonzero(brackets == _OPEN))
    if objects > limits.max_objects:
        raise _refuse("fhir_too_many_elements", f"the body holds {objects} JSON objects",
                      f"<= {limits.max_objects} ({OBJECTS_PER_ENTRY} per entry, "
                      f"{limits.max_entries} entries)")
    if brackets.size:
        depth = int(np.cumsum(_STEP[brackets], dtype=np.int32).max())
        if depth > MAX_DEPTH:
            raise _refuse("fhir_too_deep", f"the body nests {depth} levels deep (e.g. "
                          "extensions inside extensions)", f"<= {MAX_DEPTH} levels")
    # a long run of number characters anywhere, then (rare) outside the strings
    if _LONG_NUMBER in raw.translate(_NUMBER_CHARS) and \
            _LONG_NUMBER in structure(raw).translate(_NUMBER_CHARS):
        raise _refuse("fhir_number_too_long", "a number literal is longer than "
                      f"{MAX_NUMBER_CHARS} characters", f"<= {MAX_NUMBER_CHARS} characters "
                      "(a float64 needs 25)")


def check_bundle(bundle: Any, limits: FhirLimits, root: list[str | int] | None = None,
                 name: str = "Bundle") -> None:
    """Entry and Observation counts of a parsed (not yet validated) Bundle."""
    root = root or ["body"]
    entries = bundle.get("entry") if isinstance(bundle, dict) else None
    if not isinstance(entries, list):
        return  # FHIR validation names what is wrong
    if len(entries) > limits.max_entries:
        raise _refuse("fhir_too_many_entries", f"{name}.entry has {len(entries)} entries",
                      f"<= {limits.max_entries}", [*root, "entry"])
    if len(entries) <= limits.max_observations:
        return  # no more Observations than entries: none over the limit, nothing to count
    observations = sum(1 for e in entries if isinstance(e, dict)
                       and isinstance(r := e.get("resource"), dict)
                       and r.get("resourceType") == "Observation")
    if observations > limits.max_observations:
        raise _refuse("fhir_too_many_observations", f"{name} holds {observations} "
                      "Observations", f"<= {limits.max_observations} (the observations a "
                      "stay may have)", [*root, "entry"])
