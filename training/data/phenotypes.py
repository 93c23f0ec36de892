"""The 25 benchmark phenotypes: HCUP CCS 2015 groups matched to ICD-9 diagnosis codes.

As mimic3-benchmarks does it: the definitions file maps undotted ICD-9 codes to CCS groups; a
stay is positive for a group if any of its codes is listed there (exact string match); only the
groups with `use_in_benchmark: True` are labels. The listfile column order is the benchmark's:
those group names sorted alphabetically (`sorted(definitions)` then filtered), as below.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scehr.schemas.tasks import PHENOTYPE_LABELS as PHENOTYPE_LABELS  # the labels live in the task
from scehr.training.data.layout import ccs_definitions_path

# ICD-9-CM diagnosis codes: 3 digits (001-999), V + 2 digits, or E + 3 digits, then an optional
# decimal part. ICD-10 codes (a letter then 2 digits, e.g. E86.0, I25.10) and ICD-9 procedure
# codes (2 digits, e.g. 31.1) do not match.
_ICD9 = re.compile(r"^(?:\d{3}(?:\.\d{0,2})?|V\d{2}(?:\.\d{0,2})?|E\d{3}(?:\.\d?)?)$")


def icd9_codes(field: str | float | None) -> list[str]:
    """The ICD-9 codes of one eICU `icd9code` cell, undotted as the benchmark stores them.

    eICU writes "414.00, I25.10" (ICD-9 then ICD-10): split on commas, keep ICD-9-shaped
    codes, drop the dot: ["41400"].
    """
    if not isinstance(field, str):
        return []
    out = []
    for part in field.split(","):
        code = part.strip().upper()
        if _ICD9.match(code):
            out.append(code.replace(".", ""))
    return out


def icd9_long(stay: np.ndarray, fields: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised `icd9_codes` over many cells: (stay index, undotted code) pairs."""
    cells = pd.Series(np.asarray(fields, dtype=object), index=np.asarray(stay))
    cells = cells.dropna()
    parts = cells.astype(str).str.split(",").explode().str.strip().str.upper()
    parts = parts[parts.str.match(_ICD9.pattern).fillna(False).astype(bool)]
    codes = parts.str.replace(".", "", regex=False)
    return parts.index.to_numpy(dtype=np.int64), codes.to_numpy(dtype=str)


def load_ccs_definitions(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The benchmark's `hcup_ccs_2015_definitions.yaml` (from the data folder by default)."""
    import yaml

    path = Path(path) if path is not None else ccs_definitions_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"HCUP CCS definitions not found: {path} (expected mimic3-benchmarks' "
            "mimic3benchmark/resources/hcup_ccs_2015_definitions.yaml; set SCEHR_DATA_DIR)"
        )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml (C) when built in
    with open(path) as f:
        return yaml.load(f, Loader=loader)


def benchmark_groups(definitions: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """Benchmark label names in listfile order: sorted group names with use_in_benchmark."""
    return tuple(g for g in sorted(definitions) if definitions[g].get("use_in_benchmark"))


def code_to_group(definitions: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Undotted ICD-9 code -> CCS group name (the benchmark's `def_map`)."""
    out: dict[str, str] = {}
    for group, d in definitions.items():
        for code in d.get("codes", []):
            out[str(code)] = group
    return out


def label_matrix(stay: np.ndarray, codes: Iterable[str], n_stays: int,
                 definitions: Mapping[str, Any]) -> np.ndarray:
    """[n_stays, 25] int8 labels from long-form (stay index, undotted ICD-9 code) pairs."""
    groups = benchmark_groups(definitions)
    col = {g: i for i, g in enumerate(groups)}
    group = pd.Series(list(codes), dtype=object).map(code_to_group(definitions))
    j = group.map(col).to_numpy(dtype=np.float64, na_value=np.nan)
    ok = ~np.isnan(j)
    out = np.zeros((n_stays, len(groups)), dtype=np.int8)
    out[np.asarray(stay)[ok], j[ok].astype(np.int64)] = 1
    return out
