"""The FHIR answer is written as plain JSON: `fhir.resources` must read every shape of it as
valid FHIR R4 and give back exactly the same JSON (no element lost, renamed or reformatted),
for both shipped tasks, with and without the risk interval, with OperationOutcome issues of
each kind, and for a stay below the data minimum."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fhir.resources.R4B.bundle import Bundle

from scehr.schemas.payloads import Prediction
from scehr.service.interfaces.options import choose_point
from scehr.service.interop.fhir_in import FhirStay, read_bundle
from scehr.service.interop.fhir_out import RISK_INTERVAL_URL, risk_bundle, to_json
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model, read_index, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings
from tests.service.fhir_writer import EXAMPLE_ADMISSION, REPO, Item, bundle, example_bundle

MODELS = REPO / "models"
WHEN = datetime(2026, 3, 1, 6, 30, 5, 123456, tzinfo=UTC)


@pytest.fixture(scope="module", params=["mortality", "phenotypes"])
def model(request: pytest.FixtureRequest) -> LoadedModel:
    task = request.param
    settings = Settings(model_dir=MODELS, device="cpu")
    return load_model(resolve(MODELS, read_index(MODELS), task), task, settings)


def scored(model: LoadedModel, body: dict[str, Any]) -> tuple[Prediction, FhirStay]:
    stay = read_bundle(body, variables=model.spec.fs.variables)
    prep = prepare(model.spec, [stay.payload])
    out = model.run(prep.inputs)
    choice = choose_point(model.spec, None, None, False)
    return predictions(model.spec, prep, out, choice=choice)[0], stay


def warned_bundle() -> dict[str, Any]:
    """The example stay plus a code no model reads (an adapter issue) and a heart rate
    outside the cleaning range (a prediction warning pointing back to its element)."""
    b = example_bundle()
    extra = bundle([[Item(2.0, "94500-6", 180.0, "mg/dL")], [Item(3.0, "8867-4", 900.0, "/min")]],
                   admission=EXAMPLE_ADMISSION, patient="example")["entry"][2:]
    for i, e in enumerate(extra):
        e["resource"]["id"] = e["fullUrl"] = f"extra-{i}"
    b["entry"] += extra
    return b


def round_trip(answer: dict[str, Any]) -> dict[str, Any]:
    """What the FHIR library makes of the answer: validated whole, written back."""
    return json.loads(Bundle.model_validate(answer).model_dump_json(exclude_none=True))


def resources(answer: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in answer["entry"] if e["resource"]["resourceType"] == kind]


def test_the_answer_is_what_fhir_resources_writes(model: LoadedModel) -> None:
    pred, stay = scored(model, warned_bundle())
    answer = json.loads(to_json(risk_bundle(pred, model.spec.manifest, stay, WHEN)))
    assert round_trip(answer) == answer
    ras = resources(answer, "RiskAssessment")
    assert len(ras) == len(model.spec.manifest.classes)
    for ra, r in zip(ras, pred.results, strict=True):
        p = ra["prediction"][0]
        assert p["probabilityDecimal"] == r.risk
        assert p["extension"][0]["url"] == RISK_INTERVAL_URL
        assert ra["occurrenceDateTime"] == "2026-03-01T06:30:05.123456Z"
        assert ra["subject"] == {"reference": "Patient/example"}
        assert {"reference": "Observation/example-obs-0"} in ra["basis"]
    [oo] = resources(answer, "OperationOutcome")
    [unmapped] = [i for i in oo["issue"] if "94500-6" in i["diagnostics"]]
    assert unmapped["details"]["text"] == "unmapped_code" and unmapped["expression"]
    dropped = [i for i in oo["issue"] if i["details"]["text"].startswith("value_")]
    assert dropped and dropped[0]["expression"][0].startswith("Bundle.entry[")


def test_without_an_interval_and_with_another_timezone(model: LoadedModel) -> None:
    pred, stay = scored(model, example_bundle())
    plain = pred.model_copy(update={"results": [r.model_copy(update={"risk_interval": None})
                                                for r in pred.results]})
    when = WHEN.astimezone(timezone(timedelta(hours=2)))
    answer = json.loads(to_json(risk_bundle(plain, model.spec.manifest, stay, when)))
    assert round_trip(answer) == answer
    assert answer["timestamp"] == "2026-03-01T08:30:05.123456+02:00"
    assert all("extension" not in ra["prediction"][0]
               for ra in resources(answer, "RiskAssessment"))


def test_a_stay_below_the_minimum_gets_only_the_operation_outcome(
        model: LoadedModel) -> None:
    thin = bundle([[Item(1.0, "8867-4", 80.0, "/min")]], admission=EXAMPLE_ADMISSION,
                  patient="thin")
    pred, stay = scored(model, thin)
    assert pred.status == "insufficient_data"
    answer = json.loads(to_json(risk_bundle(pred, model.spec.manifest, stay, WHEN)))
    assert round_trip(answer) == answer
    [entry] = answer["entry"]
    issue = next(i for i in entry["resource"]["issue"] if i["code"] == "incomplete")
    assert issue["details"]["coding"][0]["code"] == "insufficient_data"
    assert "No RiskAssessment is given" in issue["diagnostics"]


def test_the_rows_read_are_those_their_names_give(model: LoadedModel) -> None:
    """The observations that reached the model (the answer's `basis`), taken straight from
    the ingested rows when each is named `["observations", row]`, are those the general path
    (a row's name looked up one by one) gives, with their times; a dropped heart rate is not
    among them."""
    stay = read_bundle(warned_bundle(), variables=model.spec.fs.variables)
    rows_at = prepare(model.spec, [stay.payload]).rows_at[0]
    direct = rows_at()
    ingested = rows_at.args[1]
    ingested.locate = lambda row: ["observations", row]  # not the default: the general path
    assert direct == rows_at()
    assert 0 < len(direct[0]) < len(stay.payload.columns.value)
