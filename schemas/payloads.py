"""Request and response models of the API (pydantic), shared by the service and its clients."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from scehr.schemas.uncertainty import WIDE_INTERVAL


def _unicode_text(s: str) -> str:
    """Lone UTF-16 surrogates (legal as JSON `\\ud800` escapes) are not text: refuse them here,
    so no later encoder can fail on them."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("string_unicode", "not valid Unicode text (a lone UTF-16 "
                                  "surrogate)") from None
    return s


def printable(s: str) -> str:
    """`s` with anything that is not encodable as UTF-8 replaced (for echoing it back)."""
    return s.encode("utf-8", "replace").decode("utf-8")


#: Numbers and strings in payloads follow one rule (docs/service.md, "Types"): a number must be a
#: JSON number (booleans and numeric strings are refused, never coerced), and text must be valid
#: Unicode.
Number = Annotated[float, Field(allow_inf_nan=False, strict=True)]


class _UnicodeInPython:
    """`_unicode_text` on Python input only: pydantic's JSON parser already refuses a lone
    surrogate (`json_invalid`), and a JSON body's strings are most of its fields, so the check
    would be a Python call per string for nothing."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:
        schema = handler(source)
        return core_schema.json_or_python_schema(
            json_schema=schema,
            python_schema=core_schema.no_info_after_validator_function(_unicode_text, schema))


#: A `Text` member's name in the field path of an error of a union (`Number | Text`): the name
#: pydantic gave it when the check was a plain after-validator, as clients have seen it.
_TEXT_IN_UNION = "function-after[_unicode_text(), str]"
Text = Annotated[str, _UnicodeInPython(), Tag(_TEXT_IN_UNION)]
StrictModel = ConfigDict(extra="forbid", allow_inf_nan=False)


def _iso_only(v: object) -> object:
    """The timestamp branch of `time` takes ISO strings only (pydantic would also read numbers
    and numeric strings as Unix times)."""
    if isinstance(v, datetime):
        return v
    if not isinstance(v, str):
        raise PydanticCustomError("datetime_type", "a timestamp must be an ISO 8601 string")
    try:
        float(v)
    except ValueError:
        return v
    raise PydanticCustomError("datetime_type", "a timestamp must be an ISO 8601 string; hours "
                              "since admission must be a JSON number, not a string")


Timestamp = Annotated[datetime, BeforeValidator(_iso_only)]


class Observation(BaseModel):
    """One measurement in long form."""

    model_config = StrictModel

    variable: Text = Field(description="Variable id (e.g. `heart_rate`) or benchmark column name")
    time: Number | Timestamp = Field(
        description="Hours since ICU admission, or an ISO timestamp (then `admission_time` "
        "is required)"
    )
    value: Number | Text = Field(
        description="A JSON number for continuous variables; a benchmark category string or a "
        "documented alias (e.g. 4 for '4 Spontaneously') for categorical ones"
    )
    unit: Text | None = Field(
        default=None,
        description="Required for glucose, temperature, weight, height and fio2",
    )


class WideTable(BaseModel):
    """The benchmark CSV layout: one row per time, one column per variable."""

    model_config = StrictModel

    hours: list[Number] = Field(description="Hours since ICU admission, one per row")
    columns: dict[Text, list[Number | Text | None]] = Field(
        description="Variable id or benchmark name -> one value per row (null = not measured)"
    )
    units: dict[Text, Text] = Field(
        default_factory=dict, description="Unit per column (required where a variable needs one)"
    )


class Demographics(BaseModel):
    """Static demographics; missing ones are imputed with the model's training medians."""

    model_config = StrictModel

    age: Annotated[float, Field(ge=0, le=130, allow_inf_nan=False, strict=True)] | None = None
    sex: Literal["female", "male"] | None = None


class StayPayload(BaseModel):
    """One ICU stay, in long form (`observations`) or wide form (`wide`), not both."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={
        # The "exactly one of" rule of `_one_form`, in the schema too.
        "oneOf": [{"required": ["observations"], "properties": {"observations": {"type": "array"}}},
                  {"required": ["wide"], "properties": {"wide": {"type": "object"}}}]})

    id: Text | None = Field(default=None, max_length=128, description="Caller's id, echoed back")
    admission_time: Timestamp | None = None
    end_hours: Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)] | None = Field(
        default=None,
        description="Hours from ICU admission to the end of the stay (or of the data so far). "
        "Whole-stay models (phenotypes) read the time series up to it, capped at their maximum, "
        "as in training; without it they stop at the last observation, with a warning. "
        "Fixed-window models (mortality) ignore it.",
    )
    observations: list[Observation] | None = None
    wide: WideTable | None = None
    demographics: Demographics | None = None

    @model_validator(mode="after")
    def _one_form(self) -> StayPayload:
        if (self.observations is None) == (self.wide is None):
            raise PydanticCustomError("one_form", "give exactly one of the fields "
                                      "`observations` (long form) or `wide`")
        return self


class BatchRequest(BaseModel):
    """Several stays scored in one call."""

    model_config = ConfigDict(extra="forbid")

    stays: list[Any] = Field(
        min_length=1, description="Each item a StayPayload (see that schema); any item that is "
        "not one, even a non-object, gets its own errors and never fails the others")


# ---------------------------------------------------------------- problems and warnings


class Problem(BaseModel):
    """One validation error: where, which rule, and what would have been allowed."""

    loc: list[str | int]
    rule: str
    message: str
    allowed: str | None = None

    @field_validator("loc")
    @classmethod
    def _printable(cls, loc: list[str | int]) -> list[str | int]:
        """Field names come from the client: never echo one the response cannot encode."""
        return [printable(p) if isinstance(p, str) else p for p in loc]


class Notice(BaseModel):
    """A warning about the input that did not stop scoring (no patient values in it)."""

    code: Literal[
        "value_dropped",
        "value_clipped",
        "value_implausible",
        "value_rescaled",
        "channel_not_observed",
        "channel_not_seen_in_training",
        "contributions_screened",
        "stay_shorter_than_window",
        "observations_after_window",
        "stay_end_unknown",
        "operating_point_unavailable",
        "below_data_minimum",
    ]
    message: str
    loc: list[str | int] | None = None
    variable: str | None = None


class ErrorBody(BaseModel):
    """The JSON body of every 4xx/5xx answer."""

    error: str
    detail: list[Problem] = Field(default_factory=list)
    request_id: str | None = None


# ---------------------------------------------------------------- responses


DEPRECATED = {"deprecated": True}


class MarginPercentile(BaseModel):
    """Where this stay's anchor margin falls among held-out training stays of each outcome."""

    without_outcome: float | None = Field(
        description="Percent (1 to 99) of held-out stays WITHOUT the outcome whose margin is "
        "below this stay's: 87 = closer to the outcome anchor than 87% of them")
    with_outcome: float | None = Field(
        description="The same among held-out stays WITH the outcome")
    summary: str = Field(description="The two figures in one sentence")


class AnchorExplanation(BaseModel):
    """The model's own score: which learned anchor is nearer to this stay's embedding."""

    positive_logit: float = Field(description="uᵀz")
    negative_logit: float = Field(description="vᵀz")
    margin: float = Field(description="uᵀz − vᵀz; > 0 means the positive anchor is nearer")
    margin_percentile: MarginPercentile | None = Field(
        default=None, description="Absent for models exported without margin percentiles "
        "(contract 1.0) or where an outcome had fewer than 20 held-out stays")
    nearer_anchor: Literal["positive", "negative"]
    cosine_positive: float
    cosine_negative: float


class PrototypeMatch(BaseModel):
    """A near prototype: a group of >= 20 training stays (never one patient), named by the
    outcome rate observed in it."""

    name: str = Field(description="e.g. 'outcome rate 8.3% [6.1%, 11.2%] among 412 stays'")
    cluster: int
    count: int = Field(description="Training stays nearest to this prototype")
    outcome_rate: float
    ci_low: float = Field(description="95% Wilson interval of the outcome rate")
    ci_high: float
    cosine: float = Field(description="Cosine similarity of this stay's embedding to it")


class Prototype(BaseModel):
    """Deprecated (response 1.0): the nearest prototype with the outcome it was fitted in."""

    label: int
    cluster: int
    count: int
    outcome_rate: float
    cosine: float


class Contribution(BaseModel):
    """Effect on the risk of replacing one channel by 'not observed' (occlusion)."""

    variable: str
    delta: float = Field(description="risk(stay) − risk(stay with this channel not observed); "
                         "> 0 means the channel's values raise the risk")
    direction: Literal["raises", "lowers", "neutral"] = Field(
        description="The sign of `delta` (neutral when |delta| < 1e-6)")
    delta_score: float = Field(description="The same difference on the raw score")
    delta_margin: float = Field(description="The same difference on the margin uᵀz − vᵀz")


class OperatingPointUsed(BaseModel):
    """Which alert threshold this result used."""

    name: str = Field(description="A named point of the manifest, `custom` for ?threshold=, "
                      "or `none` when the class has no point validation can support")
    threshold: float | None = Field(description="Alert when risk >= threshold; null when the "
                                    "point is withheld for this class (then no alert)")
    applies_to: Literal["risk", "score"] = Field(
        description="`risk` always, except contract 1.0 models whose calibration reads the "
        "margin: their stored threshold is on the score, with no exact risk equivalent")
    source: Literal["default", "request"]
    withheld: str | None = Field(
        default=None, description="Why this class raises no alert at this point: its "
        "validation data cannot support one (too few positives, or every stay would alert)")


class RiskInterval(BaseModel):
    """The uncertainty of one risk, from the model's held-out calibration split
    (docs/method.md, "Uncertainty"): a Venn-Abers interval and a conformal outcome set."""

    low: float = Field(description="The lower end: the smaller of the risk and Venn-Abers p0 "
                       "(the risk's isotonic calibration refitted with this stay added as "
                       "'no outcome')")
    high: float = Field(description="The upper end: the larger of the risk and Venn-Abers p1 "
                        "(the same with this stay added as 'outcome'). Under exchangeability "
                        "one of p0, p1 is a calibrated probability, so the interval holds one; "
                        "a wide interval means the held-out stays near this risk are few or "
                        "disagree with the calibration map")
    wide: bool = Field(description=f"high - low >= {WIDE_INTERVAL:g}: say so with the risk")
    level: float = Field(description="Nominal coverage of `outcomes`")
    outcomes: list[Literal["outcome", "no_outcome"]] = Field(
        description="The conformal outcome set: the outcomes this risk is typical of at "
        "`level` (among held-out stays with the outcome, a share >= level had a risk inside "
        "its region; the same without it). Both: the risk cannot tell them apart at this "
        "level; empty: typical of neither")


class ClassResult(BaseModel):
    label: str
    risk: float = Field(description="The calibrated probability of the outcome, strictly "
                        "inside (0, 1): the number to show")
    score: float = Field(description="The model's uncalibrated read-out (CBCE: σ(uᵀz) / "
                         "(σ(uᵀz) + σ(vᵀz)); CSCE: softmax; BCE: σ(uᵀz)); not a probability "
                         "to show")
    alert: bool = Field(description="risk >= operating_point.threshold")
    risk_interval: RiskInterval | None = Field(
        default=None, description="The risk's uncertainty; null when the model carries no "
        "uncertainty map (manifest contract < 1.4)")
    operating_point: OperatingPointUsed
    explanation: AnchorExplanation
    prototypes: list[PrototypeMatch] = Field(
        default_factory=list, description="The nearest prototypes, nearest first")
    contributions: list[Contribution] | None = Field(
        default=None, description="Channels by |delta|: the top few by default for single "
        "stays (`explain=top`), all with `explain=full`, none with `explain=basic`")
    contributions_total: int | None = Field(
        default=None, description="Observed channels evaluated (contributions lists the top "
        "ones unless explain=full)")


class ClassResultV1_1(ClassResult):
    """A class result of response version 1.1 (asked for with `X-Scehr-Response-Version:
    1.1`, this release only): 1.2's fields, then the deprecated 1.0 aliases."""

    probability: float = Field(description="Deprecated alias of `score` (response 1.0)",
                               json_schema_extra=DEPRECATED)
    calibrated_probability: float = Field(
        description="Deprecated alias of `risk` (response 1.0)", json_schema_extra=DEPRECATED)
    threshold: float | None = Field(description="Deprecated alias of `operating_point.threshold`",
                             json_schema_extra=DEPRECATED)
    prototype: Prototype | None = Field(
        default=None, description="Deprecated (its label can contradict its outcome rate): "
        "use `prototypes`", json_schema_extra=DEPRECATED)


class ModelRef(BaseModel):
    task: str
    name: str
    version: str
    sha256: str
    feature_set: str
    feature_set_hash: str = Field(description="sha256 of the feature set's canonical JSON")
    loss: str


class Audit(BaseModel):
    """What traces this score to the exact model and input later; never a patient value."""

    model_version: str
    model_sha256: str
    feature_set_hash: str
    operating_point: str
    input_sha256: str = Field(description="sha256 of the canonical model input (the "
                              "discretized stay and demographics, before normalization): "
                              "equal for any two payloads the model cannot tell apart")
    response_version: str


class DataSufficiency(BaseModel):
    """The stay's data against the model's declared minimum (counts and hours, no values)."""

    meets_minimum: bool
    reasons: list[str] = Field(default_factory=list,
                               description="Each bound the stay misses, naming what is missing")
    observations: int = Field(description="Observations inside the model's window")
    channels: int = Field(description="Distinct variables observed inside the window")
    hours_covered: float = Field(description="Hours from the first to the last of them")
    hours_since_last: float | None = Field(description="Hours from the last one to the "
                                           "window's end (null: none)")


class Prediction(BaseModel):
    response_version: str
    id: str | None = None
    model: ModelRef
    status: Literal["scored", "insufficient_data"] = Field(
        default="scored", description="`insufficient_data`: the stay is below the model's data "
        "minimum, so `results` is empty (no risk, no alert); `sufficiency` says what is missing. "
        "`?allow_insufficient=true` scores it anyway (research use), with a warning")
    results: list[ClassResult]
    sufficiency: DataSufficiency | None = Field(
        default=None, description="Present when the model declares a data minimum")
    warnings: list[Notice] = Field(default_factory=list)
    audit: Audit


class BatchItem(BaseModel):
    index: int
    id: str | None = None
    prediction: Prediction | None = None
    errors: list[Problem] | None = None


class BatchResponse(BaseModel):
    response_version: str
    model: ModelRef
    items: list[BatchItem]


class PredictionV1_1(Prediction):
    """A prediction of response version 1.1 (on request, this release only)."""

    results: list[ClassResultV1_1]


class BatchItemV1_1(BatchItem):
    prediction: PredictionV1_1 | None = None


class BatchResponseV1_1(BatchResponse):
    """A batch answer of response version 1.1 (on request, this release only)."""

    items: list[BatchItemV1_1]


# ---------------------------------------------------------------- models and administration


class ModelInfo(BaseModel):
    """A loaded model: manifest metadata, the execution provider really in use, its metrics."""

    model_config = ConfigDict(protected_namespaces=())

    task: str
    name: str
    version: str
    sha256: str
    path: str
    loss: str
    encoder: str
    feature_set: str
    window_hours: float | None
    label_names: list[str]
    uses_static: bool
    dynamic_length: bool
    contract_version: str
    created_at: str
    code_version: str
    provider: str = Field(description="session.get_providers()[0]: the provider really in use")
    providers: list[str]
    device: str = Field(description="The `device` setting the session was created under")
    calibration: list[str] = Field(description="Calibration method per class")
    uncertainty: bool = Field(
        False, description="Whether results carry `risk_interval` (the model has an "
        "uncertainty map; contract >= 1.4)")
    operating_points: list[str] = Field(
        default_factory=list, description="Names `?operating_point=` accepts")
    default_operating_point: str | None = None
    neutralised_channels: list[str] = Field(
        description="Channels never observed in training, always fed as 'not observed'")
    metrics: dict[str, Any]
    loaded_at: datetime
    default_version: str | None = Field(
        None, description="The task's default version in index.json when this model loaded")
    default_since: datetime | None = Field(None, description="Since when that default holds")
    worker_pid: int = Field(description="The worker process answering (each holds its own models)")


class AvailableModel(BaseModel):
    """An entry of models/index.json."""

    task: str
    version: str
    name: str | None = None
    path: str
    default: bool
    default_since: datetime | None = Field(
        None, description="When this version became the task's default (index.json), if it is")


class ModelList(BaseModel):
    models: list[ModelInfo]
    available: list[AvailableModel] = Field(default_factory=list)


class ReloadRequest(BaseModel):
    """Which model to load: a version listed in index.json or a folder under the model dir."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"version": "2026-01-15-cbce"}, {"path": "mortality/2026-01-15-cbce"}]})

    version: str | None = Field(
        default=None, max_length=200, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$",
        description="A version of index.json: a plain name (no `/`, `\\` or `..`)")
    path: Text | None = Field(default=None, max_length=1000,
                             description="Relative to the model directory (or absolute inside it)")

    @model_validator(mode="after")
    def _one(self) -> ReloadRequest:
        if (self.version is None) == (self.path is None):
            raise ValueError("give exactly one of `version` or `path`")
        return self


class ReloadResponse(BaseModel):
    model: ModelInfo
    previous_version: str | None


# ---------------------------------------------------------------- drift monitoring


class VariableDrift(BaseModel):
    variable: str
    observation_rate: float | None = Field(description="Share of window stays observing it")
    training_observation_rate: float | None = Field(description="The same in training")
    psi: float | None = Field(description="Population-stability index of its observed hourly "
                              "values vs training (None: too few observations, or no "
                              "reference in the manifest)")
    observed_hours: int = Field(description="Observed hourly values in the window")


class RiskDrift(BaseModel):
    label: str
    mean_risk: float | None
    psi: float | None = Field(description="PSI of served risks vs validation risks")


class AlertDrift(BaseModel):
    label: str
    operating_point: str
    alert_rate: float | None
    validation_alert_rate: float | None


class MonitoringSummary(BaseModel):
    """Drift and quality of one model's recent inputs and outputs (this worker's window)."""

    task: str
    model_version: str
    window_size: int = Field(description="Stays the window holds at most")
    stays: int = Field(description="Stays in the window now")
    min_stays_for_psi: int
    variables: list[VariableDrift]
    risk: list[RiskDrift]
    alerts: list[AlertDrift]
    answered: int = Field(0, description="Of the last `window_size` stays answered, scored "
                          "or abstained (below the data minimum), how many there are")
    abstention_rate: float | None = Field(
        None, description="Share of those answered stays that got no risk (below the "
        "model's data minimum); they are not in the drift window")
    notes: list[str] = Field(default_factory=list)
    worker_pid: int
