"""Feature sets as data: which variables, in which order, and how each becomes tensor columns."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from schemas.tasks import TASK_SPECS
from schemas.variables import VARIABLES, Variable, lookup

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

    @cached_property
    def variables(self) -> tuple[Variable, ...]:
        return tuple(lookup(v) for v in self.variable_ids)

    @cached_property
    def widths(self) -> np.ndarray:
        return np.array([len(v.categories) if v.is_categorical else 1 for v in self.variables])

    @cached_property
    def begins(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.widths)[:-1]]).astype(np.int64)

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSet:
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


_IDS = tuple(v.id for v in VARIABLES)

#: The benchmark's 17-channel, 76-feature layout over the first 48 hours (mortality).
BENCHMARK_48H = FeatureSet("benchmark76-48h", "1", _IDS, window_hours=48.0, max_hours=48.0)
#: The same layout over the whole stay, capped (phenotyping).
BENCHMARK_STAY = FeatureSet("benchmark76-stay", "1", _IDS, window_hours=None, max_hours=240.0)

FEATURE_SETS: dict[str, FeatureSet] = {fs.name: fs for fs in (BENCHMARK_48H, BENCHMARK_STAY)}
#: Task name -> the feature set its models use (named by the task registry).
TASK_FEATURE_SETS: dict[str, FeatureSet] = {
    t.name: FEATURE_SETS[t.feature_set] for t in TASK_SPECS.values()}
