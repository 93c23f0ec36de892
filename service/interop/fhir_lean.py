"""Lean FHIR R4 validation: exactly the elements the adapter reads, with FHIR's own rules.

`fhir.resources` validates every element of every resource (about a millisecond per
Observation, most of a FHIR request's cost). The adapter reads a few dozen elements, so by
default only those are validated, by small pydantic models built from the same primitive types
(`fhir_core.types`: the FHIR regular expressions for dateTime, code, id, decimal...), the same
required elements and the same choice-of-type ("one of value[x]") rule taken from the library's
own models. A malformed element the adapter reads is refused with the same location and rule as
the full validation; elements it never reads (Encounter.class, unknown elements, resources of
other types) are not looked at. The full validation stays an opt-in
(`SCEHR_FHIR_VALIDATION=full`).
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, ClassVar

from fhir.resources.R4B import get_fhir_model_class
from fhir_core.types import (
    CodeType,
    DateTimeType,
    DateType,
    DecimalType,
    IdType,
    InstantType,
    IntegerType,
    StringType,
    UnsignedIntType,
    UriType,
)
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError


def _required(value: Any, info: ValidationInfo) -> Any:
    """A required primitive element, refused as `fhir.resources` refuses it."""
    if value is None:
        raise PydanticCustomError("model_field_validation.missing",
                                  "Value for the field '{name}' is required.",
                                  {"name": info.field_name})
    return value


def _present() -> Any:
    """A required primitive's field: absent is checked by `_required`, not by pydantic."""
    return Field(None, validate_default=True)


#: The validation context key of a request's dateTime cache (`seen_times`).
TIMES = "dateTimes"


def seen_times() -> dict[str, dict[str, Any]]:
    """A validation context whose dateTime strings are validated once per request."""
    return {TIMES: {}}


def _once(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
    """A dateTime string already validated in this request (`seen_times` context): its value
    again. A stay's Observations share their charting times, and the library's dateTime
    validator is Python (several microseconds each); a refused one is never stored, so it
    is refused each time with the library's own error."""
    seen = info.context.get(TIMES) if isinstance(info.context, dict) else None
    if seen is None or not isinstance(value, str):
        return handler(value)
    out = seen.get(value)
    if out is None:
        out = seen[value] = handler(value)
    return out


#: FHIR dateTime, validated by the library's type, once per distinct string in a request.
DateTime = Annotated[DateTimeType, WrapValidator(_once)]


@cache
def choices(resource_type: str) -> tuple[tuple[str, ...], ...]:
    """The choice-of-type groups (value[x], effective[x]...) of a FHIR type, from the
    library's model: one place for the rule."""
    groups: dict[str, list[str]] = {}
    for name, f in get_fhir_model_class(resource_type).model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if extra.get("one_of_many"):
            groups.setdefault(str(extra["one_of_many"]), []).append(f.alias or name)
    return tuple(tuple(g) for g in groups.values())


class _Lean(BaseModel):
    """Reads the named elements, ignores the rest (never looked at, never kept)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)



class _Choices(_Lean):
    """A FHIR type with choice-of-type elements (value[x]...)."""

    fhir_type: ClassVar[str]

    @model_validator(mode="wrap")
    @classmethod
    def _one_of_many(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        """At most one element of each choice group (value[x]...), checked after the
        elements themselves, as the library does (elements never read count too)."""
        out = handler(data)
        if isinstance(data, dict):
            for group in choices(cls.fhir_type):
                given = data.keys() & group  # at C speed; most hold one or none
                if len(given) > 1 and sum(data[k] is not None for k in given) > 1:
                    raise ValueError("Any of one field value is expected from this list "
                                     f"{list(group)}, but got multiple!")
        return out


class Coding(_Lean):
    system: UriType | None = None
    code: CodeType | None = None


class CodeableConcept(_Lean):
    coding: list[Coding] | None = None


class Reference(_Lean):
    reference: StringType | None = None


class Period(_Lean):
    start: DateTime | None = None
    end: DateTime | None = None


class Quantity(_Lean):
    value: DecimalType | None = None
    unit: StringType | None = None
    system: UriType | None = None
    code: CodeType | None = None


class _Resource(_Lean):
    id: IdType | None = None


class ObservationComponent(_Choices):
    fhir_type: ClassVar[str] = "ObservationComponent"
    code: CodeableConcept
    valueQuantity: Quantity | None = None
    valueInteger: IntegerType | None = None
    valueString: StringType | None = None


class Observation(_Resource, _Choices):
    fhir_type: ClassVar[str] = "Observation"
    status: CodeType = _present()
    code: CodeableConcept
    subject: Reference | None = None
    encounter: Reference | None = None
    effectiveDateTime: DateTime | None = None
    effectiveInstant: InstantType | None = None
    effectivePeriod: Period | None = None
    valueQuantity: Quantity | None = None
    valueInteger: IntegerType | None = None
    valueString: StringType | None = None
    component: list[ObservationComponent] | None = None

    _status = field_validator("status", mode="before")(_required)


class Patient(_Resource, _Choices):
    fhir_type: ClassVar[str] = "Patient"
    gender: CodeType | None = None
    birthDate: DateType | None = None


class EncounterLocation(_Lean):
    location: Reference
    period: Period | None = None


class Encounter(_Resource):
    status: CodeType = _present()
    subject: Reference | None = None
    partOf: Reference | None = None
    period: Period | None = None
    location: list[EncounterLocation] | None = None

    _status = field_validator("status", mode="before")(_required)


class Location(_Resource):
    type: list[CodeableConcept] | None = None


class Procedure(_Resource, _Choices):
    fhir_type: ClassVar[str] = "Procedure"
    status: CodeType = _present()
    subject: Reference
    encounter: Reference | None = None
    code: CodeableConcept | None = None
    performedDateTime: DateTime | None = None
    performedPeriod: Period | None = None

    _status = field_validator("status", mode="before")(_required)


class BundleLink(_Lean):
    relation: StringType = _present()
    url: UriType = _present()

    _given = field_validator("relation", "url", mode="before")(_required)


class BundleEntrySearch(_Lean):
    mode: CodeType | None = None


class BundleEntry(_Lean):
    fullUrl: UriType | None = None
    resource: dict[str, Any] | None = None  # validated by its own type's model after
    search: BundleEntrySearch | None = None


class Bundle(_Resource):
    type: CodeType = _present()
    total: UnsignedIntType | None = None
    link: list[BundleLink] | None = None
    entry: list[BundleEntry] | None = None

    _type = field_validator("type", mode="before")(_required)


class Unread:
    """A resource of a type the adapter does not read: its id, nothing validated."""

    def __init__(self, id: Any) -> None:
        self.id = id if isinstance(id, str) else None


#: The lean model of each resource type the adapter reads.
MODELS: dict[str, type[_Resource]] = {m.__name__: m for m in (
    Observation, Patient, Encounter, Location, Procedure, Bundle)}
