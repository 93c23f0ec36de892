"""Request examples for the OpenAPI schema (`examples/<task>_stay.json` when present)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from scehr.schemas.tasks import TASK_NAMES, landmark_task, task_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_FILE = EXAMPLES / "mortality_stay.json"
RESPONSE_FILE = EXAMPLES / "mortality_response.json"
FHIR_FILE = EXAMPLES / "fhir_bundle.json"
CDS_FILE = EXAMPLES / "cds_hooks_request.json"


def _long_form(hours: list[float]) -> dict[str, Any]:
    obs: list[dict[str, Any]] = []
    for t in hours:
        obs += [
            {"variable": "heart_rate", "time": t, "value": 92, "unit": "bpm"},
            {"variable": "systolic_bp", "time": t, "value": 118, "unit": "mmHg"},
            {"variable": "diastolic_bp", "time": t, "value": 64, "unit": "mmHg"},
            {"variable": "respiratory_rate", "time": t, "value": 20},
            {"variable": "o2_saturation", "time": t, "value": 96, "unit": "%"},
            {"variable": "temperature", "time": t, "value": 37.4, "unit": "Cel"},
        ]
    obs += [
        {"variable": "glucose", "time": 2.0, "value": 7.8, "unit": "mmol/L"},
        {"variable": "gcs_total", "time": 1.0, "value": "14"},
        {"variable": "gcs_eye", "time": 1.0, "value": 4},
        {"variable": "fio2", "time": 1.0, "value": 40, "unit": "%"},
        {"variable": "ph", "time": 3.0, "value": 7.31},
    ]
    return {"id": "example-1", "observations": obs,
            "demographics": {"age": 67, "sex": "female"}}


def _example_task(task: str) -> str:
    """A landmark task reads the stays of the outcome it gives at every hour, so it shows theirs.
    """
    if not task_spec(task).landmarks:
        return task
    return next((t for t in TASK_NAMES if t != task and landmark_task(t) == task), task)


@cache
def task_stay(task: str) -> dict[str, Any]:
    """`examples/<task>_stay.json` (a landmark task: its outcome's) when present, else a
    long-form stay inside the task's window."""
    path = EXAMPLES / f"{_example_task(task)}_stay.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    window = task_spec(task).window_hours
    if window is not None:
        return _long_form([1.0, 6.0, 12.0, 24.0, 36.0, window - 1.0])
    return _long_form([1.0, 12.0, 24.0, 48.0, 72.0, 96.0])


def wide_stay() -> dict[str, Any]:
    return {
        "id": "example-wide",
        "wide": {
            "hours": [0.5, 4.0, 8.0],
            "columns": {"Heart Rate": [88, 95, None], "Temperature": [36.9, None, 38.2],
                        "Glascow coma scale total": ["15", None, "13"]},
            "units": {"Temperature": "Cel"},
        },
    }


def stay_examples(task: str) -> dict[str, dict[str, Any]]:
    first = task_stay(task)
    return {
        "long": {"summary": "Long form: one observation per row", "value": first},
        "wide": {"summary": "Wide form: the benchmark CSV layout", "value": wide_stay()},
    }


def batch_examples(task: str) -> dict[str, dict[str, Any]]:
    good = task_stay(task)
    bad = {"id": "bad", "observations": [{"variable": "heart_rate", "time": -1, "value": 80}]}
    return {"mixed": {"summary": "Two stays; the second is rejected on its own",
                      "value": {"stays": [good, wide_stay(), bad]}}}


def _read(path: Path) -> dict[str, Any] | None:
    """An example file's JSON object, or None when it is missing or not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


@cache
def mortality_response() -> dict[str, Any] | None:
    """A real response (the current response version) for the OpenAPI schema, when the file
    exists."""
    return _read(RESPONSE_FILE)


def _named(name: str, summary: str, value: dict[str, Any] | None) -> dict[str, Any]:
    """An OpenAPI `examples` entry, or none when the example file is missing."""
    return {} if value is None else {name: {"summary": summary, "value": value}}


def fhir_examples() -> dict[str, Any]:
    """The FHIR route's request example: `examples/fhir_bundle.json`."""
    return _named("stay", "A synthetic 48-hour ICU stay: Patient, Encounter, Location, "
                  "Observations, ventilation Procedures", _read(FHIR_FILE))


def cds_examples() -> dict[str, Any]:
    """The CDS Hooks service call's request example: `examples/cds_hooks_request.json`."""
    return _named("patient-view", "patient-view with the stay's Bundle as its prefetch",
                  _read(CDS_FILE))


def infer_examples(task: str) -> dict[str, Any]:
    """The V2 infer request example: the task's example stay as the `stay` BYTES tensor."""
    request = {"inputs": [{"name": "stay", "shape": [1], "datatype": "BYTES",
                           "data": [json.dumps(task_stay(task))]}],
               "outputs": [{"name": "risk"}, {"name": "alert"}]}
    return _named("stay", f"One stay as JSON text (the body of POST /predict/{task})", request)


def response_examples(batch: bool = False) -> dict[int | str, dict[str, Any]]:
    """`responses=` entry with a 200 example (a one-item batch for the batch route)."""
    one = mortality_response()
    if one is None:
        return {}
    value: dict[str, Any] = one
    if batch:
        value = {"response_version": one["response_version"], "model": one["model"],
                 "items": [{"index": 0, "id": one.get("id"), "prediction": one,
                            "errors": None}]}
    return {200: {"content": {"application/json": {"example": value}}}}
