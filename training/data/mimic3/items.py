"""MIMIC item ids as benchmark variables, for event data that carries MIMIC's items (MEDS).

`itemid_to_variable_map.csv` (rows with STATUS ready) names each item's variable. Many MIMIC
items chart their values without a unit (VALUEUOM empty), and the benchmark's cleaning assumes
one from the variable and the item's label, as `events.CLEAN_SQL` does: FiO2 in percent (unless
the unit says torr), glucose in mg/dL, weight in pounds or ounces where the label says so, else
kilograms, height in inches where the label says so, else centimetres; temperature in
Fahrenheit where the label says so, else Celsius. `item_unit` is that assumption, written once,
for a reader that converts units by the catalog's rules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from scehr.schemas.variables import BY_BENCHMARK_NAME

_FAHRENHEIT = re.compile(r"(\bF\b|\[F\]|fahrenheit)", re.IGNORECASE)


def item_unit(variable: str, label: str) -> str | None:
    """The unit the benchmark assumes for an item of `variable` (catalog id) charted without
    one; None where the catalog's default (no unit) applies."""
    low = label.lower()
    if variable == "fio2":
        return "%"
    if variable == "glucose":
        return "mg/dL"
    if variable == "weight":
        return "oz" if "oz" in low else "lb" if "lb" in low else "kg"
    if variable == "height":
        return "in" if "in" in low.replace("height", "") else "cm"
    if variable == "temperature":
        return "F" if _FAHRENHEIT.search(label) else "C"
    return None


def item_unit_as_read(variable: str, unit: str | None) -> str | None:
    """A MIMIC item's unit as the benchmark reads it. FiO2 is a percentage whatever unit it
    was charted with (Vision FiO2's `decFrc` values are 21 to 100), except with the unit torr,
    which FiO2 (Analyzed) charts fractions with: the benchmark divides every other by 100."""
    if variable == "fio2":
        return "fraction" if unit is not None and "torr" in unit.lower() else "%"
    return unit


def read_item_map(path: Path) -> pd.DataFrame:
    """itemid (str), variable (catalog id), unit (assumed where the row has none, or None) of
    the map's ready rows."""
    m = pd.read_csv(path, dtype=str, keep_default_na=False)
    m = m[(m.STATUS == "ready") & (m.LEVEL2 != "")]
    var = [BY_BENCHMARK_NAME[name].id for name in m.LEVEL2]
    return pd.DataFrame({"itemid": [str(int(i)) for i in m.ITEMID], "variable": var,
                         "unit": [item_unit(v, lab) for v, lab in zip(
                             var, m["MIMIC LABEL"], strict=True)]})
