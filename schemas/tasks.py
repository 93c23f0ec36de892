"""The task registry: every prediction task the project knows, as one frozen `TaskSpec` each.

This is the only place that knows what "mortality" or "phenotypes" means. Data layout, metrics,
config, CLI choices, routes and manifest validation look a task up here and branch on its
attributes (multi-label or not, fixed window or whole stay, ...), never on its name. Adding a
task is a new entry here plus a converter that writes its listfiles (see docs/method.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from scehr.schemas.outcomes import CCS, MORTALITY, PHENOTYPE_CCS, Coding


@dataclass(frozen=True)
class TaskSpec:
    """What a task predicts, from which input, and how a model of it is judged."""

    name: str
    #: What the model card says the task is for (one sentence).
    description: str
    #: The labels in listfile column order; the model's classes, one probability each.
    label_names: tuple[str, ...]
    #: Several labels per stay (a probability per label), or one binary outcome.
    multi_label: bool
    #: Name of the feature set models of this task are trained and served with.
    feature_set: str
    #: Hours of the stay the model sees from admission; None: the whole stay (capped).
    window_hours: float | None
    #: The ONNX graph accepts any number of time steps (else the window's length is fixed).
    dynamic_length: bool
    #: The model-selection metric (early stopping, baseline C, experiment tables).
    headline_metric: str
    #: The operating point a model's default alert threshold is chosen by (on validation).
    default_operating_point: str
    #: The mimic3-benchmarks folder name under the data root.
    data_dir: str
    #: Other spellings accepted on the command line and in configs.
    aliases: tuple[str, ...] = ()
    #: Listfile label column when there is exactly one ("y_true"); None: the columns after
    #: `stay,period_length`, named as in `label_names`.
    label_column: str | None = None
    #: How plots name a binary task's negative and positive outcome (default: not-label/label).
    outcome_names: tuple[str, str] | None = None
    #: Label -> its standard code (FHIR RiskAssessment outcomes); a label without one is absent.
    outcome_codings: Mapping[str, Coding] = field(default_factory=dict)
    #: Encoder name -> the hyper-parameters it takes for this task when a config gives none
    #: (the paper's configurations); an encoder not listed uses its own defaults.
    encoder_presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: A landmark task: the model gives the risk at every hour h of the window from the data up
    #: to h (one causal graph; per-hour outputs, the manifest's `trajectory` section).
    landmarks: bool = False

    @property
    def binary(self) -> bool:
        return not self.multi_label

    def outcomes(self, label: str) -> tuple[str, str]:
        """(negative, positive) names of one label's outcomes, for plots and reports."""
        return self.outcome_names or (f"not {label}", label)

    @property
    def ends_at_period_length(self) -> bool:
        """Whole-stay tasks end each stay at the listfile's `period_length`."""
        return self.window_hours is None

    @property
    def listfile_columns(self) -> tuple[str, ...]:
        """The listfile's leading columns, checked when it is read."""
        return ("stay", self.label_column) if self.label_column else ("stay", "period_length")


#: The benchmark's 25 phenotype labels, in its listfile column order (alphabetical).
PHENOTYPE_LABELS: Final[tuple[str, ...]] = (
    "Acute and unspecified renal failure",
    "Acute cerebrovascular disease",
    "Acute myocardial infarction",
    "Cardiac dysrhythmias",
    "Chronic kidney disease",
    "Chronic obstructive pulmonary disease and bronchiectasis",
    "Complications of surgical procedures or medical care",
    "Conduction disorders",
    "Congestive heart failure; nonhypertensive",
    "Coronary atherosclerosis and other heart disease",
    "Diabetes mellitus with complications",
    "Diabetes mellitus without complication",
    "Disorders of lipid metabolism",
    "Essential hypertension",
    "Fluid and electrolyte disorders",
    "Gastrointestinal hemorrhage",
    "Hypertension with complications and secondary hypertension",
    "Other liver diseases",
    "Other lower respiratory disease",
    "Other upper respiratory disease",
    "Pleurisy; pneumothorax; pulmonary collapse",
    "Pneumonia (except that caused by tuberculosis or sexually transmitted disease)",
    "Respiratory failure; insufficiency; arrest (adult)",
    "Septicemia (except in labor)",
    "Shock",
)

MORTALITY = TaskSpec(
    name="mortality",
    description="in-hospital mortality risk from the first 48 hours of an ICU stay.",
    label_names=("in_hospital_mortality",),
    multi_label=False,
    feature_set="benchmark76-48h",
    window_hours=48.0,
    dynamic_length=False,
    headline_metric="auroc",
    default_operating_point="sensitivity>=0.8",
    data_dir="in-hospital-mortality",
    aliases=("in-hospital-mortality", "ihm", "in_hospital_mortality"),
    label_column="y_true",
    outcome_names=("survived", "died"),
    outcome_codings={"in_hospital_mortality": MORTALITY},
    # the authors' benchmark LSTM: a bidirectional LSTM of 8+8 units, then a 16-unit LSTM
    encoder_presets={"lstm": {"units": 16, "depth": 2, "bidirectional": True, "dropout": 0.3}},
)

#: The same outcome, labels, feature set and window as `MORTALITY`, given at every hour h of the
#: first 48 h from the data up to h (landmark analysis: the population of hour h is the stays
#: still in the ICU and alive at h).
MORTALITY_LANDMARK = replace(
    MORTALITY,
    name="mortality-landmark",
    description="in-hospital mortality risk at every hour of the first 48 hours of an ICU stay, "
                "from the data up to that hour.",
    aliases=("landmark-mortality", "ihm-landmark"),
    encoder_presets={},
    landmarks=True,
)

PHENOTYPES = TaskSpec(
    name="phenotypes",
    description="25 acute and chronic phenotypes (HCUP CCS groups of the mimic3-benchmarks) "
                "from the ICU time series of a stay.",
    label_names=PHENOTYPE_LABELS,
    multi_label=True,
    feature_set="benchmark76-stay",
    window_hours=None,
    dynamic_length=True,
    headline_metric="micro_auroc",
    default_operating_point="sensitivity>=0.8",
    data_dir="phenotyping",
    aliases=("phenotyping", "pheno"),
    outcome_codings={label: Coding(CCS, str(PHENOTYPE_CCS[label]), label)
                     for label in PHENOTYPE_LABELS},
    encoder_presets={"lstm": {"units": 256, "depth": 1, "bidirectional": False, "dropout": 0.3}},
)

#: Every task, by name, in the order lists show them.
TASK_SPECS: Final[dict[str, TaskSpec]] = {
    t.name: t for t in (MORTALITY, PHENOTYPES, MORTALITY_LANDMARK)}
#: The task names (what routes, CLI choices and manifests accept).
TASK_NAMES: Final[tuple[str, ...]] = tuple(TASK_SPECS)

_ALIASES: Final[dict[str, str]] = {
    alias: t.name for t in TASK_SPECS.values() for alias in (t.name, *t.aliases)}


def task_spec(name: str) -> TaskSpec:
    """The task of a name or alias (any case); ValueError naming the choices otherwise."""
    key = name.strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASK_NAMES)}")
    return TASK_SPECS[_ALIASES[key]]


def outcome_coding(label: str) -> Coding | None:
    """The coding of a model's label (`TaskSpec.outcome_codings`, across every task), or None
    for a label without a standard code."""
    for spec in TASK_SPECS.values():
        if label in spec.outcome_codings:
            return spec.outcome_codings[label]
    return None


def landmark_task(name: str) -> str | None:
    """The landmark task giving task `name`'s outcome at every hour (its trajectory): `name`
    itself when it is one, else the one with its labels, feature set and window; None when
    there is none (or `name` is no task)."""
    spec = TASK_SPECS.get(name)
    if spec is None or spec.landmarks:
        return None if spec is None else spec.name
    return next((t.name for t in TASK_SPECS.values() if t.landmarks
                 and (t.label_names, t.feature_set, t.window_hours)
                 == (spec.label_names, spec.feature_set, spec.window_hours)), None)
