"""CDS Hooks 2.0: the discovery document, the patient-view request and its cards.

The service reads only what the CDS Client prefetched (Patient, the ICU Encounter, the
Observations): it holds no FHIR server credentials and never queries one, so a missing
prefetch is a 412 Precondition Failed saying so (the spec's answer), never a guess.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scehr.schemas.explanation_screen import SCREENED_NOTICE
from scehr.schemas.manifest import Manifest
from scehr.schemas.payloads import ClassResult, Prediction, Problem, RiskInterval
from scehr.schemas.tasks import outcome_coding
from scehr.schemas.trajectory_payloads import TrajectoryPrediction
from scehr.schemas.variables import LOINC_PANELS, LOINC_SYSTEM, VARIABLES, Variable, loinc_index
from scehr.service.errors import ApiError
from scehr.service.interop.fhir_in import (
    SNOMED,
    VENTILATION,
    FhirStay,
    Issue,
    Located,
    bundle_resources,
    to_stay,
    validate_resource,
)
from scehr.service.interop.readout import (
    Level,
    interval_of,
    interval_words,
    level_of,
    rationale,
    risk_of,
    score_of,
    top_contributions,
)

HOOK = "patient-view"
SERVICE_PREFIX = "scehr-"
MAX_CARDS = 5
SUMMARY_MAX = 139  # the spec: a "<140-character summary"
EXTENSION = "dev.scehr.result"
PREFETCH_REQUIRED = ("patient", "encounter", "observations")
NO_FHIR_ACCESS = ("this service does not query FHIR servers (fhirServer and "
                  "fhirAuthorization are not used): the CDS Client must prefetch")


def observation_query(variables: Sequence[Variable] = VARIABLES) -> str:
    """The Observation prefetch: every LOINC code of the model's variables, and the BP panels."""
    codes = list(dict.fromkeys(c for v in variables for c in v.loinc_codes)) + list(LOINC_PANELS)
    return ("Observation?patient={{context.patientId}}&code="
            + ",".join(f"{LOINC_SYSTEM}|{c}" for c in codes) + "&_count=1000")


def prefetch_templates(variables: Sequence[Variable] = VARIABLES) -> dict[str, str]:
    """The prefetch a model needs: Patient, Encounter, Observations, and where the model
    reads them, the ICU Location (HSLOC type) and the ventilation Procedures (SNOMED CT)."""
    out = {"patient": "Patient/{{context.patientId}}",
           "encounter": "Encounter/{{context.encounterId}}",
           "observations": observation_query(variables)}
    ids = {v.id for v in variables}
    if "icu_type" in ids:
        out["location"] = "Location?_has:Encounter:location:_id={{context.encounterId}}"
    if "mechanical_ventilation" in ids:
        out["procedures"] = (f"Procedure?patient={{{{context.patientId}}}}&code={SNOMED}|"
                             f"{VENTILATION}&_count=1000")
    return out


class CdsService(BaseModel):
    hook: str
    title: str
    description: str
    id: str
    prefetch: dict[str, str]
    usageRequirements: str | None = None


class CdsDiscovery(BaseModel):
    services: list[CdsService]


def discovery(tasks: Mapping[str, Sequence[Variable]]) -> CdsDiscovery:
    """One service per task; each prefetches the codes its model reads (task -> variables)."""
    return CdsDiscovery(services=[CdsService(
        hook=HOOK, id=f"{SERVICE_PREFIX}{t}",
        title=f"scehr ICU {t} risk",
        description=f"ICU {t} risk from the stay's vital signs and labs (scehr {t} model), "
        "with the variables that raise it most and a link to the model card.",
        prefetch=prefetch_templates(variables),
        usageRequirements="Needs the Patient, the ICU Encounter (period.start = ICU "
        "admission, so encounterId in the context) and the Observations prefetched; "
        + NO_FHIR_ACCESS + ". Research software: not for clinical use without local "
        "validation.") for t, variables in tasks.items()])


class CdsRequest(BaseModel):
    """A CDS Hooks call (fields per the spec; unknown extension fields are allowed)."""

    model_config = ConfigDict(extra="allow")

    hook: str
    hookInstance: str = Field(max_length=200)
    fhirServer: str | None = None
    fhirAuthorization: dict[str, Any] | None = None
    context: dict[str, Any]
    prefetch: dict[str, Any] | None = None


class Coding(BaseModel):
    system: str | None = None
    code: str
    display: str | None = None


class Source(BaseModel):
    label: str
    url: str | None = None
    topic: Coding | None = None


class Link(BaseModel):
    label: str
    url: str
    type: Literal["absolute", "smart"] = "absolute"


class Card(BaseModel):
    uuid: str
    summary: str = Field(max_length=SUMMARY_MAX)
    detail: str | None = None
    indicator: Literal["info", "warning", "critical"]
    source: Source
    links: list[Link] = Field(default_factory=list)
    extension: dict[str, Any] | None = Field(
        default=None, description=f"`{EXTENSION}`: the exact risk, score and level")


class CdsResponse(BaseModel):
    cards: list[Card]


def _precondition(missing: list[str], why: str, variables: Sequence[Variable]) -> ApiError:
    return ApiError(412, "precondition_failed", [Problem(
        loc=["body", "prefetch", k], rule="prefetch_required",
        message=f"prefetch {k!r} {why}; {NO_FHIR_ACCESS}",
        allowed=prefetch_templates(variables)[k]) for k in missing])


def _usable(value: Any) -> bool:
    return isinstance(value, dict) and value.get("resourceType") != "OperationOutcome"


def read_prefetch(req: CdsRequest, variables: Sequence[Variable] = VARIABLES,
                  full: bool = False) -> FhirStay | None:
    """The stay from the prefetch, read with the scoring model's `variables`; None when the
    client says there are no Observations. `full`: every element validated by
    `fhir.resources`, not only those read."""
    if req.hook != HOOK:
        raise ApiError(422, "unsupported_hook", [Problem(
            loc=["body", "hook"], rule="hook", message=f"hook {req.hook!r} is not served here",
            allowed=HOOK)])
    if not isinstance(req.context.get("patientId"), str):
        raise ApiError(422, "invalid_context", [Problem(
            loc=["body", "context", "patientId"], rule="required",
            message="patient-view needs context.patientId (a string)", allowed="a Patient id")])
    pre = req.prefetch or {}
    missing = [k for k in PREFETCH_REQUIRED if k not in pre]
    if missing:
        raise _precondition(missing, "is missing", variables)
    errors = [k for k in PREFETCH_REQUIRED
              if pre[k] is not None and not _usable(pre[k])]
    if errors:
        raise _precondition(errors, "is an OperationOutcome or not a resource", variables)
    nulls = [k for k in ("patient", "encounter") if pre[k] is None]
    if nulls:
        raise _precondition(nulls, "is null (the client has no such resource)", variables)
    if pre["observations"] is None:
        return None
    patient = validate_resource("Patient", pre["patient"], ["body", "prefetch", "patient"],
                                "Patient", full)
    encounter = validate_resource("Encounter", pre["encounter"],
                                  ["body", "prefetch", "encounter"], "Encounter", full)
    _same_as_context(req.context, patient, "patientId")
    _same_as_context(req.context, encounter, "encounterId")
    resources = [
        patient, encounter,
        *(r for r in bundle_resources(pre["observations"],
                                      ["body", "prefetch", "observations"], "Bundle", full,
                                      loinc_index(variables))
          if r.kind == "Observation"),
    ]
    resources += _optional(pre, "location", "Location", full)
    resources += _optional(pre, "procedures", "Procedure", full)
    return to_stay(resources, prefix=["body", "prefetch"], variables=variables)


def _same_as_context(context: dict[str, Any], item: Located, name: str) -> None:
    """The prefetched Patient (Encounter) is the one the hook's context names (`patientId`,
    `encounterId` when given): 422 `patient_mismatch` (`encounter_mismatch`) otherwise."""
    want, kind = context.get(name), item.kind
    if isinstance(want, str) and item.resource.id not in (None, want):
        raise ApiError(422, "invalid_fhir", [Problem(
            loc=[*item.loc, "id"], rule=f"{kind.lower()}_mismatch",
            message=f"the prefetched {kind} is not context.{name}", allowed=want)])


def _optional(pre: dict[str, Any], key: str, kind: str, full: bool) -> list[Located]:
    """The resources of `kind` in an optional prefetch entry (one resource or a Bundle)."""
    raw = pre.get(key)
    if not _usable(raw):
        return []
    if raw.get("resourceType") == "Bundle":
        return [r for r in bundle_resources(raw, ["body", "prefetch", key], "Bundle", full)
                if r.kind == kind]
    if raw.get("resourceType") == kind:
        return [validate_resource(kind, raw, ["body", "prefetch", key], kind, full)]
    return []


def _summary(label: str, risk: float, level: Level, interval: RiskInterval | None = None
             ) -> str:
    span = "" if interval is None else (
        f" [{interval.low:.0%}-{interval.high:.0%}{', wide' if interval.wide else ''}]")
    tail = f": risk {risk:.0%}{span} ({level})"
    room = SUMMARY_MAX - len(tail)
    name = label if len(label) <= room else label[: room - 1] + "…"
    return name + tail


def _outcome_words(label: str) -> str:
    return "in-hospital death" if label == "in_hospital_mortality" else label


def card(r: ClassResult, pred: Prediction, manifest: Manifest, card_url: str | None,
         issues: Sequence[Issue] = ()) -> Card:
    """One class's card; `issues`: the prefetch's own warnings (what was not read, and why),
    counted with the prediction's."""
    level = level_of(r, manifest)
    top = top_contributions(r)
    lines = [rationale(r, manifest), ""]
    if top:
        screened = any(w.code == SCREENED_NOTICE for w in pred.warnings)
        lines += ["**Top contributing variables** (occlusion: risk points added by each "
                  "variable's values" + ("; among the variables the model's screen ranked "
                                         "highest" if screened else "") + ")", ""]
        lines += [f"- `{v}`: +{d * 100:.1f}" for v, d in top]
        lines.append("")
    # the data's warnings: a screened explanation is about the method (said beside it)
    codes = [w.code for w in pred.warnings if w.code != SCREENED_NOTICE] + [i.code for i in issues]
    if codes:
        lines.append(f"{len(codes)} data warning(s): " + ", ".join(sorted(set(codes))) + ".")
    lines.append("Research software: not for clinical use without local validation.")
    c = outcome_coding(r.label)
    label = _outcome_words(r.label)
    return Card(
        uuid=str(uuid.uuid4()), summary=_summary(label, risk_of(r), level, interval_of(r)),
        detail="\n".join(lines), indicator=level,
        source=Source(label=f"scehr {pred.model.name} {pred.model.version}", url=card_url,
                      topic=None if c is None else Coding(system=c.system, code=c.code,
                                                          display=c.display)),
        links=[] if card_url is None else [Link(label="Model card", url=card_url)],
        extension={EXTENSION: {"label": r.label, "risk": risk_of(r), "score": score_of(r),
                               "level": level, "model": pred.model.name,
                               "risk_interval": None if interval_of(r) is None
                               else interval_of(r).model_dump(),
                               "version": pred.model.version}})


#: How far back a trajectory card compares the risk now with.
TREND_HOURS = 6


def _risk_at(t: TrajectoryPrediction, hour: int) -> float | None:
    """The trajectory's risk at `hour` (None: not scored, or before the stay)."""
    return next((h.risk for h in t.hours if h.hour == hour), None)


def trend_card(t: TrajectoryPrediction, card_url: str | None, issues: Sequence[Issue] = ()
               ) -> Card:
    """A trajectory as one card: the risk now (its last hour) against TREND_HOURS ago, the
    alerts the policy raised; an info card saying why when the last hour abstained."""
    m, now = t.model, t.hours[-1]
    source = Source(label=f"scehr {m.name} {m.version}", url=card_url)
    links = [] if card_url is None else [Link(label="Model card", url=card_url)]
    alerts = [a.hour for a in t.alerts]
    if now.risk is None:
        why = [r.message for r in now.reasons]
        return Card(
            uuid=str(uuid.uuid4()), summary=f"No {m.task} risk at hour {now.hour} yet",
            detail=f"No risk is given at hour {now.hour}:\n\n"
            + "\n".join(f"- {w}" for w in why)
            + "\n\nResearch software: not for clinical use without local validation.",
            indicator="info", source=source, links=links,
            extension={EXTENSION: {"status": t.status, "hour": now.hour, "reasons": why,
                                   "alerts": alerts, "model": m.name, "version": m.version}})
    before = _risk_at(t, now.hour - TREND_HOURS)
    level: Level = "warning" if now.alert else "info"
    was = "no risk then" if before is None else f"{before:.0%}"
    tail = f": {now.risk:.0%} at hour {now.hour}, {was} {TREND_HOURS} h ago ({level})"
    label = _outcome_words(t.label)
    room = SUMMARY_MAX - len(tail)
    then = "no risk (abstained, or before the stay)" if before is None else f"{before:.1%}"
    lines = [f"Risk {now.risk:.1%} at hour {now.hour}, from the data up to that hour; "
             f"{TREND_HOURS} h earlier (hour {now.hour - TREND_HOURS}): {then}.",
             interval_words(now.interval), "",
             f"Alerts raised (threshold {t.alert_policy.threshold:.0%}, silenced for "
             f"{t.alert_policy.silence_hours} h unless the risk rises by "
             f"{t.alert_policy.realert_rise:.0%}): "
             + (", ".join(f"hour {h}" for h in alerts) if alerts else "none") + "."]
    codes = [w.code for w in t.warnings] + [i.code for i in issues]
    if codes:
        lines.append(f"{len(codes)} data warning(s): " + ", ".join(sorted(set(codes))) + ".")
    lines.append("Research software: not for clinical use without local validation.")
    c = outcome_coding(t.label)
    return Card(
        uuid=str(uuid.uuid4()),
        summary=(label if len(label) <= room else label[: room - 1] + "…") + tail,
        detail="\n".join(lines), indicator=level,
        source=Source(label=source.label, url=card_url, topic=None if c is None else Coding(
            system=c.system, code=c.code, display=c.display)),
        links=links,
        extension={EXTENSION: {"label": t.label, "hour": now.hour, "risk": now.risk,
                               f"risk_{TREND_HOURS}h_ago": before, "level": level,
                               "alerts": alerts, "model": m.name, "version": m.version}})


def model_card_url(public_base_url: str | None, task: str) -> str | None:
    """The model card's absolute address under the configured base, or None when unset."""
    return None if public_base_url is None else f"{public_base_url.rstrip('/')}/models/{task}/card"


def insufficient_card(pred: Prediction, card_url: str | None) -> Card:
    """The info card of a stay below the model's data minimum: no risk, what is missing."""
    reasons = pred.sufficiency.reasons if pred.sufficiency is not None else []
    m = pred.model
    return Card(
        uuid=str(uuid.uuid4()), summary=f"Not enough data to estimate the {m.task} risk",
        detail="No risk is given: the stay is below this model's data minimum.\n\n"
        + "\n".join(f"- {w}" for w in reasons)
        + "\n\nResearch software: not for clinical use without local validation.",
        indicator="info", source=Source(label=f"scehr {m.name} {m.version}", url=card_url),
        links=[] if card_url is None else [Link(label="Model card", url=card_url)],
        extension={EXTENSION: {"status": pred.status, "model": m.name, "version": m.version,
                               "reasons": reasons}})


def cards(pred: Prediction, manifest: Manifest, card_url: str | None,
          issues: Sequence[Issue] = ()) -> CdsResponse:
    """Classes at warning or critical, highest risk first (at most MAX_CARDS); when none
    is, one info card for the highest-risk class, so the clinician sees the model ran. A
    stay below the data minimum gets one info card saying what is missing."""
    if pred.status == "insufficient_data":
        return CdsResponse(cards=[insufficient_card(pred, card_url)])
    order = sorted(pred.results, key=lambda r: -risk_of(r))
    flagged = [r for r in order if level_of(r, manifest) != "info"][:MAX_CARDS]
    return CdsResponse(cards=[card(r, pred, manifest, card_url, issues)
                              for r in flagged or order[:1]])
