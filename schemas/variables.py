"""The 17 channels of the MIMIC-III benchmark: ids, units, categories, ranges and codes.

Category strings, their one-hot order and the normal values are exactly those of the
benchmark's `discretizer_config.json`; the outlier/valid ranges are its `variable_ranges.csv`.
A test checks both against the resource files in `../shared/data` when present.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["continuous", "categorical"]


def identity(v: float) -> float:
    """The conversion of a unit that already is canonical (ingest skips calling it)."""
    return v


@dataclass(frozen=True)
class Unit:
    """An accepted unit: its spellings and the conversion into the canonical unit."""

    name: str
    spellings: tuple[str, ...]
    to_canonical: Callable[[float], float] = field(repr=False, default=identity)

    @property
    def is_identity(self) -> bool:
        return self.to_canonical is identity


@dataclass(frozen=True)
class Ranges:
    """The benchmark cleaning rule: drop outside the outlier bounds, clip to the valid bounds."""

    outlier_low: float
    valid_low: float
    valid_high: float
    outlier_high: float


@dataclass(frozen=True)
class Variable:
    """One benchmark channel."""

    id: str
    benchmark_name: str
    kind: Kind
    normal: str
    unit: str | None = None
    units: tuple[Unit, ...] = ()
    unit_required: bool = False
    categories: tuple[str, ...] = ()
    category_aliases: Mapping[str, str] = field(default_factory=dict)
    ranges: Ranges | None = None
    loinc: str | None = None
    other_loinc: tuple[str, ...] = ()
    description: str = ""

    @property
    def loinc_codes(self) -> tuple[str, ...]:
        """Every LOINC code read as this channel (the main one first)."""
        return ((self.loinc,) if self.loinc else ()) + self.other_loinc

    @property
    def is_categorical(self) -> bool:
        return self.kind == "categorical"

    @property
    def normal_float(self) -> float:
        """Normal value as the tensor holds it (category index for categorical channels)."""
        if self.is_categorical:
            return float(self.categories.index(self.normal))
        return float(self.normal)

    def convert(self, value: float, unit: str | None) -> float:
        """Convert `value` from `unit` to the canonical unit; raises `UnitError`."""
        u = self.unit_for(unit)
        return value if u is None else u.to_canonical(value)

    def unit_for(self, unit: str | None) -> Unit | None:
        """The accepted unit a spelling names (None: no unit given, and none is required);
        the one place units are matched. Raises `UnitError`."""
        if unit is None or unit == "":
            if self.unit_required:
                raise UnitError(f"unit is required for {self.id}; accepted: {self.unit_names()}")
            return None
        key = unit.strip().lower()
        for u in self.units:
            if key in (s.lower() for s in u.spellings):
                return u
        raise UnitError(
            f"unit {unit!r} is not accepted for {self.id}; accepted: {self.unit_names()}"
        )

    def unit_names(self) -> list[str]:
        return [s for u in self.units for s in u.spellings[:1]]

    def category_index(self, value: str | float | int) -> int:
        """Index of a category (its one-hot position) from a benchmark string or alias."""
        if isinstance(value, bool):
            raise CategoryError(f"{value!r} is not a category of {self.id}")
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                raise CategoryError(f"{value!r} is not a category of {self.id}")
            key = str(int(value)) if float(value).is_integer() else str(value)
        else:
            key = value
        if key in self.categories:
            return self.categories.index(key)
        canonical = self.category_aliases.get(key)
        if canonical is None and isinstance(key, str):
            canonical = self.category_aliases.get(key.strip().lower())
        if canonical is None:
            raise CategoryError(
                f"{value!r} is not a category of {self.id}; accepted: {list(self.categories)} "
                f"or aliases {sorted(self.category_aliases)}"
            )
        return self.categories.index(canonical)


class UnitError(ValueError):
    """A unit that is missing where required or cannot be converted."""


class CategoryError(ValueError):
    """A categorical value that is neither a benchmark string nor a documented alias."""


def _unit(name: str, *spellings: str, f: Callable[[float], float] = identity) -> Unit:
    return Unit(name, (name, *spellings), f)


MMHG = (_unit("mmHg", "mm[Hg]", "mm hg"),)
PER_MIN = (_unit("/min", "bpm", "beats/min", "breaths/min", "min-1", "{beats}/min",
                 "{breaths}/min"),)

_EYE = ("To Pain", "3 To speech", "1 No Response", "4 Spontaneously", "None", "To Speech",
        "Spontaneously", "2 To pain")
_MOTOR = ("1 No Response", "3 Abnorm flexion", "Abnormal extension", "No response",
          "4 Flex-withdraws", "Localizes Pain", "Flex-withdraws", "Obeys Commands",
          "Abnormal Flexion", "6 Obeys Commands", "5 Localizes Pain", "2 Abnorm extensn")
_TOTAL = ("11", "10", "13", "12", "15", "14", "3", "5", "4", "7", "6", "9", "8")
_VERBAL = ("1 No Response", "No Response", "Confused", "Inappropriate Words", "Oriented",
           "No Response-ETT", "5 Oriented", "Incomprehensible sounds", "1.0 ET/Trach",
           "4 Confused", "2 Incomp sounds", "3 Inapprop words")


def _scores(mapping: Mapping[int, str]) -> dict[str, str]:
    """Numeric score aliases ("4", "4.0") mapped to the numbered benchmark string."""
    out: dict[str, str] = {}
    for score, name in mapping.items():
        out[str(score)] = name
        out[f"{score}.0"] = name
    return out


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "capillary_refill_rate", "Capillary refill rate", "categorical", "0.0",
        categories=("0.0", "1.0"),
        category_aliases={"0": "0.0", "1": "1.0", "normal": "0.0", "brisk": "0.0",
                          "abnormal": "1.0", "delayed": "1.0"},
        ranges=Ranges(0, 0, 1, 1), loinc=None,
        description="0.0 = normal (< 3 s), 1.0 = abnormal (>= 3 s)",
    ),
    Variable("diastolic_bp", "Diastolic blood pressure", "continuous", "59.0", "mmHg", MMHG,
             ranges=Ranges(0, 0, 375, 375), loinc="8462-4",
             other_loinc=("76213-8", "76535-4")),
    Variable(
        "fio2", "Fraction inspired oxygen", "continuous", "0.21", "fraction",
        (_unit("fraction", "1", "ratio"), _unit("%", "percent", f=lambda v: v / 100.0)),
        unit_required=True, ranges=Ranges(0.2, 0.21, 1, 1.1), loinc="3150-0",
    ),
    Variable("gcs_eye", "Glascow coma scale eye opening", "categorical", "4 Spontaneously",
             categories=_EYE,
             category_aliases=_scores({4: "4 Spontaneously", 3: "3 To speech", 2: "2 To pain",
                                       1: "1 No Response"}),
             ranges=Ranges(1, 1, 4, 4), loinc="9267-6"),
    Variable("gcs_motor", "Glascow coma scale motor response", "categorical", "6 Obeys Commands",
             categories=_MOTOR,
             category_aliases=_scores({6: "6 Obeys Commands", 5: "5 Localizes Pain",
                                       4: "4 Flex-withdraws", 3: "3 Abnorm flexion",
                                       2: "2 Abnorm extensn", 1: "1 No Response"}),
             ranges=Ranges(1, 1, 6, 6), loinc="9268-4"),
    Variable("gcs_total", "Glascow coma scale total", "categorical", "15", categories=_TOTAL,
             category_aliases={f"{s}.0": str(s) for s in range(3, 16)},
             ranges=Ranges(3, 3, 15, 15), loinc="9269-2"),
    Variable("gcs_verbal", "Glascow coma scale verbal response", "categorical", "5 Oriented",
             categories=_VERBAL,
             category_aliases=_scores({5: "5 Oriented", 4: "4 Confused", 3: "3 Inapprop words",
                                       2: "2 Incomp sounds", 1: "1 No Response"}),
             ranges=Ranges(1, 1, 5, 5), loinc="9270-0"),
    Variable(
        "glucose", "Glucose", "continuous", "128.0", "mg/dL",
        (_unit("mg/dL", "mg/dl"), _unit("mmol/L", "mmol/l", f=lambda v: v * 18.0156)),
        unit_required=True, ranges=Ranges(0, 33, 2000, 2200), loinc="2345-7",
        other_loinc=("2339-0",),
    ),
    Variable("heart_rate", "Heart Rate", "continuous", "86", "/min", PER_MIN,
             ranges=Ranges(0, 0, 350, 390), loinc="8867-4"),
    Variable(
        "height", "Height", "continuous", "170.0", "cm",
        (_unit("cm"), _unit("in", "inch", "[in_i]", f=lambda v: v * 2.54),
         _unit("m", f=lambda v: v * 100.0)),
        unit_required=True, ranges=Ranges(0, 0, 240, 275), loinc="8302-2",
    ),
    Variable("mean_bp", "Mean blood pressure", "continuous", "77.0", "mmHg", MMHG,
             ranges=Ranges(0, 14, 330, 375), loinc="8478-0"),
    Variable("o2_saturation", "Oxygen saturation", "continuous", "98.0", "%",
             (_unit("%", "percent"),), ranges=Ranges(0, 0, 100, 150), loinc="59408-5",
             other_loinc=("2708-6",),
             description="SpO2 or SaO2 in percent (the benchmark merges both)"),
    Variable("respiratory_rate", "Respiratory rate", "continuous", "19", "/min", PER_MIN,
             ranges=Ranges(0, 0, 300, 330), loinc="9279-1"),
    Variable("systolic_bp", "Systolic blood pressure", "continuous", "118.0", "mmHg", MMHG,
             ranges=Ranges(0, 0, 375, 375), loinc="8480-6",
             other_loinc=("76215-3", "76534-7")),
    Variable(
        "temperature", "Temperature", "continuous", "36.6", "Cel",
        (_unit("Cel", "C", "°C", "degC", "celsius"),
         _unit("[degF]", "F", "°F", "degF", "fahrenheit", f=lambda v: (v - 32.0) * 5.0 / 9.0)),
        unit_required=True, ranges=Ranges(14.2, 26, 45, 47), loinc="8310-5",
    ),
    Variable(
        "weight", "Weight", "continuous", "81.0", "kg",
        (_unit("kg"), _unit("[lb_av]", "lb", "lbs", "pound", f=lambda v: v * 0.45359237),
         _unit("g", f=lambda v: v / 1000.0)),
        unit_required=True, ranges=Ranges(0, 0, 250, 250), loinc="29463-7",
        other_loinc=("3141-9",),
    ),
    Variable("ph", "pH", "continuous", "7.4", "pH", (_unit("pH", "[pH]", "1"),),
             ranges=Ranges(6.3, 6.3, 8.4, 10), loinc="11558-4",
             other_loinc=("2744-1",)),
)

BY_ID: dict[str, Variable] = {v.id: v for v in VARIABLES}
BY_BENCHMARK_NAME: dict[str, Variable] = {v.benchmark_name: v for v in VARIABLES}
BY_LOINC: dict[str, Variable] = {c: v for v in VARIABLES for c in v.loinc_codes}

LOINC_SYSTEM = "http://loinc.org"
#: LOINC panels whose `component`s carry the channels (each component coded on its own).
LOINC_PANELS: dict[str, str] = {
    "85354-9": "Blood pressure panel with all children optional",
    "55284-4": "Blood pressure systolic and diastolic",
}


def by_loinc(code: str) -> Variable | None:
    """The channel a LOINC code measures, or None when the catalog does not map it."""
    return BY_LOINC.get(code.strip())


def name_index(variables: Sequence[Variable]) -> dict[str, int]:
    """Position of each variable under every name a payload may use: its id, its benchmark
    column name, and that name in lower case (see `find`)."""
    idx: dict[str, int] = {}
    for i, v in enumerate(variables):
        idx[v.id] = i
        idx[v.benchmark_name] = i
        idx[v.benchmark_name.lower()] = i
    return idx


def find(index: Mapping[str, int], name: str) -> int | None:
    """The one name rule: exact, else stripped and lower-cased; None if unknown."""
    i = index.get(name)
    return index.get(name.strip().lower()) if i is None else i


_CATALOG_INDEX = name_index(VARIABLES)


def lookup(name: str) -> Variable:
    """A variable by machine id or benchmark column name (case-insensitive); raises KeyError."""
    i = find(_CATALOG_INDEX, name)
    if i is None:
        raise KeyError(f"unknown variable {name!r}; known ids: {[v.id for v in VARIABLES]}")
    return VARIABLES[i]


def catalog_markdown() -> str:
    """The catalog as a markdown table (docs/variables.md is generated from it and tested)."""
    lines = [
        "# Variables: the 17 benchmark channels",
        "",
        "Generated from `schemas/variables.py` (`python -m schemas.variables > docs/variables.md`)."
        " Variable names in payloads: the id or the benchmark name (case-insensitive). A unit is"
        " required where the table says so; values outside the outlier bounds are dropped and"
        " values between an outlier and a valid bound clipped (each a warning).",
        "",
        "| id | benchmark name | kind | unit (canonical) | accepted units | unit required |"
        " normal | valid range | outlier bounds | LOINC (first: main; others also read) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIABLES:
        r = v.ranges
        valid = "" if r is None else f"{r.valid_low:g} to {r.valid_high:g}"
        outl = "" if r is None else f"< {r.outlier_low:g} or > {r.outlier_high:g}"
        if v.is_categorical:  # checked by category membership, not by the numeric rule
            valid, outl = "a category below", ""
        units = ", ".join(f"`{s}`" for u in v.units for s in u.spellings)
        lines.append(f"| `{v.id}` | {v.benchmark_name} | {v.kind} | {v.unit or ''} | {units} | "
                     f"{'yes' if v.unit_required else 'no'} | {v.normal} | {valid} | {outl} | "
                     f"{', '.join(v.loinc_codes)} |")
    lines += ["", "LOINC panels read through their components (FHIR `Observation.component`): "
              + ", ".join(f"{c} ({n})" for c, n in LOINC_PANELS.items()) + ".", ""]
    lines += ["## Categories and their aliases", "",
              "Categorical values are the benchmark's exact strings (their one-hot order is the "
              "order below) or one of these aliases, each mapped to exactly one benchmark string. "
              "A JSON number is read as its integer text (4 → \"4\").", ""]
    for v in VARIABLES:
        if not v.is_categorical:
            continue
        lines += [f"### `{v.id}` ({v.benchmark_name})", "",
                  "Benchmark strings: " + ", ".join(f'"{c}"' for c in v.categories) + ".", ""]
        if v.category_aliases:
            lines += ["| alias | means |", "|---|---|"]
            lines += [f"| `{a}` | \"{c}\" |" for a, c in v.category_aliases.items()]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(catalog_markdown())
