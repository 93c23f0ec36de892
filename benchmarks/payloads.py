"""Real stays as request payloads: converted benchmark CSVs (PhysioNet 2012 set C for
mortality, eICU for phenotypes) turned into the wide-form JSON a client would send, or
(`loinc_payload`) into the LOINC-coded long form a client integrating an EHR sends.

Needs pandas (the `dev`/`train` extras) and the converted data under `data/` (see docs/data.md);
`real_stays` returns None when the folder is absent so that callers can fall back to
synthetic stays (`common.full_stay`) and say so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scehr.schemas.tasks import task_spec
from scehr.schemas.variables import CATALOG

REPO = Path(__file__).resolve().parents[1]

#: The converted folder and task subfolder of real payloads, by the served model's feature set
#: (a model is sent the variables it reads: `scehr data convert-* --feature-set NAME`).
SOURCES = {"benchmark76-48h": ("physionet2012-benchmark", "in-hospital-mortality"),
           "physionet2012-full": ("physionet2012-full", "in-hospital-mortality"),
           "benchmark76-stay": ("eicu-benchmark", "phenotyping")}

UNITS = {v.benchmark_name: v.unit for v in CATALOG if v.unit_required and v.unit}
BY_NAME = {v.benchmark_name: v for v in CATALOG}


def default_feature_set(task: str, models: Path) -> str:
    """The feature set of the task's default model in `models/index.json`."""
    from scehr.schemas.model_index import read_index

    index = read_index(models)
    entry = index.entry(task, index.defaults[task])
    assert entry is not None, f"index.json names {task}'s default but has no entry for it"
    return entry.feature_set


def stay_payload(folder: Path, name: str, demo: dict[str, Any],
                 end_hours: float | None = None) -> dict[str, Any]:
    """One benchmark CSV as a wide-form payload (canonical units), with age and sex."""
    import pandas as pd

    df = pd.read_csv(folder / name)
    cols = {}
    for c in df.columns[1:]:
        vals = df[c].tolist()
        if all(isinstance(v, float) and math.isnan(v) for v in vals):
            continue
        cols[c] = [None if isinstance(v, float) and math.isnan(v) else
                   (str(v) if df[c].dtype == object else float(v)) for v in vals]
    body: dict[str, Any] = {"id": name, "wide": {
        "hours": df["Hours"].astype(float).tolist(), "columns": cols,
        "units": {c: u for c, u in UNITS.items() if c in cols}}}
    if end_hours is not None:
        body["end_hours"] = end_hours
    d = {}
    if not math.isnan(demo.get("age", math.nan)):
        d["age"] = min(float(demo["age"]), 130.0)
    if not math.isnan(demo.get("sex_male", math.nan)):
        d["sex"] = "male" if demo["sex_male"] == 1 else "female"
    if d:
        body["demographics"] = d
    return body


def loinc_payload(body: dict[str, Any]) -> dict[str, Any]:
    """A wide-form payload (`stay_payload`) as an EHR interface sends the same stay: one
    long-form observation per measurement, in time order, named by the variable's main LOINC
    code (its catalogue id where it has none), with the variable's unit where it has one."""
    wide = body["wide"]
    obs = []
    for name, values in wide["columns"].items():
        v = BY_NAME[name]
        named = {"variable": v.loinc or v.id}
        unit = {"unit": v.unit} if v.unit else {}
        obs += [{**named, "time": t, "value": x, **unit}
                for t, x in zip(wide["hours"], values, strict=True) if x is not None]
    obs.sort(key=lambda o: o["time"])
    return {**{k: x for k, x in body.items() if k != "wide"}, "observations": obs}


def real_stays(task: str, n: int, models: Path,
               data: Path | None = None) -> tuple[list[dict], str] | None:
    """The first `n` test stays of the task's converted data in the feature set of the task's
    default model in `models` (the folder the benchmark serves), with a description; None
    when the data is not there. Whole-stay tasks get `end_hours` from the listfile."""
    import pandas as pd

    root, sub = SOURCES[default_feature_set(task, models)]
    task_dir = (data or REPO / "data") / root / sub
    if not (task_dir / "test_listfile.csv").is_file():
        return None
    table = pd.read_csv(task_dir / "test_listfile.csv", dtype={"stay": str}).head(n)
    demo_file = task_dir / "test" / "demographics.csv"
    demo = (pd.read_csv(demo_file, dtype={"stay": str}).set_index("stay").to_dict("index")
            if demo_file.is_file() else {})
    whole = task_spec(task).ends_at_period_length and "period_length" in table
    stays = [stay_payload(task_dir / "test", s, demo.get(s, {}),
                          float(table["period_length"].iloc[i]) if whole else None)
             for i, s in enumerate(table["stay"])]
    return stays, f"{len(stays)} real test stays of {root}/{sub}"


def real_bundle(k: int, models: Path) -> tuple[bytes, str] | None:
    """The FHIR Bundle of the `k`-th (from 1) real mortality test stay, as `interop_latency.py
    --real` sends it (the stay's long-form observations), and its name; None without the
    converted data. Needs the repository root on `sys.path` (the writer is the tests')."""
    from tests.service.fhir_writer import bundle_of_stay, long_from_wide

    found = real_stays("mortality", k, models)
    if found is None or len(found[0]) < k:
        return None
    body = bundle_of_stay(long_from_wide(found[0][k - 1]))
    return json.dumps(body).encode(), f"real test stay {k} ({len(body['entry'])} entries)"


def default_model_stays(task: str, n: int, models: Path, hours: int = 48,
                        real: bool = True, form: str = "wide") -> tuple[list[dict[str, Any]], str]:
    """Stays the task's default model in `models` accepts, with a description: the real test
    stays when the converted data is there (and `real`), in `form` "wide" or "loinc"
    (`loinc_payload`), else synthetic `hours`-hour stays in that model's feature set
    (`common.full_stay`), with `end_hours` for whole-stay tasks."""
    from common import full_stay

    from scehr.schemas.featureset import FEATURE_SETS

    found = real_stays(task, n, models) if real else None
    if found is not None:
        if form == "loinc":
            return [loinc_payload(s) for s in found[0]], f"{found[1]}, LOINC-coded long form"
        return found[0], f"{found[1]}, wide form"
    fs = FEATURE_SETS[default_feature_set(task, models)]
    stays = [full_stay(i, hours, fs) for i in range(n)]
    if task_spec(task).ends_at_period_length:
        for s in stays:
            s["end_hours"] = float(hours)
    why = " (no converted data under data/)" if real else ""
    return stays, f"{n} synthetic {hours} h stays in {fs.name}{why}"
