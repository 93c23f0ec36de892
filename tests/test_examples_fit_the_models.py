"""The examples in examples/ fit the shipped models they are written for: each answers 200 with
no warning, except the ones examples/README.md explains (listed here, so a new warning fails),
and the recorded response example is what the default model answers today."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[1]
EXAMPLES, MODELS = REPO / "examples", REPO / "models"

#: (route, example, mortality version served or None for the default) -> the variables of the
#: warnings examples/README.md explains for it.
#: A channel the model never saw in training gets the feature set's "not observed" notice
#: whether or not it is sent (see examples/README.md).
NEVER_SEEN_BY_1_1_0 = {"capillary_refill_rate", "gcs_eye", "gcs_motor", "gcs_verbal"}
CASES: dict[tuple[str, str, str | None], set[str]] = {
    ("/predict/mortality", "mortality_stay.json", None): set(),
    ("/predict/phenotypes", "phenotypes_stay.json", None): NEVER_SEEN_BY_1_1_0 | {"gcs_total"},
    ("/predict/mortality", "mortality_stay_benchmark17.json", "1.1.1"): NEVER_SEEN_BY_1_1_0,
    # the ICU type as an HSLOC-typed Location, ventilation as SNOMED CT Procedures
    ("/fhir/predict/mortality", "fhir_bundle.json", None): set(),
}


def warnings_of(body: dict[str, Any]) -> set[str]:
    """The variables the warnings of a JSON or FHIR answer name."""
    if body.get("resourceType") == "Bundle":
        out: set[str] = set()
        for e in body["entry"]:
            res = e["resource"]
            if res["resourceType"] == "OperationOutcome":
                out |= {i.get("diagnostics", "").split()[0] for i in res["issue"]
                        if i["severity"] == "warning"}
        return out
    return {w["message"].split()[0] for w in body["warnings"]}


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: c[1])
async def test_example_answers_without_unexplained_warnings(case: tuple) -> None:
    route, name, version = case
    versions = {"mortality": version} if version else {}
    body = json.loads((EXAMPLES / name).read_text())
    async with serve(Settings(model_dir=MODELS, device="cpu", versions=versions)) as client:
        client: httpx.AsyncClient
        r = await client.post(route, json=body)
    assert r.status_code == 200, r.text
    assert warnings_of(r.json()) == CASES[case]
    readme = (EXAMPLES / "README.md").read_text()
    assert all(v in readme for v in CASES[case])


async def test_the_recorded_response_is_todays_answer() -> None:
    recorded = json.loads((EXAMPLES / "mortality_response.json").read_text())
    body = json.loads((EXAMPLES / "mortality_stay.json").read_text())
    async with serve(Settings(model_dir=MODELS, device="cpu")) as client:
        client: httpx.AsyncClient
        now = (await client.post("/predict/mortality", json=body)).json()
    assert now["warnings"] == recorded["warnings"] == []
    assert now["id"] == recorded["id"] and now["model"] == recorded["model"]
    assert now["results"][0]["risk"] == pytest.approx(recorded["results"][0]["risk"], abs=1e-6)
    # the same response version and fields (a field dropped or added makes the example stale)
    assert now["response_version"] == recorded["response_version"]
    assert list(now["results"][0]) == list(recorded["results"][0])
