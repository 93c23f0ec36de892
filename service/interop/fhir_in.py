"""FHIR R4 in: a Bundle (or CDS Hooks prefetch) -> the stay, its observations as columns.

Every Observation is read once, straight from its JSON, by one reader
(`scehr.service.interop.fhir_read`: the elements of the lean model `fhir_lean.Observation`, with its
types and rules); one it refuses is validated by that model, whose 422 names the FHIR path. The
other resources read (Patient, Encounter, Location, Procedure, the Bundle) are validated by their
lean models (`scehr.service.interop.fhir_lean`). Opted in (`SCEHR_FHIR_VALIDATION=full`),
`fhir.resources` validates every element of every resource first (the R4B models: R4B changed no
element of Patient, Encounter, Observation, Bundle or RiskAssessment, and the R4-only release of the
library needs pydantic 1). `StayBuilder` applies the stay's rules to what was read (the resource
belongs to the stay: `Belonging`; its status; its effective time; LOINC codes -> the model's
variables and UCUM units -> the catalog's conversions, through `scehr.schemas.variables`) and lays
the values out as `scehr.schemas.ingest.ObservationColumns`, which ingest checks, cleans and
tensorizes as it does a JSON payload's (`ColumnStay`), on the scoring path of `POST
/predict/{task}`. What cannot be used is skipped with a warning naming the resource; what is
malformed is a 422 naming the FHIR path (`FhirStay.locate` maps ingest's row paths back).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from fhir.resources.R4B import get_fhir_model_class
from pydantic import ValidationError

from scehr.schemas.ingest import ColumnStay, ObservationColumns
from scehr.schemas.payloads import Demographics, Problem
from scehr.schemas.variables import (
    BY_LOINC,
    LOINC_PANELS,
    VARIABLES,
    CategoryError,
    UnitError,
    Variable,
    loinc_index,
)
from scehr.service.errors import ApiError
from scehr.service.interop import fhir_lean, fhir_read
from scehr.service.interop.fhir_read import Invalid, ObservationRead, ObservationReader

#: CDC NHSN Healthcare Service Location codes (HSLOC, OID 2.16.840.1.113883.6.259), the code
#: system of HL7's ICU Locations value set: a Location.type -> the PhysioNet ICU type.
HSLOC = "https://www.cdc.gov/nhsn/cdaportal/terminology/codesystem/hsloc.html"
HSLOC_OID = "urn:oid:2.16.840.1.113883.6.259"
ICU_TYPES: dict[str, str] = {"1028-0": "1",  # Medical Cardiac Critical Care: coronary care
                             "1032-2": "2",  # Surgical Cardiothoracic Critical Care
                             "1027-2": "3",  # Medical Critical Care
                             "1030-6": "4"}  # Surgical Critical Care
SNOMED = "http://snomed.info/sct"
#: SNOMED CT 40617009 |Artificial respiration (procedure)|, FHIR's own mechanical
#: ventilation example: a Procedure with it -> mechanical_ventilation = 1 while performed.
VENTILATION = "40617009"
BUNDLE_TYPES = ("collection", "searchset")
SKIPPED_STATUS = ("entered-in-error", "cancelled")
#: A Procedure's statuses that say it was not done (its value set has no `cancelled`).
PROCEDURE_SKIPPED = ("entered-in-error", "not-done")
#: The longest performedPeriod expanded into hourly values (ten days, the longest window).
MAX_PERIOD_HOURS = 240
Loc = list[str | int]


def shown(text: str | None, limit: int = 64) -> str | None:
    """A client's code as echoed in a warning: at most `limit` characters (a 7 MB code is
    not sent back whole)."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def fhir_path(loc: Loc) -> str:
    """("entry", 3, "resource", "valueQuantity") -> "entry[3].resource.valueQuantity"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def expression(loc: Loc) -> str:
    """A request location as a FHIRPath-like expression: ["body", "entry", 3] ->
    "Bundle.entry[3]"; ["body", "prefetch", "patient"] -> "prefetch.patient"."""
    parts = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    if parts and parts[0] == "entry":
        parts = ["Bundle", *parts]
    return fhir_path(parts)


@dataclass
class Issue:
    """A warning about the FHIR input (no patient values in it)."""

    code: str
    message: str
    resource: str | None = None  # "Observation/o1"
    expression: str | None = None  # FHIR path of the element


@dataclass
class FhirStay:
    """The stay read from FHIR (its observations as columns, scored as a JSON payload is),
    with what an answer needs to point back."""

    payload: ColumnStay
    patient: str  # reference to the Patient
    encounter: str | None
    basis: list[str] = field(default_factory=list)  # references to the Observations used
    #: per observation (row of the columns): the FHIR element holding its value, and its
    #: value[x] kind
    sources: list[tuple[Loc, str]] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)
    #: per observation: the reference of the resource it came from
    refs: list[str] = field(default_factory=list)

    def contributed(self, rows: Sequence[int] | None) -> list[str]:
        """The references whose values reached the model (`rows`: the observations the model
        read, `StayResult.contributed_rows`); all of `basis` when unknown."""
        if rows is None:
            return self.basis
        used = {self.refs[r] for r in rows if r < len(self.refs)}
        return [b for b in self.basis if b in used]

    def locate(self, loc: Loc) -> Loc:
        """An observation's field path (`["observations", row, field]`, as ingest names a
        row) as the FHIR path it came from (for 422 problems and warnings)."""
        if len(loc) >= 2 and loc[0] == "observations" and isinstance(loc[1], int) \
                and loc[1] < len(self.sources):
            holder, kind = self.sources[loc[1]]
            field = loc[2] if len(loc) > 2 else None
            tail = {"value": [kind, "value"] if kind == "valueQuantity" else [kind],
                    "unit": [kind, "code"], "time": ["effective"]}.get(str(field), [])
            return [*holder, *tail]
        return ["body", *loc]


@dataclass(slots=True)
class Located:
    """A resource of type `kind` as read (an `ObservationRead`, a lean or `fhir.resources`
    model, `fhir_lean.Unread`), where it sits in the request, and how others reference it."""

    kind: str
    resource: Any
    loc: Loc
    full_url: str | None = None

    @property
    def ref(self) -> str | None:
        ident = self.resource.id
        return f"{self.kind}/{ident}" if ident else self.full_url

    @property
    def names(self) -> frozenset[str]:
        """The references that name this resource in the request: `Type/id` and its
        fullUrl."""
        ident = self.resource.id
        return frozenset(n for n in (f"{self.kind}/{ident}" if ident else None,
                                     self.full_url) if n)


def reference_of(holder: Any) -> str | None:
    """The `reference` of a Reference element (a lean or full model's), None when absent."""
    return None if holder is None else holder.reference


@dataclass(frozen=True, slots=True)
class Belonging:
    """What names the stay: its Patient (`patient`: the references to it) and its Encounters
    (`encounters`: theirs, and those of the Encounters they are `partOf`). The one rule every
    reader applies to every resource it reads (Observation, Procedure, Encounter; a Location
    belongs through `Encounter.location`): its subject is the stay's Patient, else 422 (a
    resource of another patient, or of no named patient, never reaches the risk); its
    encounter, when it names one and the request holds Encounters, is one of them, else it
    is not used (`StayBuilder.belongs`: the same patient's data from another stay)."""

    patient: frozenset[str]
    encounters: frozenset[str] = frozenset()

    @staticmethod
    def of(patient: Located, encounters: Sequence[Located]) -> Belonging:
        names = set().union(*(e.names for e in encounters))
        names.update(r for e in encounters if (r := reference_of(e.resource.partOf)))
        return Belonging(patient.names, frozenset(names))

    def check_subject(self, item: Located, subject: str | None) -> None:
        """422 naming the element unless `subject` (the resource's subject.reference) names
        the stay's Patient."""
        if subject in self.patient:
            return
        ref = item.ref or expression(item.loc)
        allowed = " or ".join(sorted(self.patient)) or "a reference to the Bundle's Patient"
        if subject is None:
            raise ApiError(422, "invalid_fhir", [Problem(
                loc=[*item.loc, "subject"], rule="fhir_subject_required",
                message=f"{ref}: no subject.reference; every resource read must name the "
                "Bundle's Patient", allowed=allowed)])
        raise ApiError(422, "invalid_fhir", [Problem(
            loc=[*item.loc, "subject", "reference"], rule="fhir_subject_mismatch",
            message=f"{ref}: subject {shown(subject)!r} is not the bundle's Patient",
            allowed=allowed)])

    def in_stay(self, encounter: str | None) -> bool:
        """Whether a resource's encounter.reference is of this stay (none named, or no
        Encounter to compare with: it is)."""
        return encounter is None or not self.encounters or encounter in self.encounters


@dataclass(slots=True)
class Held:
    """An ICU Location an Encounter lists at the ICU admission."""

    start: tuple[bool, datetime | None]  # (has a period.start, it): no start sorts first
    icu: str
    item: Located


def _covers(period: Any, when: datetime) -> bool | None:
    """Whether an `Encounter.location` period holds `when` (start inclusive, end exclusive;
    no period, or no bound, holds any time); None when a bound is not a date-time with a
    timezone (a date alone does not say which side of an admission it falls)."""
    if period is None:
        return True
    start, end = period.start, period.end
    if any(t is not None and not (isinstance(t, datetime) and t.tzinfo is not None)
           for t in (start, end)):
        return None
    return (start is None or start <= when) and (end is None or when < end)


def problems_of(err: ValidationError, prefix: Loc, root: str) -> list[Problem]:
    """fhir.resources validation errors as Problems naming the FHIR path."""
    out = []
    for e in err.errors(include_input=False)[:50]:
        where = list(e.get("loc", ()))
        if e.get("type") == "model_validation_format" and where[-1:] == ["root"]:
            e["type"], where = "model_type", where[:-1]  # the library's wording of the same
        loc = [*prefix, *where]
        path = fhir_path([root, *where])
        if e.get("type") in ("json_invalid", "model_type"):  # not an object where an
            # element belongs (the library tries a string as JSON text): say what it is
            name = str(loc[-1]) if loc else ""
            kind = name[5:] if name.startswith("value") and name[5:6].isupper() else "complex"
            out.append(Problem(loc=loc, rule="fhir_object_expected",
                               message=f"{path}: a FHIR {kind} element is a JSON object"
                               + (", not a string" if e["type"] == "json_invalid" else ""),
                               allowed=f"a {kind} object"))
            continue
        out.append(Problem(loc=loc, rule=f"fhir_{e.get('type', 'invalid')}",
                           message=f"{path}: {e.get('msg', 'invalid')}",
                           allowed="a valid FHIR R4 element"))
    return out


def validate(model: type, raw: Any, prefix: Loc, root: str,
             context: dict[str, Any] | None = None) -> Any:
    """One resource validated (a lean model or fhir.resources'), or a 422 naming the FHIR
    path; `context`: the request's validation context (`fhir_lean.seen_times`)."""
    if not isinstance(raw, dict) or raw.get("resourceType") != model.__name__:
        raise ApiError(422, "invalid_fhir", [Problem(
            loc=[*prefix, "resourceType"], rule="fhir_resource_type",
            message=f"{root}: expected a FHIR {model.__name__} resource",
            allowed=model.__name__)])
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as e:
        raise ApiError(422, "invalid_fhir", problems_of(e, prefix, root)) from None


def refuse_incomplete(bundle: Any, prefix: Loc, root: str) -> None:
    """A searchset that is one page of more (a `next` link, or `total` above its matches) is
    never scored as if it were the whole stay: 422 saying what is missing."""
    nxt = [i for i, link in enumerate(bundle.link or []) if link.relation == "next"]
    matches = sum(1 for e in bundle.entry or [] if e.search is None or e.search.mode in
                  (None, "match"))
    if nxt:
        where = [*prefix, "link", nxt[0]]
        why = "has a `next` link: it is one page of a longer result"
    elif bundle.total is not None and bundle.total > matches:
        where, why = ([*prefix, "total"],
                      f"says total {bundle.total} but holds {matches} matching entries")
    else:
        return
    raise ApiError(422, "incomplete_bundle", [Problem(
        loc=where, rule="bundle_incomplete",
        message=f"{root} {why}; scoring part of a stay would give a wrong risk. Send every "
        "page (follow `next`, or raise _count) in one Bundle",
        allowed="a complete Bundle: no `next` link, and `total` equal to its entries")])


def model_for(resource_type: str, full: bool = False) -> type:
    """The model validating `resource_type`: the lean one of the elements the adapter reads,
    or, `full`, the `fhir.resources` one of every element."""
    return get_fhir_model_class(resource_type) if full else fhir_lean.MODELS[resource_type]


#: The resource types the library has answered for (a lookup costs microseconds per entry); at
#: most the library's own types, whatever clients send.
_KNOWN_TYPES: set[str] = {"Observation"}


def known_type(raw: Any, loc: Loc, root: str) -> str:
    """The resourceType of an entry's resource, refused (422 naming it) unless a FHIR R4
    resource type."""
    kind = raw.get("resourceType")
    if isinstance(kind, str) and kind in _KNOWN_TYPES:
        return kind
    try:
        if isinstance(kind, str) and kind.isalpha():
            get_fhir_model_class(kind)
            _KNOWN_TYPES.add(kind)
            return kind
    except ValueError:
        pass
    raise ApiError(422, "invalid_fhir", [Problem(
        loc=[*loc, "resourceType"], rule="fhir_resource_type",
        message=f"{root}.resourceType: {shown(str(kind))!r} is not a FHIR R4 resource type",
        allowed="a FHIR R4 resource type, e.g. Observation")])


def _entry_root(root: str, loc: Loc) -> str:
    """An entry's resource as messages name it, e.g. `Bundle.entry[3].resource` (`root`: the
    Bundle's; `loc` ends with the entry's `["entry", 3, "resource"]`)."""
    return f"{root}.{fhir_path(loc[-3:])}"


def read_observation(reader: ObservationReader, raw: Any, loc: Loc, root: str,
                     context: dict[str, Any], full: Any = None) -> ObservationRead:
    """An entry's Observation read for the stay by the one reader (`fhir_read`); one it
    refuses is validated by the lean model, whose 422 names the element and the rule. `full`:
    the `fhir.resources` model of it (full validation), which also takes an element given as
    JSON text: the library's own JSON of the resource is read then."""
    try:
        return reader.read(raw)
    except Invalid:
        pass
    if full is not None:
        try:
            return reader.read(json.loads(full.model_dump_json(by_alias=True,
                                                                exclude_none=True)))
        except Invalid:
            pass
    where = _entry_root(root, loc)
    validate(fhir_lean.Observation, raw, loc, where, context)
    raise RuntimeError(f"{where}: the lean model accepts an Observation its reader refuses")


def _entry_resource(raw: Any, loc: Loc, root: str, context: dict[str, Any],
                    reader: ObservationReader) -> tuple[str, Any]:
    """An entry's resource type and the resource read (lean validation)."""
    if raw.get("resourceType") == "Observation":
        return "Observation", read_observation(reader, raw, loc, root, context)
    kind = known_type(raw, loc, _entry_root(root, loc))
    if kind in fhir_lean.MODELS:
        return kind, validate(fhir_lean.MODELS[kind], raw, loc, _entry_root(root, loc), context)
    return kind, fhir_lean.Unread(raw.get("id"))


def _checked_types(raw: Any, prefix: Loc, root: str) -> None:
    """Every entry resource of a known type before the full validation (the library raises
    a KeyError, a 500, on an unknown one)."""
    for i, e in enumerate(raw.get("entry") or [] if isinstance(raw, dict) else []):
        res = e.get("resource") if isinstance(e, dict) else None
        if isinstance(res, dict):
            known_type(res, [*prefix, "entry", i, "resource"], f"{root}.entry[{i}].resource")


def bundle_resources(raw: Any, prefix: Loc = ("body",), root: str = "Bundle",
                     full: bool = False, codes: Mapping[str, Variable] = BY_LOINC
                     ) -> list[Located]:
    """The resources of a collection or searchset Bundle, validated (lean, or `full`), in entry
    order; a paged or truncated searchset is refused (`refuse_incomplete`). Observations are
    read for the stay (`read_observation`) with `codes`, the model's `loinc_index`."""
    if full:
        _checked_types(raw, list(prefix), root)
    bundle = fhir_read.bundle(raw) if not full and isinstance(raw, dict) and \
        raw.get("resourceType") == "Bundle" else None
    if bundle is None:
        bundle = validate(model_for("Bundle", full), raw, list(prefix), root)
    refuse_incomplete(bundle, list(prefix), root)
    if bundle.type not in BUNDLE_TYPES:
        raise ApiError(422, "invalid_fhir", [Problem(
            loc=[*prefix, "type"], rule="fhir_bundle_type",
            message=f"{root}.type is {bundle.type!r}", allowed=" or ".join(BUNDLE_TYPES))])
    out = []
    context = fhir_lean.seen_times()
    reader = ObservationReader(codes, context)
    read, head = reader.read, [*prefix, "entry"]
    for i, e in enumerate(bundle.entry or []):
        raw_resource = e.resource
        if raw_resource is None:
            continue
        loc = [*head, i, "resource"]
        if not full:
            try:  # most entries: an Observation the reader reads (`read_observation`)
                if raw_resource.get("resourceType") == "Observation":
                    out.append(Located("Observation", read(raw_resource), loc, e.fullUrl))
                    continue
            except Invalid:
                pass
            kind, resource = _entry_resource(raw_resource, loc, root, context, reader)
        elif (kind := e.resource.get_resource_type()) == "Observation":
            resource = read_observation(reader, raw["entry"][i]["resource"], loc, root,
                                        context, e.resource)
        else:
            resource = e.resource
        out.append(Located(kind, resource, loc, e.fullUrl))
    return out


def _one_patient(found: list[Located], prefix: Loc) -> Located:
    if len(found) != 1:
        raise ApiError(422, "invalid_fhir", [Problem(
            loc=list(prefix), rule="fhir_patient_count",
            message=f"found {len(found)} Patient resources; a stay belongs to one patient",
            allowed="exactly one Patient")])
    return found[0]


def _admission(encounters: list[Located], given: datetime | None, prefix: Loc) -> datetime:
    if given is not None:
        if given.tzinfo is None:
            raise ApiError(422, "invalid_fhir", [Problem(
                loc=["query", "admission_time"], rule="timezone_required",
                message="admission_time needs a timezone (FHIR times carry one)",
                allowed="an ISO 8601 date-time with an offset, e.g. 2026-01-15T08:00:00Z")])
        return given
    starts = {e.resource.period.start for e in encounters
              if e.resource.period is not None and e.resource.period.start is not None}
    if len(starts) == 1:
        start = starts.pop()
        if isinstance(start, datetime):
            return start
    why = ("no Encounter with period.start" if not starts else
           f"{len(starts)} Encounters with different period.start")
    raise ApiError(422, "admission_time_required", [Problem(
        loc=[*prefix, "Encounter", "period", "start"], rule="admission_time_required",
        message=f"the ICU admission time is unknown ({why}); send one Encounter whose "
        "period.start is the ICU admission (with a time), or the admission_time parameter",
        allowed="Encounter.period.start or ?admission_time=")])


def _age(patient: Any, admission: datetime) -> float | None:
    born = patient.birthDate
    if not isinstance(born, date) or isinstance(born, datetime):
        return None  # absent, or only a year / year-month: not precise enough for an age
    day = admission.date()
    years = day.year - born.year - ((day.month, day.day) < (born.month, born.day))
    return float(years) if 0 <= years <= 130 else None


def _demographics(patient: Any, admission: datetime) -> Demographics:
    sex = patient.gender if patient.gender in ("female", "male") else None
    return Demographics(age=_age(patient, admission), sex=sex)


class StayBuilder:
    """Lays the observations of the resources that belong to the stay out as its columns
    (`columns`), with a warning for each value not used and, per row, where it came from."""

    def __init__(self, admission: datetime, members: Belonging, ids: Collection[str]) -> None:
        self.admission = admission
        self.members = members
        self.ids = set(ids)  # the model's variables
        #: the columns, one entry per observation (`ObservationColumns`)
        self.variable: list[str] = []
        self.time: list[datetime] = []
        self.value: list[float | str] = []
        self.unit: list[str | None] = []
        self.sources: list[tuple[Loc, str]] = []
        #: the references used, in order (a dict as an ordered set: a stay of thousands of
        #: Observations is not a quadratic list search)
        self.basis: dict[str, None] = {}
        self.refs: list[str] = []
        self.issues: list[Issue] = []
        #: (variable, unit) -> why the unit is refused (None: accepted), once per request
        self._units: dict[tuple[str, str | None], str | None] = {}
        #: (variable, unit) of a numeric variable whose unit is accepted: a finite number
        #: with them is a row without another look (a stay repeats them hundreds of times)
        self._numbers: set[tuple[str, str | None]] = set()

    def columns(self) -> ObservationColumns:
        """The observations, in the order read, for ingest's rules (rows at
        `["observations", row]`, which `FhirStay.locate` maps back to FHIR paths)."""
        return ObservationColumns(self.variable, self.unit, self.time, self.value,
                                  admission=self.admission)

    def _warn(self, code: str, message: str, item: Located, path: Loc) -> None:
        self.issues.append(Issue(code, message, item.ref, expression(path)))

    def belongs(self, item: Located, subject: str | None, encounter: str | None) -> bool:
        """The stay's rule (`Belonging`) for a resource read: 422 when its subject is not
        the stay's Patient; False, with a warning, when it is of another encounter."""
        self.members.check_subject(item, subject)
        if self.members.in_stay(encounter):
            return True
        self._warn("other_encounter", f"{item.ref or expression(item.loc)}: encounter "
                   f"{shown(encounter)!r} is not an Encounter of this stay; not used", item,
                   [*item.loc, "encounter", "reference"])
        return False

    def skipped(self, item: Located, status: str | None, skipped: Sequence[str]) -> bool:
        """A resource whose status says it is void or was not done: a warning, True."""
        if status not in skipped:
            return False
        self._warn("status_skipped", f"{item.ref or expression(item.loc)}: status {status}, "
                   "not used", item, [*item.loc, "status"])
        return True

    def add(self, item: Located) -> None:
        """An Observation's values (its own, its components'), when it belongs to the stay,
        is not void and has an effective time with a timezone from the ICU admission on."""
        obs: ObservationRead = item.resource
        ref = item.ref or expression(item.loc)  # no id nor fullUrl: named by its place
        members = self.members  # the usual case (the stay's Patient, no other Encounter,
        # not void) tested in line: `belongs` and `skipped` say why another is not used
        if not (obs.subject in members.patient and members.in_stay(obs.encounter)) and \
                not self.belongs(item, obs.subject, obs.encounter):
            return
        if obs.status in SKIPPED_STATUS and self.skipped(item, obs.status, SKIPPED_STATUS):
            return
        when = obs.when
        if when is None:
            self._warn("no_effective_time", f"{ref}: no effectiveDateTime, effectiveInstant "
                       "or effectivePeriod with a time; not used", item, item.loc)
            return
        if when.tzinfo is None:
            self._warn("no_effective_time", f"{ref}: effective time without a timezone; "
                       "not used", item, item.loc)
            return
        if when < self.admission:
            self._warn("before_admission", f"{ref}: effective before the ICU admission; "
                       "not used", item, item.loc)
            return
        code, var = obs.value[:2]
        if var is None and not obs.components:
            what = "a panel without components" if code in LOINC_PANELS else \
                "not a variable of this model"
            self._warn("unmapped_code", f"{ref}: code {shown(code) or 'without a LOINC coding'} is "
                       f"{what}; not used", item, [*item.loc, "code"])
            return
        used = var is not None and self._add_value(item, ref, item.loc, obs.value, when)
        for i, part in enumerate(obs.components):
            used |= self._add_value(item, ref, [*item.loc, "component", i], part, when)
        if used:
            self.basis[ref] = None

    def _add_value(self, item: Located, ref: str, loc: Loc, part: fhir_read.Value,
                   when: datetime) -> bool:
        code, var, value, unit, kind = part
        if var is None:
            self._warn("unmapped_code", f"{ref}: code {shown(code) or 'without a LOINC coding'} at "
                       f"{fhir_path(loc)} is not a variable of this model; not used", item,
                       [*loc, "code"])
            return False
        if type(value) is float and (var.id, unit) in self._numbers and math.isfinite(value):
            self._row(var.id, when, value, unit, (loc, kind), ref)
            return True
        if isinstance(value, float) and not math.isfinite(value):  # > 308 digits: inf
            at = [*loc, kind, "value"]
            raise ApiError(422, "invalid_fhir", [Problem(
                loc=at, rule="fhir_value_out_of_range",
                message=f"{ref}: {expression(at)} is beyond the range of a number",
                allowed="a finite decimal (|value| < 1.8e308)")])
        if value is None:
            self._warn("no_value", f"{ref}: {kind} for {var.id}; not used", item, loc)
            return False
        try:
            if var.is_categorical:
                var.category_index(value)
                unit = None
            elif isinstance(value, str):
                raise UnitError(f"{var.id} needs a number (valueQuantity)")
            else:
                self._check_unit(var, unit)
                self._numbers.add((var.id, unit))
        except (UnitError, CategoryError) as e:
            self._warn("unit_not_convertible" if isinstance(e, UnitError) else
                       "value_not_a_category", f"{ref}: {e}; not used", item, loc)
            return False
        self._row(var.id, when, value, unit, (loc, kind), ref)
        return True

    def _row(self, variable: str, when: datetime, value: float | str, unit: str | None,
             source: tuple[Loc, str], ref: str) -> None:
        self.variable.append(variable)
        self.time.append(when)
        self.value.append(value)
        self.unit.append(unit)
        self.sources.append(source)
        self.refs.append(ref)

    def _check_unit(self, var: Variable, unit: str | None) -> None:
        """`var.unit_for(unit)` (the catalog's one rule), looked up once per variable and
        unit in a request: a stay repeats a few units hundreds of times."""
        key = (var.id, unit)
        if key not in self._units:
            try:
                var.unit_for(unit)
                self._units[key] = None
            except UnitError as e:
                self._units[key] = str(e)
        why = self._units[key]
        if why is not None:
            raise UnitError(why)

    def _direct(self, item: Located, variable: str, when: datetime, value: str | float,
                loc: Loc, kind: str) -> bool:
        """One observation of a catalog variable read from a non-Observation resource."""
        if variable not in self.ids:
            self._warn("unmapped_code", f"{item.ref or expression(item.loc)}: {variable} is not "
                       "a variable of this model; not used", item, loc)
            return False
        ref = item.ref or expression(item.loc)
        self._row(variable, when, value, None, (loc, kind), ref)
        self.basis[ref] = None
        return True

    def _icu_type(self, item: Located) -> str | None:
        """The ICU type of a Location whose type has an HSLOC ICU code, else a warning."""
        codes = [c.code for t in (item.resource.type or []) for c in (t.coding or [])
                 if c.system in (HSLOC, HSLOC_OID) and c.code]
        found = [ICU_TYPES[c] for c in codes if c in ICU_TYPES]
        if not found:
            self._warn("unmapped_code", f"{item.ref or expression(item.loc)}: no Location.type "
                       f"coding of {HSLOC} among {', '.join(sorted(ICU_TYPES))}; not used",
                       item, [*item.loc, "type"])
            return None
        return found[0]

    def add_locations(self, encounters: Sequence[Located], locations: Sequence[Located]
                      ) -> None:
        """The ICU type, at admission, from the stay's Encounters' `location` only: of the
        entries whose Location is in the request with an HSLOC ICU type, the one whose
        `period` holds the ICU admission (`_covers`; the latest `period.start` when several
        do). A Location no Encounter lists, one no entry of which holds the admission, and
        entries that disagree are warnings, never read."""
        listed: dict[str, list[tuple[Loc, Any]]] = {}  # Location reference -> its entries
        for enc in encounters:
            for i, entry in enumerate(enc.resource.location or []):
                if ref := reference_of(entry.location):
                    listed.setdefault(ref, []).append(([*enc.loc, "location", i], entry))
        held: list[Held] = []
        for item in locations:
            entries = [e for name in sorted(item.names) for e in listed.get(name, [])]
            if not entries:
                self._warn("location_not_referenced", f"{item.ref or expression(item.loc)}: "
                           "not a location of the stay's Encounter (Encounter.location); "
                           "not used", item, item.loc)
                continue
            icu = self._icu_type(item)
            if icu is None:
                continue
            spans = [(path, entry, _covers(entry.period, self.admission))
                     for path, entry in entries]
            for path, entry, covers in spans:
                if covers is None:
                    self._warn("no_effective_time", f"{item.ref or expression(item.loc)}: "
                               f"{expression(path)}.period has a bound without a time and "
                               "timezone; not used", item, [*path, "period"])
                elif covers:
                    start = entry.period.start if entry.period is not None else None
                    held.append(Held((start is not None, start), icu, item))
            if all(covers is False for _, _, covers in spans):
                self._warn("location_not_at_admission", f"{item.ref or expression(item.loc)}: "
                           "its Encounter.location period does not hold the ICU admission; "
                           "not used", item, [*spans[0][0], "period"])
        self._take_location(held)

    def _take_location(self, held: list[Held]) -> None:
        """Of the ICU locations held at the admission, the latest to start (no start comes
        before any start); if those disagree on the ICU type, none, with a warning each."""
        if not held:
            return
        latest = max(h.start for h in held)
        chosen = [h for h in held if h.start == latest]
        kept = {id(h.item) for h in chosen}
        for h in {id(h.item): h for h in held if id(h.item) not in kept}.values():
            self._warn("location_not_at_admission", f"{h.item.ref or expression(h.item.loc)}: "
                       "a location entered later holds the ICU admission; not used", h.item,
                       h.item.loc)
        if len({h.icu for h in chosen}) > 1:
            for h in {id(h.item): h for h in chosen}.values():
                self._warn("location_ambiguous", f"{h.item.ref or expression(h.item.loc)}: "
                           "the Encounter lists ICU locations of different types at the ICU "
                           "admission; none is used", h.item, h.item.loc)
            return
        h = chosen[0]
        self._direct(h.item, "icu_type", self.admission, h.icu, [*h.item.loc, "type"], "type")

    def add_procedure(self, item: Located) -> None:
        """A mechanical-ventilation Procedure: 1 at performedDateTime, or at the start of
        performedPeriod and each following hour to its end."""
        proc = item.resource
        if not self.belongs(item, reference_of(proc.subject), reference_of(proc.encounter)) \
                or self.skipped(item, proc.status, PROCEDURE_SKIPPED):
            return
        codes = [c.code for c in ((proc.code.coding or []) if proc.code else [])
                 if c.system == SNOMED]
        if VENTILATION not in codes:
            self._warn("unmapped_code", f"{item.ref or expression(item.loc)}: not a "
                       f"{SNOMED}|{VENTILATION} Procedure; not used", item,
                       [*item.loc, "code"])
            return
        times: list[datetime] = []
        if isinstance(proc.performedDateTime, datetime):
            times = [proc.performedDateTime]
        elif proc.performedPeriod is not None and isinstance(proc.performedPeriod.start,
                                                             datetime):
            start, end = proc.performedPeriod.start, proc.performedPeriod.end
            times = [start]
            if isinstance(end, datetime):
                hours = int(min((end - start).total_seconds() // 3600, MAX_PERIOD_HOURS))
                times += [start + timedelta(hours=h) for h in range(1, hours + 1)]
        times = [t for t in times if t.tzinfo is not None and t >= self.admission]
        if not times:
            self._warn("no_effective_time", f"{item.ref or expression(item.loc)}: no performed "
                       "time with a timezone at or after the ICU admission; not used", item,
                       item.loc)
            return
        for t in times:
            self._direct(item, "mechanical_ventilation", t, 1.0, item.loc, "performed")


def to_stay(resources: list[Located], *, admission_time: datetime | None = None,
            end_hours: float | None = None, prefix: Loc = ("body",),
            variables: Sequence[Variable] = VARIABLES) -> FhirStay:
    """Patient + Encounter + Observations (+ the Encounter's Location, ventilation
    Procedures) -> the stay, its observations as columns; each resource read belongs to the
    stay (`Belonging`), other resources are ignored (one warning per resource type).
    `variables`: the scoring model's feature set, whose LOINC codes the Observations were read
    with (`bundle_resources`; a code it does not read is a warning, not an observation)."""
    by_type: dict[str, list[Located]] = {}
    for r in resources:
        by_type.setdefault(r.kind, []).append(r)
    patient = _one_patient(by_type.get("Patient", []), list(prefix))
    encounters = by_type.get("Encounter", [])
    members = Belonging.of(patient, encounters)
    for enc in encounters:
        members.check_subject(enc, reference_of(enc.resource.subject))
    admission = _admission(encounters, admission_time, list(prefix))
    builder = StayBuilder(admission, members, [v.id for v in variables])
    builder.add_locations(encounters, by_type.get("Location", []))
    for item in by_type.get("Observation", []):
        builder.add(item)
    for item in by_type.get("Procedure", []):
        builder.add_procedure(item)
    ignored = Counter({t: len(v) for t, v in by_type.items()
                       if t not in ("Patient", "Encounter", "Observation", "Location",
                                    "Procedure")})
    for t, n in sorted(ignored.items()):
        builder.issues.append(Issue("resource_ignored", f"{n} {t} resource(s) not used"))
    encounter = encounters[0].ref if len(encounters) == 1 else None
    stay = ColumnStay(builder.columns(), id=patient.resource.id, end_hours=end_hours,
                      demographics=_demographics(patient.resource, admission))
    return FhirStay(stay, patient.ref or "Patient", encounter, list(builder.basis),
                    builder.sources, builder.issues, builder.refs)


def read_bundle(raw: Any, *, admission_time: datetime | None = None,
                end_hours: float | None = None,
                variables: Sequence[Variable] = VARIABLES, full: bool = False) -> FhirStay:
    """A request body Bundle -> FhirStay (422 naming the FHIR path when malformed); `full`:
    every element validated by `fhir.resources`, not only those read."""
    return to_stay(bundle_resources(raw, full=full, codes=loinc_index(variables)),
                   admission_time=admission_time, end_hours=end_hours, variables=variables)


def validate_resource(resource_type: str, raw: Any, prefix: Loc, root: str,
                      full: bool = False) -> Located:
    """One resource of `resource_type` (not an Observation: `bundle_resources` reads those)
    validated (lean, or `full`) where it sits."""
    return Located(resource_type, validate(model_for(resource_type, full), raw, prefix, root),
                   prefix)


__all__ = [
    "FhirStay",
    "Issue",
    "Located",
    "bundle_resources",
    "expression",
    "fhir_path",
    "read_bundle",
    "to_stay",
    "validate_resource",
]
