"""Feature sets as data: which variables, in which order, and how each becomes tensor columns.

The sets themselves live in `resources/feature_sets.json`, each with a name, a version and
its variable ids listed explicitly, so adding a variable to the catalog never changes a
published set. A manifest records its model's set with a content hash (`manifest_dict`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.tasks import TASK_SPECS
from scehr.schemas.variables import BY_ID, Variable, name_index


class UnknownVariableError(ValueError):
    """A feature set names a variable the catalog does not have."""


#: Static demographics every feature set carries: value then a missing flag.
STATIC_FIELDS: tuple[str, ...] = ("age", "sex_male")


@dataclass(frozen=True)
class FeatureSet:
    """An ordered list of variables plus the discretisation parameters.

    Layout of one time step: each variable's value columns in order (one-hot for categorical
    channels, one column for continuous ones), then one mask column per variable.
    """

    name: str
    version: str
    variable_ids: tuple[str, ...]
    timestep: float = 1.0
    window_hours: float | None = 48.0
    max_hours: float = 48.0
    impute: str = "previous"
    start_time: str = "zero"

    def __post_init__(self) -> None:
        unknown = [v for v in self.variable_ids if v not in BY_ID]
        if unknown:
            raise UnknownVariableError(
                f"feature set {self.name!r} version {self.version} lists variable "
                f"{unknown[0]!r}, which the variable catalog (schemas/variables.py) does not "
                f"know; known ids: {', '.join(BY_ID)}")
        if len(set(self.variable_ids)) != len(self.variable_ids):
            raise ValueError(f"feature set {self.name!r} lists a variable twice")
        try:  # a payload name (alias, LOINC code) must name one variable of the set
            name_index(self.variables)
        except ValueError as e:
            raise ValueError(f"feature set {self.name!r}: {e}") from None

    @cached_property
    def variables(self) -> tuple[Variable, ...]:
        return tuple(BY_ID[v] for v in self.variable_ids)

    @cached_property
    def sha256(self) -> str:
        """Content hash of everything that fixes the tensor layout (`to_dict()`, canonical
        JSON): it changes if the set or any of its variables' catalog entries changes."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @cached_property
    def widths(self) -> np.ndarray:
        return np.array([len(v.categories) if v.is_categorical else 1 for v in self.variables])

    @cached_property
    def begins(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(np.int64)

    @cached_property
    def channel_columns(self) -> tuple[np.ndarray, ...]:
        """Per channel, its tensor columns: its value column(s), then its mask column (what
        making a channel absent, occluding it or dropping it rewrites)."""
        return tuple(np.array([*range(int(b), int(b) + int(w)), self.n_value_columns + c])
                     for c, (b, w) in enumerate(zip(self.begins, self.widths, strict=True)))

    @property
    def n_channels(self) -> int:
        return len(self.variable_ids)

    @property
    def n_value_columns(self) -> int:
        return int(self.widths.sum())

    @property
    def n_features(self) -> int:
        return self.n_value_columns + self.n_channels

    @property
    def n_static(self) -> int:
        return 2 * len(STATIC_FIELDS)

    @cached_property
    def continuous_columns(self) -> np.ndarray:
        """Columns that are z-scored: continuous value columns only."""
        return np.array(
            [b for v, b in zip(self.variables, self.begins, strict=True) if not v.is_categorical],
            dtype=np.int64,
        )

    def column_names(self) -> list[str]:
        names: list[str] = []
        for v in self.variables:
            if v.is_categorical:
                names += [f"{v.id}={c}" for c in v.categories]
            else:
                names.append(v.id)
        return names + [f"mask:{v.id}" for v in self.variables]

    def n_bins(self, end_hours: np.ndarray | float) -> np.ndarray:
        """Bins for a stay ending at `end_hours`, as the benchmark counts them."""
        eps = 1e-6
        return (np.asarray(end_hours, dtype=np.float64) / self.timestep + 1.0 - eps).astype(
            np.int64
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "variables": [
                {
                    "id": v.id,
                    "benchmark_name": v.benchmark_name,
                    "encoding": "one-hot" if v.is_categorical else "continuous",
                    "categories": list(v.categories),
                    "normal": v.normal,
                    "unit": v.unit,
                }
                for v in self.variables
            ],
            "static": list(STATIC_FIELDS),
            "timestep": self.timestep,
            "window_hours": self.window_hours,
            "max_hours": self.max_hours,
            "impute": self.impute,
            "start_time": self.start_time,
            "masks": True,
            "n_features": self.n_features,
        }

    def manifest_dict(self) -> dict[str, Any]:
        """`to_dict()` plus its content hash, as a manifest records the model's feature set."""
        return {**self.to_dict(), "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSet:
        """The feature set a manifest describes; if it records a content hash (manifests since
        the feature sets became data), the set rebuilt from today's catalog must match it."""
        fs = cls._from_dict(d)
        if "sha256" in d and d["sha256"] != fs.sha256:
            raise ValueError(
                f"feature set {fs.name!r} version {fs.version}: its content hash "
                f"{fs.sha256[:12]}... differs from the manifest's {str(d['sha256'])[:12]}...: "
                "the variable catalog changed since the model was exported")
        return fs

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> FeatureSet:
        return cls(
            name=d["name"],
            version=d["version"],
            variable_ids=tuple(v["id"] for v in d["variables"]),
            timestep=float(d["timestep"]),
            window_hours=None if d["window_hours"] is None else float(d["window_hours"]),
            max_hours=float(d["max_hours"]),
            impute=d.get("impute", "previous"),
            start_time=d.get("start_time", "zero"),
        )


#: The feature sets, as data: name -> version, explicit variable ids, discretisation.
FEATURE_SET_FILE = Path(__file__).with_name("resources") / "feature_sets.json"


def load_feature_sets(path: Path = FEATURE_SET_FILE) -> dict[str, FeatureSet]:
    """Every feature set of `path`; an unknown variable id fails here, naming set and id."""
    raw = json.loads(Path(path).read_text())["feature_sets"]
    return {
        name: FeatureSet(
            name=name, version=str(d["version"]), variable_ids=tuple(d["variables"]),
            timestep=float(d["timestep"]),
            window_hours=None if d["window_hours"] is None else float(d["window_hours"]),
            max_hours=float(d["max_hours"]), impute=d.get("impute", "previous"),
            start_time=d.get("start_time", "zero"))
        for name, d in raw.items()
    }


FEATURE_SETS: dict[str, FeatureSet] = load_feature_sets()
#: The benchmark's 17-channel, 76-feature layout over the first 48 hours (mortality).
BENCHMARK_48H = FEATURE_SETS["benchmark76-48h"]
#: The same layout over the whole stay, capped (phenotyping).
BENCHMARK_STAY = FEATURE_SETS["benchmark76-stay"]

#: Task name -> the feature set its models use (named by the task registry).
TASK_FEATURE_SETS: dict[str, FeatureSet] = {
    t.name: FEATURE_SETS[t.feature_set] for t in TASK_SPECS.values()}
