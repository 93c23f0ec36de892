"""One training configuration: defaults per task, a TOML file, then command-line overrides."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scehr.schemas.featureset import FEATURE_SETS, FeatureSet
from scehr.schemas.tasks import TASK_NAMES, task_spec


def encoder_preset(encoder: str, task: str) -> dict[str, Any]:
    """The encoder's hyper-parameters for a task when a config gives none (schemas.tasks)."""
    return dict(task_spec(task).encoder_presets.get(encoder, {}))


@dataclass
class TrainConfig:
    """Everything that determines a run; written resolved to `<run>/config.json`."""

    task: str = "mortality"
    #: Name of a feature set (schemas/resources/feature_sets.json); "" = the task's own.
    feature_set: str = ""
    data: str = ""
    #: More benchmark-layout datasets whose train and val splits join `data`'s (multi-source
    #: training); their test splits are left out, for `scehr evaluate MODEL --data`.
    extra_data: list[str] = field(default_factory=list)
    out: str = ""
    encoder: str = "lstm"
    encoder_hparams: dict[str, Any] = field(default_factory=dict)
    loss: str = "cbce"
    lam: float = 0.0
    temperature: float = 0.1
    loss_params: dict[str, Any] = field(default_factory=dict)
    #: Regularizer name (training.losses.REGULARIZERS) -> {"weight": w, **its parameters}.
    regularizers: dict[str, dict[str, Any]] = field(default_factory=dict)
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 100
    patience: int = 10
    clip_grad: float = 5.0
    seed: int = 0
    #: Seed of the data split (calibration hold-out, subsampling); None: `seed`. Ensemble
    #: members share it, so they share one calibration split and one normalizer.
    split_seed: int | None = None
    #: Train one run per seed (all sharing the data split) and combine them into one ensemble
    #: run (training.ensemble); empty: a single run. The seeds are chosen on validation first
    #: (`scehr ensemble --select greedy`, docs/training.md).
    ensemble_seeds: list[int] = field(default_factory=list)
    threads: int = 2
    #: Read the training data from disk batch by batch instead of loading every split into
    #: memory (training/data/streaming.py): for datasets larger than the machine's memory.
    stream: bool = False
    #: DataLoader worker processes that read streamed batches ahead of the step (0: the
    #: training process reads them itself).
    workers: int = 0
    #: Streamed stays kept in memory per split (normalised tensors, least recently used out):
    #: the bound on the data a streamed run holds besides the batches in flight.
    cache_stays: int = 2048
    n_boot: int = 1000
    train_prevalence: float | None = None
    max_train_stays: int | None = None
    calibration_fraction: float = 0.1
    #: The run's PNG figures (ROC, PR, reliability, learning curves; t-SNE if `tsne`).
    plots: bool = True
    tsne: bool = True
    progress: bool = True
    #: joint | two_stage | ssl (training/regimes.py); `pretrain` holds the first stage:
    #: {objective, epochs, lr?, projection?, and the objective's parameters}.
    regime: str = "joint"
    pretrain: dict[str, Any] = field(default_factory=dict)
    #: Keep the labels of only this share of the training stays (label-scarce studies).
    label_fraction: float | None = None
    #: Batches of stays of similar length (padding per bucket); None: on for tasks whose
    #: stays vary in length (TaskSpec.dynamic_length), off for fixed windows.
    length_buckets: bool | None = None
    #: Probability of making each channel of each training stay absent for the whole stay
    #: (training/channel_dropout.py); 0 = off.
    channel_dropout: float = 0.0
    #: Also drop whole channel groups (GCS, labs, blood gases, ...) with the same probability.
    channel_dropout_groups: bool = False
    #: Landmark tasks (TaskSpec.landmarks): how training draws landmark hours
    #: (training/landmark.py: first_hour, hours_per_batch); empty: its defaults.
    landmark: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASK_NAMES:
            raise ValueError(f"task must be one of {', '.join(TASK_NAMES)}, not {self.task!r}")
        self.features()  # an unknown set, or one whose window does not fit the task, fails now
        if not self.encoder_hparams:
            self.encoder_hparams = encoder_preset(self.encoder, self.task)
        if not self.lam >= 0:  # also rejects NaN
            raise ValueError("lam must be >= 0")
        if self.train_prevalence is not None and not 0 < self.train_prevalence < 1:
            raise ValueError("train_prevalence must be in (0, 1)")
        if not 0 <= self.channel_dropout < 1:  # also rejects NaN
            raise ValueError(f"channel_dropout must be in [0, 1), not {self.channel_dropout!r}")
        if self.workers < 0 or self.cache_stays < 0:
            raise ValueError(f"workers and cache_stays must be >= 0, not {self.workers!r} and "
                             f"{self.cache_stays!r}")
        if self.stream and self.extra_data:
            raise ValueError("stream reads one dataset: extra_data must be empty with stream "
                             "(train on the datasets converted into one)")
        if self.label_fraction is not None and not 0 < self.label_fraction <= 1:
            raise ValueError("label_fraction must be in (0, 1]")
        # torch: imported only when a config is made
        from scehr.training.regimes import PROJECTIONS, check_regime

        check_regime(self.regime, self.pretrain, self.lam, self.regularizers)
        if self.regime != "joint":  # explicit, so runs made before the default differ
            self.pretrain = {"projection": PROJECTIONS[0], **self.pretrain}

    @property
    def buckets(self) -> bool:
        """Whether training batches group stays of similar length."""
        if self.length_buckets is not None:
            return self.length_buckets
        return task_spec(self.task).dynamic_length

    def features(self) -> FeatureSet:
        """The run's feature set: `feature_set`, else the task's (schemas.tasks)."""
        spec = task_spec(self.task)
        name = self.feature_set or spec.feature_set
        if name not in FEATURE_SETS:
            raise ValueError(f"unknown feature_set {name!r}; known: {', '.join(FEATURE_SETS)}")
        fs = FEATURE_SETS[name]
        if fs.window_hours != spec.window_hours:
            raise ValueError(f"feature_set {name!r} covers window_hours={fs.window_hours}, the "
                             f"{self.task} task needs {spec.window_hours}")
        return fs

    @property
    def data_seed(self) -> int:
        """The seed that draws the data split: `split_seed`, else `seed`."""
        return self.seed if self.split_seed is None else self.split_seed

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_param(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` with a TOML value (`units=32`, `static=true`); bare words stay strings."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip(), value


def load_config(path: str | Path | None = None, encoder_params: dict[str, Any] | None = None,
                **overrides: Any) -> TrainConfig:
    """Defaults, then the TOML file's keys, then non-None overrides (the command line).

    `encoder_params` update the encoder's hyper-parameters (the file's, or the task preset).
    """
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist")
        values.update(tomllib.loads(p.read_text()))
    values.update({k: v for k, v in overrides.items() if v is not None})
    if encoder_params:
        preset = encoder_preset(values.get("encoder", TrainConfig.encoder),
                                values.get("task", TrainConfig.task))
        values["encoder_hparams"] = {**(values.get("encoder_hparams") or preset),
                                     **encoder_params}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known: {sorted(known)}")
    return TrainConfig(**values)
