"""The variable catalog: ids, names, units, categories, ranges, plausibility and LOINC codes.

`VARIABLES` are the 17 channels of the MIMIC-III benchmark. Their category strings, one-hot
order and normal values are exactly those of the benchmark's `discretizer_config.json`; the
outlier/valid ranges are its `variable_ranges.csv` (a test checks both against the resource
files in `../shared/data` when present). `ICU_VARIABLES` add every other PhysioNet 2012 series
(labs, blood gases, invasive and non-invasive pressures, urine output, ventilation) and the
ICU type; `CATALOG` is both. A payload names a variable by id, name, alias or LOINC code
(`name_index`); the plausibility rule (`Plausible`) says which values cannot be physiological.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
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
class Plausible:
    """The physiological plausibility rule: values outside it cannot be a measurement.

    Such values become missing (a warning naming `rule`), before the benchmark cleaning
    rule. `scaled_by`: a value that lies in the plausible range once divided by it is
    a known scaling (pH x 100) and is divided, not dropped.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    scaled_by: float | None = None

    def rule(self, var_id: str) -> str:
        """The rule as text, e.g. `heart_rate > 0` or `ph in [6.5, 8]`."""
        lo = None if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        hi = None if self.high is None else f"<= {self.high:g}"
        text = f"{var_id} {' and '.join(x for x in (lo, hi) if x)}"
        if self.scaled_by:
            text += f" (x{self.scaled_by:g} values divided by {self.scaled_by:g})"
        return text


@dataclass(frozen=True)
class Variable:
    """One catalog variable (a benchmark channel, or a series the benchmark lacks)."""

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
    aliases: tuple[str, ...] = ()
    plausible: Plausible | None = None
    #: Categories are scores in order ("3" < "15"): summaries may use them as numbers.
    ordinal: bool = False
    #: Each value is an amount per charting interval (urine): its sum over a window means
    #: something.
    cumulative: bool = False

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


def _inches_to_cm(v: float) -> float:
    """Whole centimetres (half to even), as the benchmark converted its training data."""
    cm = v * 2.54
    return float(round(cm)) if math.isfinite(cm) else cm


MMHG = (_unit("mmHg", "mm[Hg]", "mm hg"),)
#: Zero or less is a recording artefact (a disconnected line, an empty field), never a value.
ABOVE_ZERO = Plausible(0.0, low_open=True)
PER_MIN = (_unit("/min", "bpm", "beats/min", "breaths/min", "min-1", "{beats}/min",
                 "{breaths}/min"),)
#: Breaths also as MIMIC-III charts them ("insp/min").
BREATHS_PER_MIN = (_unit(*PER_MIN[0].spellings, "insp/min"),)

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
                          "abnormal": "1.0", "delayed": "1.0", "normal <3 secs": "0.0",
                          "abnormal >3 secs": "1.0"},
        ranges=Ranges(0, 0, 1, 1), loinc=None,
        description="0.0 = normal (< 3 s), 1.0 = abnormal (>= 3 s)",
    ),
    Variable("diastolic_bp", "Diastolic blood pressure", "continuous", "59.0", "mmHg", MMHG,
             ranges=Ranges(0, 0, 375, 375), loinc="8462-4",
             other_loinc=("76213-8", "76535-4"), plausible=ABOVE_ZERO),
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
             ranges=Ranges(3, 3, 15, 15), loinc="9269-2", aliases=("GCS",), ordinal=True),
    Variable("gcs_verbal", "Glascow coma scale verbal response", "categorical", "5 Oriented",
             categories=_VERBAL,
             category_aliases=_scores({5: "5 Oriented", 4: "4 Confused", 3: "3 Inapprop words",
                                       2: "2 Incomp sounds", 1: "1 No Response"}),
             ranges=Ranges(1, 1, 5, 5), loinc="9270-0"),
    Variable(
        "glucose", "Glucose", "continuous", "128.0", "mg/dL",
        (_unit("mg/dL", "mg/dl"), _unit("mmol/L", "mmol/l", f=lambda v: v * 18.0156)),
        unit_required=True, ranges=Ranges(0, 33, 2000, 2200), loinc="2345-7",
        other_loinc=("2339-0",), plausible=ABOVE_ZERO,
    ),
    Variable("heart_rate", "Heart Rate", "continuous", "86", "/min", PER_MIN,
             ranges=Ranges(0, 0, 350, 390), loinc="8867-4", aliases=("HR",),
             plausible=ABOVE_ZERO),
    Variable(
        "height", "Height", "continuous", "170.0", "cm",
        (_unit("cm"), _unit("in", "inch", "[in_i]", f=_inches_to_cm),
         _unit("m", f=lambda v: v * 100.0)),
        unit_required=True, ranges=Ranges(0, 0, 240, 275), loinc="8302-2",
        plausible=ABOVE_ZERO,
    ),
    Variable("mean_bp", "Mean blood pressure", "continuous", "77.0", "mmHg", MMHG,
             ranges=Ranges(0, 14, 330, 375), loinc="8478-0", plausible=ABOVE_ZERO),
    Variable("o2_saturation", "Oxygen saturation", "continuous", "98.0", "%",
             (_unit("%", "percent"),), ranges=Ranges(0, 0, 100, 150), loinc="59408-5",
             other_loinc=("2708-6",), plausible=ABOVE_ZERO,
             description="SpO2 or SaO2 in percent (the benchmark merges both)"),
    Variable("respiratory_rate", "Respiratory rate", "continuous", "19", "/min",
             BREATHS_PER_MIN,
             ranges=Ranges(0, 0, 300, 330), loinc="9279-1", aliases=("RespRate",),
             plausible=ABOVE_ZERO),
    Variable("systolic_bp", "Systolic blood pressure", "continuous", "118.0", "mmHg", MMHG,
             ranges=Ranges(0, 0, 375, 375), loinc="8480-6",
             other_loinc=("76215-3", "76534-7"), plausible=ABOVE_ZERO),
    Variable(
        "temperature", "Temperature", "continuous", "36.6", "Cel",
        # "Deg. C" and "?C" (the degree sign lost in export) are MIMIC-III's spellings
        (_unit("Cel", "C", "°C", "degC", "celsius", "Deg. C", "?C"),
         _unit("[degF]", "F", "°F", "degF", "fahrenheit", "Deg. F", "?F",
               f=lambda v: (v - 32.0) * 5.0 / 9.0)),
        unit_required=True, ranges=Ranges(14.2, 26, 45, 47), loinc="8310-5",
        aliases=("Temp",),
    ),
    Variable(
        "weight", "Weight", "continuous", "81.0", "kg",
        # the benchmark's pound (0.453592 kg, 4e-7 short of the exact one), so that values
        # sent in pounds or ounces equal the training data's
        (_unit("kg"), _unit("[lb_av]", "lb", "lbs", "pound", f=lambda v: v * 0.453592),
         _unit("[oz_av]", "oz", "ounce", f=lambda v: v / 16.0 * 0.453592),
         _unit("g", f=lambda v: v / 1000.0)),
        unit_required=True, ranges=Ranges(0, 0, 250, 250), loinc="29463-7",
        other_loinc=("3141-9",), plausible=ABOVE_ZERO,
    ),
    Variable("ph", "pH", "continuous", "7.4", "pH", (_unit("pH", "[pH]", "1", "units"),),
             ranges=Ranges(6.3, 6.3, 8.4, 10), loinc="11558-4",
             other_loinc=("2744-1",), plausible=Plausible(6.5, 8.0, scaled_by=100.0)),
)


def _lab(vid: str, name: str, unit: str, normal: str, loinc: str | None, *,
         spellings: tuple[str, ...] = (), units: tuple[Unit, ...] = (),
         other_loinc: tuple[str, ...] = (),
         aliases: tuple[str, ...] = (), plausible: Plausible | None = ABOVE_ZERO,
         description: str = "", cumulative: bool = False) -> Variable:
    """A continuous variable outside the benchmark: no benchmark ranges, a plausibility rule,
    and a unit that may be omitted (then it is the canonical one)."""
    return Variable(vid, name, "continuous", normal, unit, (_unit(unit, *spellings), *units),
                    loinc=loinc,
                    other_loinc=other_loinc, aliases=aliases, plausible=plausible,
                    description=description, cumulative=cumulative)


def _per_l_to_mg_dl(mg_per_mmol: float) -> Callable[[float], float]:
    """mmol/L (or umol/L with `mg_per_mmol` / 1000) -> mg/dL for a molar mass in g/mol."""
    return lambda v: v * mg_per_mmol / 10.0


MMOL_L = ("mmol/L", "mEq/L")
U_L = ("U/L", "IU/L", "[IU]/L")
PER_NL = ("10*9/L", "10^9/L", "10*3/uL", "10^3/uL", "K/uL", "/nL")
KPA = _unit("kPa", "kpa", f=lambda v: v * 7.500617)


def _mmhg_bp(vid: str, name: str, normal: str, loinc: str, alias: str,
             generic: tuple[str, ...] = ()) -> Variable:
    return Variable(vid, name, "continuous", normal, "mmHg", MMHG, loinc=loinc,
                    other_loinc=generic, aliases=(alias,),
                    plausible=Plausible(0.0, 375.0, low_open=True))


#: Every other PhysioNet 2012 series and the ICU type; units are PhysioNet's (checked on the
#: data: magnesium is in mg/dL although the Challenge page says mmol/L). LOINC: the
#: serum/plasma (or arterial blood) term first; docs/variables.md says where they come from.
ICU_VARIABLES: tuple[Variable, ...] = (
    _lab("albumin", "Albumin", "g/dL", "4.0", "1751-7", aliases=("Albumin",),
         units=(_unit("g/L", f=lambda v: v / 10.0),), plausible=Plausible(0, 10, True)),
    _lab("alp", "Alkaline phosphatase", "U/L", "70", "6768-6", aliases=("ALP",),
         spellings=U_L[1:], plausible=Plausible(0, 20000, True)),
    _lab("alt", "Alanine aminotransferase", "U/L", "25", "1742-6", aliases=("ALT",),
         spellings=U_L[1:], plausible=Plausible(0, 50000, True)),
    _lab("ast", "Aspartate aminotransferase", "U/L", "25", "1920-8", aliases=("AST",),
         spellings=U_L[1:], plausible=Plausible(0, 50000, True)),
    _lab("bilirubin", "Bilirubin total", "mg/dL", "0.7", "1975-2", aliases=("Bilirubin",),
         units=(_unit("umol/L", "µmol/L", f=lambda v: v / 17.104),),
         plausible=Plausible(0, 100, True)),
    _lab("bun", "Blood urea nitrogen", "mg/dL", "14", "3094-0", other_loinc=("6299-2",),
         aliases=("BUN", "urea nitrogen"),
         units=(_unit("mmol/L", f=lambda v: v * 2.8014),),
         plausible=Plausible(0, 300, True),
         description="urea nitrogen; mmol/L of urea (or of urea nitrogen) x 2.8014"),
    _lab("cholesterol", "Cholesterol", "mg/dL", "170", "2093-3", aliases=("Cholesterol",),
         units=(_unit("mmol/L", f=_per_l_to_mg_dl(386.65)),),
         plausible=Plausible(0, 1500, True)),
    _lab("creatinine", "Creatinine", "mg/dL", "0.9", "2160-0", other_loinc=("38483-4",),
         aliases=("Creatinine",),
         units=(_unit("umol/L", "µmol/L", f=lambda v: v / 88.42),),
         plausible=Plausible(0, 40, True)),
    _lab("hco3", "Bicarbonate", "mmol/L", "24", "1963-8", other_loinc=("1960-4", "2028-9"),
         aliases=("HCO3", "bicarbonate"), spellings=MMOL_L[1:],
         plausible=Plausible(0, 70, True),
         description="serum bicarbonate (total CO2 read as the same) or arterial HCO3"),
    _lab("hematocrit", "Hematocrit", "%", "42", "4544-3", other_loinc=("20570-8",),
         aliases=("HCT",), units=(_unit("fraction", "L/L", "1", f=lambda v: v * 100.0),),
         plausible=Plausible(0, 80, True)),
    _lab("potassium", "Potassium", "mmol/L", "4.2", "2823-3", other_loinc=("6298-4",),
         aliases=("K",), spellings=MMOL_L[1:], plausible=Plausible(0, 12, True)),
    _lab("lactate", "Lactate", "mmol/L", "1.0", "2524-7", other_loinc=("32693-4", "2518-9"),
         aliases=("Lactate",), units=(_unit("mg/dL", f=lambda v: v / 9.008),),
         plausible=Plausible(0, 40, True)),
    _lab("magnesium", "Magnesium", "mg/dL", "2.0", "19123-9", other_loinc=("2601-3",),
         aliases=("Mg",),
         units=(_unit("mmol/L", f=_per_l_to_mg_dl(24.305)),
                _unit("mEq/L", f=lambda v: v * 24.305 / 20.0)),
         plausible=Plausible(0, 20, True)),
    _lab("sodium", "Sodium", "mmol/L", "140", "2951-2", other_loinc=("2947-0",),
         aliases=("Na",), spellings=MMOL_L[1:], plausible=Plausible(80, 220)),
    _lab("paco2", "Arterial carbon dioxide tension", "mmHg", "40", "2019-8",
         aliases=("PaCO2",), spellings=MMHG[0].spellings[1:], units=(KPA,),
         plausible=Plausible(5, 250)),
    _lab("pao2", "Arterial oxygen tension", "mmHg", "95", "2703-7", aliases=("PaO2",),
         spellings=MMHG[0].spellings[1:], units=(KPA,), plausible=Plausible(10, 800)),
    _lab("platelets", "Platelets", "10*9/L", "250", "777-3", other_loinc=("26515-7",),
         aliases=("Platelets",), spellings=PER_NL[1:],
         plausible=Plausible(0, 3000, True)),
    _lab("sao2", "Arterial oxygen saturation", "%", "98", "2708-6", aliases=("SaO2",),
         spellings=("percent",), units=(_unit("fraction", f=lambda v: v * 100.0),),
         plausible=Plausible(0, 100, True),
         description="SaO2, measured in an arterial blood gas"),
    _lab("spo2", "Pulse oximetry saturation", "%", "98", "59408-5", other_loinc=("2710-2",),
         aliases=("SpO2",), spellings=("percent",), plausible=Plausible(0, 100, True),
         description="SpO2, by pulse oximetry (not a PhysioNet 2012 series)"),
    _lab("troponin_i", "Troponin I", "ng/mL", "0.01", "10839-9", other_loinc=("42757-5",),
         aliases=("TroponinI",),
         spellings=("ug/L", "µg/L", "ng/ml"),
         units=(_unit("ng/L", f=lambda v: v / 1000.0),),
         plausible=Plausible(0, 1000, True)),
    _lab("troponin_t", "Troponin T", "ng/mL", "0.01", "6598-7", aliases=("TroponinT",),
         spellings=("ug/L", "µg/L", "ng/ml"),
         units=(_unit("ng/L", f=lambda v: v / 1000.0),),
         plausible=Plausible(0, 1000, True)),
    _lab("urine_output", "Urine output", "mL", "70", "9187-6", aliases=("Urine",),
         spellings=("ml",), units=(_unit("L", "l", f=lambda v: v * 1000.0),),
         plausible=Plausible(0, 15000), cumulative=True,
         description="volume since the previous charting (PhysioNet: per charting interval)"),
    _lab("wbc", "White blood cells", "10*9/L", "7.5", "6690-2", other_loinc=("26464-8",),
         aliases=("WBC", "leukocytes"), spellings=PER_NL[1:],
         plausible=Plausible(0, 500, True)),
    Variable("mechanical_ventilation", "Mechanical ventilation", "continuous", "0", "1",
             (_unit("1", "{flag}"),), aliases=("MechVent",), plausible=Plausible(0, 1),
             description="1 while mechanically ventilated (PhysioNet charts only 1s); no LOINC "
                         "term was identified with confidence"),
    _mmhg_bp("invasive_systolic_bp", "Invasive systolic arterial pressure", "118.0",
             "76215-3", "SysABP"),
    _mmhg_bp("invasive_diastolic_bp", "Invasive diastolic arterial pressure", "59.0",
             "76213-8", "DiasABP"),
    _mmhg_bp("invasive_mean_bp", "Invasive mean arterial pressure", "77.0", "76214-6", "MAP"),
    # The generic codes (8480-6, 8462-4, 8478-0: the FHIR vital-signs profile's blood
    # pressure, which does not say how it was measured) read as the cuff in the full set; a
    # model of the benchmark channels reads them as its one systolic/diastolic/mean channel.
    _mmhg_bp("noninvasive_systolic_bp", "Non-invasive systolic blood pressure", "118.0",
             "76534-7", "NISysABP", generic=("8480-6",)),
    _mmhg_bp("noninvasive_diastolic_bp", "Non-invasive diastolic blood pressure", "59.0",
             "76535-4", "NIDiasABP", generic=("8462-4",)),
    _mmhg_bp("noninvasive_mean_bp", "Non-invasive mean blood pressure", "77.0", "76536-2",
             "NIMAP", generic=("8478-0",)),
    Variable("icu_type", "ICU type", "categorical", "3", categories=("1", "2", "3", "4"),
             category_aliases={"1.0": "1", "2.0": "2", "3.0": "3", "4.0": "4",
                               "ccu": "1", "coronary care unit": "1",
                               "csru": "2", "cardiac surgery recovery unit": "2",
                               "micu": "3", "medical icu": "3",
                               "sicu": "4", "surgical icu": "4"},
             aliases=("ICUType",),
             description="static, observed at t = 0: PhysioNet's ICUType (1 coronary care, "
                         "2 cardiac surgery recovery, 3 medical, 4 surgical); no LOINC term"),
)

#: Every variable a feature set may use: the 17 benchmark channels, then the rest.
CATALOG: tuple[Variable, ...] = VARIABLES + ICU_VARIABLES
BY_ID: dict[str, Variable] = {v.id: v for v in CATALOG}
BY_BENCHMARK_NAME: dict[str, Variable] = {v.benchmark_name: v for v in VARIABLES}


def loinc_index(variables: Sequence[Variable]) -> dict[str, Variable]:
    """LOINC code -> the variable among `variables` it measures.

    Codes resolve per feature set: some are also the main code of a finer catalog variable
    (invasive diastolic pressure is a `diastolic_bp` among the benchmark channels and an
    `invasive_diastolic_bp` in the full PhysioNet set), and `name_index` already refuses a
    feature set in which two variables share a code.
    """
    return {c: v for v in variables for c in v.loinc_codes}


#: LOINC code -> benchmark channel (the map of the benchmark-shaped models).
BY_LOINC: dict[str, Variable] = loinc_index(VARIABLES)

LOINC_SYSTEM = "http://loinc.org"
#: LOINC panels whose `component`s carry the channels (each component coded on its own).
LOINC_PANELS: dict[str, str] = {
    "85354-9": "Blood pressure panel with all children optional",
    "55284-4": "Blood pressure systolic and diastolic",
}


def by_loinc(code: str, index: Mapping[str, Variable] = BY_LOINC) -> Variable | None:
    """The variable a LOINC code measures in `index` (a `loinc_index`; default the benchmark
    channels), or None when it does not map it."""
    return index.get(code.strip())


def names_of(v: Variable) -> tuple[str, ...]:
    """Every name a payload may give `v`: id, name (the benchmark column), aliases, LOINC."""
    return (v.id, v.benchmark_name, *v.aliases, *v.loinc_codes)


def name_index(variables: Sequence[Variable]) -> dict[str, int]:
    """Position of each variable under every name a payload may use (`names_of`), each also
    in lower case (see `find`). Raises ValueError if two variables share a name."""
    idx: dict[str, int] = {}
    for i, v in enumerate(variables):
        for name in names_of(v):
            for key in (name, name.lower()):
                if idx.setdefault(key, i) != i:
                    raise ValueError(f"{key!r} names both {variables[idx[key]].id} and {v.id}")
    return idx


def find(index: Mapping[str, int], name: str) -> int | None:
    """The one name rule: exact, else stripped and lower-cased; None if unknown."""
    i = index.get(name)
    return index.get(name.strip().lower()) if i is None else i


def _catalog_index() -> dict[str, int]:
    """Ids, names and aliases across the catalog (LOINC codes resolve per feature set)."""
    idx: dict[str, int] = {}
    for i, v in enumerate(CATALOG):
        for name in (v.id, v.benchmark_name, *v.aliases):
            for key in (name, name.lower()):
                if idx.setdefault(key, i) != i:
                    raise ValueError(f"{key!r} names both {CATALOG[idx[key]].id} and {v.id}")
    return idx


_CATALOG_INDEX = _catalog_index()


def in_catalog(name: str) -> Variable | None:
    """The catalog variable a name (id, name or alias) means, whatever the feature set."""
    i = find(_CATALOG_INDEX, name)
    return None if i is None else CATALOG[i]


def did_you_mean(name: str, variables: Iterable[Variable]) -> str:
    """" (did you mean heart_rate?)" for a misspelt name (difflib, against the ids, names and
    aliases of `variables`, case-insensitive), or "" when nothing is close."""
    spelling: dict[str, str] = {}
    for v in variables:
        for n in (v.id, v.benchmark_name, *v.aliases):
            spelling.setdefault(n.lower(), v.id)
    close = difflib.get_close_matches(str(name).lower(), list(spelling), n=3, cutoff=0.75)
    ids = list(dict.fromkeys(spelling[c] for c in close))
    return f" (did you mean {' or '.join(ids)}?)" if ids else ""


def lookup(name: str) -> Variable:
    """A variable by id, name or alias (case-insensitive); raises KeyError."""
    var = in_catalog(name)
    if var is None:
        raise KeyError(f"unknown variable {name!r}{did_you_mean(name, CATALOG)}; known ids: "
                       f"{[v.id for v in CATALOG]}")
    return var


def catalog_markdown() -> str:
    """The catalog as markdown tables (docs/variables.md is generated from it and tested)."""
    lines = [
        "# Variables: the catalog",
        "",
        "Generated from `schemas/variables.py` (`python -m scehr.schemas.variables > "
        "docs/variables.md`). A payload names a variable by its id, its name, an alias or a "
        "LOINC code (each also case-insensitive); a feature set accepts the names of its own "
        "variables only. A unit is required where the table says so; without one, a value is "
        "in the canonical unit. Values outside the plausible range cannot be physiological and "
        "become missing (`value_implausible`, naming the rule; pH x 100 is divided instead, "
        "`value_rescaled`); then, for the 17 benchmark channels, values outside the outlier "
        "bounds are dropped and values between an outlier and a valid bound clipped (each a "
        "warning).",
        "",
        "## The 17 benchmark channels",
        "",
        "| id | benchmark name | kind | unit (canonical) | accepted units | unit required |"
        " normal | plausible | valid range | outlier bounds | LOINC (first: main; others also "
        "read) | aliases |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIABLES:
        r = v.ranges
        valid = "" if r is None else f"{r.valid_low:g} to {r.valid_high:g}"
        outl = "" if r is None else f"< {r.outlier_low:g} or > {r.outlier_high:g}"
        if v.is_categorical:  # checked by category membership, not by the numeric rule
            valid, outl = "a category below", ""
        units = ", ".join(f"`{s}`" for u in v.units for s in u.spellings)
        lines.append(f"| `{v.id}` | {v.benchmark_name} | {v.kind} | {v.unit or ''} | {units} | "
                     f"{'yes' if v.unit_required else 'no'} | {v.normal} | {_plausible(v)} | "
                     f"{valid} | {outl} | {', '.join(v.loinc_codes)} | "
                     f"{', '.join(v.aliases)} |")
    lines += ["", "LOINC panels read through their components (FHIR `Observation.component`): "
              + ", ".join(f"{c} ({n})" for c, n in LOINC_PANELS.items()) + ".", ""]
    lines += [
        "## The other PhysioNet 2012 series and the ICU type",
        "",
        "No benchmark ranges: only the plausibility rule applies. The PhysioNet parameter name "
        "is an alias. `spo2` is no PhysioNet series (the eICU grid's saturation is mostly "
        "pulse oximetry). Accepted units are converted to the canonical one.",
        "",
        "| id | name | kind | unit (canonical) | accepted units | normal | plausible | LOINC "
        "(first: main; others also read) | aliases | description |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in ICU_VARIABLES:
        units = ", ".join(f"`{s}`" for u in v.units for s in u.spellings)
        lines.append(f"| `{v.id}` | {v.benchmark_name} | {v.kind} | {v.unit or ''} | {units} | "
                     f"{v.normal} | {_plausible(v)} | {', '.join(v.loinc_codes)} | "
                     f"{', '.join(v.aliases)} | {v.description} |")
    lines += [
        "",
        "Where the LOINC codes come from: the LOINC terms (loinc.org) for the quantity, the "
        "main code the serum/plasma (or arterial blood) term and the others the whole-blood "
        "or related terms read as the same quantity. Every code passes LOINC's mod-10 check "
        "digit (tested); the lab codes were cross-checked by name against public HL7 FHIR "
        "value sets (e.g. 2160-0 Creatinine [Mass/volume] in Serum or Plasma, 3094-0 Urea "
        "nitrogen, 2823-3 Potassium, 2951-2 Sodium, 19123-9 Magnesium [Mass/volume]), not "
        "against a LOINC release file, which the repository does not ship. Mechanical "
        "ventilation and the ICU type have no code: no LOINC term was identified with "
        "confidence.",
        "",
    ]
    lines += ["## Categories and their aliases", "",
              "Categorical values are the benchmark's exact strings (their one-hot order is the "
              "order below) or one of these aliases, each mapped to exactly one benchmark string. "
              "A JSON number is read as its integer text (4 → \"4\").", ""]
    for v in CATALOG:
        if not v.is_categorical:
            continue
        lines += [f"### `{v.id}` ({v.benchmark_name})", "",
                  "Benchmark strings: " + ", ".join(f'"{c}"' for c in v.categories) + ".", ""]
        if v.category_aliases:
            lines += ["| alias | means |", "|---|---|"]
            lines += [f"| `{a}` | \"{c}\" |" for a, c in v.category_aliases.items()]
            lines.append("")
    return "\n".join(lines)


def _plausible(v: Variable) -> str:
    """The plausibility rule as a table cell."""
    if v.plausible is None:
        return ""
    p = v.plausible
    lo = "" if p.low is None else f"{'>' if p.low_open else '>='} {p.low:g}"
    hi = "" if p.high is None else f"<= {p.high:g}"
    text = ", ".join(x for x in (lo, hi) if x)
    return text + (f"; x{p.scaled_by:g} divided" if p.scaled_by else "")


if __name__ == "__main__":
    print(catalog_markdown())
