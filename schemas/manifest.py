"""The model manifest: everything the server needs to serve an exported model, as data.

Both sides read it: training writes it at export, the service validates it at load and
refuses a manifest whose contract major version differs from its own. `manifest.schema.json`
beside this file is generated from these models (`python -m scehr.schemas.manifest`), and a test
checks it is current.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from scehr.schemas.alert_policy import AlertPolicy
from scehr.schemas.contract import CONTRACT_VERSION, RISK_EPS
from scehr.schemas.explanation_screen import ExplanationScreen
from scehr.schemas.sufficiency import DataMinimum
from scehr.schemas.tasks import TASK_NAMES, task_spec
from scehr.schemas.uncertainty import RiskUncertainty

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class LossSpec(_M):
    name: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        description="The classification loss (a name of the training library's loss registry); "
                    "its read-out is baked into the graph's probability output")
    lam: float = Field(0.0, description="Weight of the supervised contrastive regularizer")
    temperature: float = 0.1
    params: dict[str, Any] = Field(default_factory=dict)


class EncoderSpec(_M):
    name: str
    hparams: dict[str, Any]
    out_dim: int
    uses_static: bool


class OnnxSpec(_M):
    file: str = "model.onnx"
    sha256: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    dynamic_length: bool
    parity_max_abs_error: dict[str, float] = Field(default_factory=dict)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function (tanh form)."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def logit(p: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Log-odds, clipped so that p of exactly 0 or 1 stays finite."""
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1.0 - eps)
    return np.log(q) - np.log1p(-q)


def logistic_margin(x: np.ndarray, input: str) -> np.ndarray:
    """What a temperature or Platt map reads as its margin: `x` itself, or logit(x) when the
    map's `input` is the probability."""
    return x if input == "margin" else logit(x)


def calibrated_risk(method: str, input: str, x: np.ndarray, *, temperature: float | None = None,
                    slope: float | None = None, intercept: float | None = None,
                    knots: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The risk of a calibration map, in [RISK_EPS, 1 - RISK_EPS], from `x`, what the map
    reads: the model's probability for "none", else the margin or the probability per `input`.

    The one read-out of a map: `Calibration.apply` (the service) and the training calibrators'
    `transform` both call it. Its output is clipped whatever the map (an isotonic map's end
    knots are often exactly 0 or 1; a sigmoid of a large margin rounds to 1).
    """
    if method == "none":
        r = np.asarray(x, dtype=np.float64)
    elif method == "platt":
        r = sigmoid(float(slope or 0.0) * logistic_margin(x, input) + float(intercept or 0.0))
    elif method == "temperature":
        r = sigmoid(logistic_margin(x, input) / float(temperature or 1.0))
    elif method == "isotonic" and knots is not None:
        r = np.interp(x, knots[0], knots[1])
    else:
        raise ValueError(f"calibration method {method!r} with these parameters is not a map")
    # the ufuncs np.clip calls, without its Python wrapper: this runs per class and request
    return np.minimum(np.maximum(r, RISK_EPS), 1.0 - RISK_EPS)


class Calibration(_M):
    """Applied by the service on top of the model's probability, per class: the `risk`.

    `apply` is the one read-out: the service serves it and export scores candidates with it.
    Its output lies in [RISK_EPS, 1 - RISK_EPS] whatever the map (an isotonic map's end knots
    are often exactly 0 or 1; a sigmoid of a large margin rounds to 1).
    """

    method: Literal["none", "temperature", "platt", "isotonic"]
    input: Literal["margin", "probability"] = Field(
        "probability", description="temperature: σ(m / T); platt: σ(slope·m + intercept), "
        "m the margin or logit(p) per `input`; isotonic: interp(p, x, y)"
    )
    temperature: float | None = None
    slope: float | None = Field(None, description="platt (contract 1.2): the logit's slope")
    intercept: float | None = Field(None, description="platt (contract 1.2): its intercept")
    x: list[float] | None = None
    y: list[float] | None = None
    fitted_on: str = Field("", description="Which data it was fitted on")
    ece_before: float | None = None
    ece_after: float | None = None

    _knots: tuple[Any, Any, np.ndarray, np.ndarray] | None = PrivateAttr(None)

    def apply(self, p: np.ndarray, margin: np.ndarray) -> np.ndarray:
        """The risk from the model's probability `p` and margin uᵀz − vᵀz, strictly in (0, 1)."""
        x = margin if self.input == "margin" and self.method != "none" else p
        return calibrated_risk(self.method, self.input, x, temperature=self.temperature,
                               slope=self.slope, intercept=self.intercept,
                               knots=self._knot_arrays() if self.method == "isotonic" else None)

    def _knot_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The knots as arrays once, not per request (again if x or y is new)."""
        k = self._knots
        if k is None or k[0] is not self.x or k[1] is not self.y:
            k = self._knots = (self.x, self.y, np.asarray(self.x, dtype=np.float64),
                               np.asarray(self.y, dtype=np.float64))
        return k[2], k[3]

    @property
    def monotone_in_probability(self) -> bool:
        """True when the risk is a non-decreasing function of the model's probability alone,
        so that `p >= t` and `risk >= apply(t)` raise the same alerts."""
        falling = self.method == "platt" and float(self.slope or 0.0) < 0.0
        return self.method == "none" or (self.input == "probability" and not falling)


class OperatingPoint(_M):
    """A row of the threshold table on the model's own probability (`score`), validation."""

    threshold: float
    sensitivity: float
    ppv: float
    specificity: float
    alert_rate: float
    name: str = ""


class PointStats(_M):
    """Confusion-derived figures of one threshold on one split; None where undefined."""

    n: int
    sensitivity: float | None
    specificity: float | None
    ppv: float | None
    npv: float | None
    alert_rate: float


class NamedOperatingPoint(_M):
    """An alert threshold on the `risk`, chosen by a rule on validation, with its figures."""

    name: str = Field(description="high_sensitivity, balanced or high_ppv")
    rule: str = Field(description="How the threshold was chosen, in words")
    threshold: float = Field(description="Alert when risk >= threshold")
    validation: PointStats
    test: PointStats | None = None


class WithheldPoint(_M):
    """A named point this class does not serve, and why (validation cannot support it)."""

    name: str
    reason: str


class RiskLevels(_M):
    """The levels a card or FHIR assessment shows, each a named point on the risk: `warning`
    at or above the first, `critical` at or above the second (info below both)."""

    warning: str = Field(description="Named point whose threshold starts `warning`")
    critical: str | None = Field(None, description="Named point (a higher threshold) whose "
                                 "threshold starts `critical`; None: no critical level")


class MarginReference(_M):
    """Percentiles 1..99 of the anchor margin uᵀz − vᵀz among held-out stays of each outcome.

    Quantiles of at least 20 stays, never an individual value (no minimum or maximum)."""

    split: str = Field(description="Where the margins come from (the calibration split)")
    percentiles: list[float] = Field(description="The percent levels, 1 to 99")
    without_outcome: list[float] | None = Field(description="Margin quantiles, label 0")
    with_outcome: list[float] | None = Field(description="Margin quantiles, label 1")
    n_without: int
    n_with: int


class Histogram(_M):
    """Fractions of a reference sample in fixed bins: bin k holds edges[k-1] <= x < edges[k]
    (`scehr.schemas.profile.bin_index`); categorical variables use one bin per category."""

    edges: list[float] = Field(description="Interior cut points (bins = len(edges) + 1); "
                               "empty for categorical variables")
    fractions: list[float]
    n: int = Field(description="Observations the fractions were counted on")


class ClassCard(_M):
    """Per-class serving assets."""

    label: str
    calibration: Calibration
    operating_points: list[OperatingPoint] = Field(default_factory=list)
    default_threshold: float = Field(0.5, description="Contract 1.0: the default alert "
                                     "threshold on the model's probability (`score`)")
    prototypes: list[PrototypeSpec] = Field(default_factory=list)
    named_points: list[NamedOperatingPoint] = Field(
        default_factory=list, description="Alert thresholds on the risk (contract >= 1.1)")
    default_operating_point: str | None = Field(
        None, description="Name of the point used when a request names none")
    margin_reference: MarginReference | None = None
    risk_reference: Histogram | None = Field(
        None, description="Validation risks in fixed bins (for drift monitoring)")
    withheld_points: list[WithheldPoint] = Field(
        default_factory=list, description="Named points this class does not serve, with why")
    levels: RiskLevels | None = Field(
        None, description="warning/critical levels as named points on the risk")
    uncertainty: RiskUncertainty | None = Field(
        None, description="Contract 1.4: the Venn-Abers interval and conformal outcome set "
        "served with each risk (absent: the model serves no interval)")


class PrototypeSpec(_M):
    """A k-means centre of training embeddings of one outcome; never one patient."""

    label: int = Field(description="1 = outcome present, 0 = absent")
    centroid: list[float]
    count: int = Field(ge=20)
    outcome_rate: float


class Interval(_M):
    value: float | None
    low: float | None = None
    high: float | None = None


class SplitInfo(_M):
    n: int
    prevalence: list[float]


class Provenance(_M):
    dataset: str
    description: str = ""
    splits: dict[str, SplitInfo]
    source: str = ""


#: `Manifest.metrics["computed_on"]` of figures computed on the served risk (the calibration
#: map on the score), the number a client is shown; `metrics["score"]` then holds the same
#: figures of the uncalibrated score. Without it the figures are of the score.
SERVED_RISK = "risk"


class TrajectoryBand(_M):
    """The serving assets of the landmark hours from_hour..to_hour (inclusive), each fitted on
    the validation stays still in the ICU at those hours."""

    from_hour: int = Field(ge=1)
    to_hour: int = Field(ge=1)
    calibration: Calibration = Field(description="The band's map on the model's probability")
    uncertainty: RiskUncertainty | None = Field(
        None, description="The band's interval and outcome-set map (absent: no interval)")
    data_minimum: DataMinimum | None = Field(
        None, description="The least data up to the landmark hour; below it the hour abstains")
    metrics: dict[str, Any] = Field(default_factory=dict,
                                    description="Validation/test figures of the band")


class Trajectory(_M):
    """Contract 1.5, landmark tasks: how the risk at every hour of the window is served."""

    first_hour: int = Field(ge=1, description="Earliest supported landmark (chosen on "
                            "validation); earlier hours abstain (`before_first_landmark`)")
    last_hour: int = Field(ge=1)
    bands: list[TrajectoryBand] = Field(min_length=1, description="Consecutive bands covering "
                                        "first_hour..last_hour")
    alert_policy: AlertPolicy

    @model_validator(mode="after")
    def _bands_cover_the_hours(self) -> Trajectory:
        expected = self.first_hour
        for k, b in enumerate(self.bands):
            if b.from_hour != expected or b.to_hour < b.from_hour:
                raise ValueError(f"trajectory.bands[{k}]: from_hour must be {expected} (bands are "
                                 f"consecutive from first_hour) and to_hour >= from_hour, got "
                                 f"{b.from_hour}..{b.to_hour}")
            expected = b.to_hour + 1
        if expected - 1 != self.last_hour:
            raise ValueError(f"trajectory.bands must end at last_hour {self.last_hour}, "
                             f"not {expected - 1}")
        return self

    def band(self, hour: int) -> TrajectoryBand | None:
        """The band serving `hour`, None before first_hour or after last_hour."""
        return next((b for b in self.bands if b.from_hour <= hour <= b.to_hour), None)


class Manifest(_M):
    """The versioned model manifest (contract version `CONTRACT_VERSION`)."""

    contract_version: str = CONTRACT_VERSION
    name: str
    version: str
    task: Literal[TASK_NAMES]  # type: ignore[valid-type]  # the task registry's names
    label_names: list[str]
    loss: LossSpec
    encoder: EncoderSpec
    feature_set: dict[str, Any] = Field(description="schemas.featureset.FeatureSet.to_dict()")
    normalizer: dict[str, Any] = Field(description="schemas.tensorize.Normalizer.to_dict()")
    static: dict[str, Any] | None = Field(
        None, description="schemas.tensorize.StaticImputer.to_dict(), when the encoder uses it"
    )
    coverage: dict[str, float] = Field(
        description="Per variable id: fraction of training stays where it was ever observed"
    )
    anchors: dict[str, list[list[float]]] = Field(description="u and v, each [C, D]")
    classes: list[ClassCard]
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="Test metrics with CIs: name -> Interval-like dict; "
        "a site model (scehr recalibrate) holds `site` instead (its figures on the site's "
        "held-out stays and their provenance, schemas/site.py) and `parent` (its parent's own)"
    )
    provenance: Provenance
    onnx: OnnxSpec
    created_at: str
    code_version: str
    notes: list[str] = Field(default_factory=list)
    value_reference: dict[str, Histogram] = Field(
        default_factory=dict, description="Per variable id: its observed hourly values in the "
        "training split, in fixed bins (the baseline of the served population-stability index)")
    data_minimum: DataMinimum | None = Field(
        None, description="The least data a stay needs to be given a risk; below it the "
        "service abstains (absent: only an empty stay is refused)")
    trajectory: Trajectory | None = Field(
        None, description="Contract 1.5: a landmark task's per-hour calibration, uncertainty, "
        "data minimum and alert policy (required for a landmark task, absent otherwise)")
    explanation_screen: ExplanationScreen | None = Field(
        None, description="Contract 1.6: the screen that picks the channels `explain=top` "
        "occludes exactly (absent: every observed channel, as `explain=full`)")

    @model_validator(mode="after")
    def _trajectory_iff_landmarks(self) -> Manifest:
        if task_spec(self.task).landmarks != (self.trajectory is not None):
            raise ValueError(f"trajectory: a {self.task} manifest must "
                             f"{'' if task_spec(self.task).landmarks else 'not '}have one "
                             "(only landmark tasks serve a risk per hour)")
        return self

    @model_validator(mode="after")
    def _screen_fits_the_model(self) -> Manifest:
        screen = self.explanation_screen
        if screen is None:
            return self
        if len(self.label_names) != 1:
            raise ValueError("explanation_screen: only a one-class model can carry one (it "
                             f"ranks channels for one class), this one has {len(self.label_names)}")
        n = len(self.feature_set.get("variables", ()))
        if len(screen.coefficients) != n:
            raise ValueError(f"explanation_screen.coefficients must have one row per channel "
                             f"of the feature set ({n}), got {len(screen.coefficients)}")
        return self


class ContractError(ValueError):
    """A manifest the server cannot serve (other contract major version, bad file)."""


def major(version: str) -> int:
    return int(version.split(".", 1)[0])


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest; refuse another contract major version clearly."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ContractError(f"cannot read manifest {path}: {e}") from e
    found = str(raw.get("contract_version", "missing"))
    try:
        same = major(found) == major(CONTRACT_VERSION)
    except ValueError:
        same = False
    if not same:
        raise ContractError(
            f"{path}: manifest contract version {found} is not served by this server "
            f"(contract {CONTRACT_VERSION}; the major version must match). Re-export the model "
            "with a matching scehr version."
        )
    return Manifest.model_validate(raw)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema()
    schema["$id"] = f"https://scehr.dev/schemas/manifest-{CONTRACT_VERSION}.json"
    return schema


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
