"""FHIR R4, CDS Hooks and the Open Inference Protocol over the fixture models: every interface
gives the risk `POST /predict/{task}` gives; outputs validate against their schemas."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils as triton_utils
from fhir.resources.R4B.bundle import Bundle
from fhir.resources.R4B.riskassessment import RiskAssessment
from pydantic import ValidationError

from scehr.schemas.featureset import BENCHMARK_48H, FEATURE_SETS
from scehr.schemas.outcomes import MORTALITY, PHENOTYPE_CCS
from scehr.schemas.payloads import StayPayload
from scehr.schemas.tasks import outcome_coding
from scehr.schemas.variables import BY_LOINC, LOINC_PANELS, VARIABLES, by_loinc, loinc_index
from scehr.service.interop.fhir_in import fhir_path
from scehr.service.pipeline import prepare
from scehr.service.settings import Settings
from tests.conftest import SHARED_DATA, needs_shared_data
from tests.service import cds_hooks_schema as cds
from tests.service.conftest import serve, stay
from tests.service.fhir_writer import (
    CODES,
    Item,
    birth_date_for,
    bundle,
    groups_from_stay,
)
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio
ADMISSION = datetime.fromisoformat("2026-03-01T06:30:00+00:00")
AGE, SEX = 64, "male"
#: Same risk to 1e-6: CDS Hooks scores with explain=full, whose occlusion rows share the ORT
#: batch, and float32 rounding may differ in the last bits with the batch's composition.
TOL = 1e-6


def json_stay(**extra: Any) -> dict[str, Any]:
    return stay(demographics={"age": AGE, "sex": SEX}, **extra)


def fhir_bundle(**kw: Any) -> dict[str, Any]:
    return bundle(groups_from_stay(json_stay()), admission=ADMISSION, patient="p1",
                  birth_date=birth_date_for(AGE, ADMISSION), gender=SEX, **kw)


def cds_request(b: dict[str, Any]) -> dict[str, Any]:
    res = [e["resource"] for e in b["entry"]]
    obs = [{"resource": r} for r in res if r["resourceType"] == "Observation"]
    return {"hook": "patient-view", "hookInstance": "2b5c5a4e-1d8e-4a4e-9f3c-7a7f5d1d9e10",
            "context": {"userId": "Practitioner/u1", "patientId": "p1",
                        "encounterId": "p1-icu"},
            "prefetch": {"patient": res[0], "encounter": res[1],
                         "observations": {"resourceType": "Bundle", "type": "searchset",
                                          "entry": obs}}}


def risk_assessments(body: dict[str, Any]) -> list[RiskAssessment]:
    b = Bundle.model_validate(body)  # the FHIR library validates the whole answer
    assert b.type == "collection"
    return [e.resource for e in b.entry if e.resource.get_resource_type() == "RiskAssessment"]


# ------------------------------------------------------------------ the catalog's codes


def test_catalog_maps_every_loinc_code_of_an_independent_table() -> None:
    """Each code of the writer's own table reads as its variable in every feature set that
    has that variable (the generic BP codes: the benchmark channel, or the full set's cuff)."""
    for vid, (code, _) in CODES.items():
        sets = [fs for fs in FEATURE_SETS.values() if vid in fs.variable_ids]
        assert sets, vid
        for fs in sets:
            var = by_loinc(code, loinc_index(fs.variables))
            assert var is not None and var.id == vid, (code, fs.name)
    codes = [c for v in VARIABLES for c in v.loinc_codes]
    assert len(codes) == len(set(codes)) == len(BY_LOINC), "one channel per LOINC code"
    assert "85354-9" in LOINC_PANELS and by_loinc("85354-9") is None
    assert by_loinc("8480-6").id == "systolic_bp" and by_loinc("8462-4").id == "diastolic_bp"


def test_outcome_codings() -> None:
    assert outcome_coding("in_hospital_mortality") == MORTALITY
    assert len(PHENOTYPE_CCS) == 25 and len(set(PHENOTYPE_CCS.values())) == 25
    assert outcome_coding("Shock").code == "249"
    assert outcome_coding("not a phenotype") is None


@needs_shared_data
def test_phenotype_ccs_ids_match_the_benchmark_definitions() -> None:
    import yaml

    path = (SHARED_DATA / "mimic3-benchmarks-resources" / "mimic3benchmark" / "resources"
            / "hcup_ccs_2015_definitions.yaml")
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    defs = yaml.load(path.read_text(), Loader=loader)
    used = {name: int(d["id"]) for name, d in defs.items() if d["use_in_benchmark"]}
    assert used == PHENOTYPE_CCS


# ------------------------------------------------------------------ same risk everywhere


async def test_every_interface_gives_the_risk_of_the_json_path(
        client: httpx.AsyncClient) -> None:
    ref = (await client.post("/predict/mortality", json=json_stay())).json()
    risk = ref["results"][0]["risk"]

    r = await client.post("/fhir/predict/mortality", json=fhir_bundle())
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/fhir+json")
    [ra] = risk_assessments(r.json())
    assert float(ra.prediction[0].probabilityDecimal) == pytest.approx(risk, abs=TOL)

    r = await client.post("/cds-services/scehr-mortality", json=cds_request(fhir_bundle()))
    assert r.status_code == 200, r.text
    [card] = r.json()["cards"]
    assert card["extension"]["dev.scehr.result"]["risk"] == pytest.approx(risk, abs=TOL)

    stay_text = json.dumps(json_stay())
    r = await client.post("/v2/models/mortality/infer", json={"inputs": [
        {"name": "stay", "shape": [1], "datatype": "BYTES", "data": [stay_text]}]})
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["risk"]["data"][0] == pytest.approx(risk, abs=TOL)

    # the graph's own tensors, as prepare() makes them, through an independent V2 client
    spec = client.app.state.registry.get("mortality").model.spec  # type: ignore[attr-defined]
    prep = prepare(spec, [StayPayload.model_validate(json_stay())])
    assert prep.inputs is not None
    inputs = []
    for name, arr in (("x", prep.inputs.x), ("lengths", prep.inputs.lengths),
                      ("static", prep.inputs.static)):
        if arr is None:
            continue
        t = triton.InferInput(name, list(arr.shape), "FP32" if arr.dtype == np.float32
                              else "INT64")
        t.set_data_from_numpy(arr, binary_data=False)
        inputs.append(t)
    wanted = [triton.InferRequestedOutput(n, binary_data=False)
              for n in ("risk", "probability", "alert")]
    body, _ = triton.InferenceServerClient.generate_request_body(inputs, outputs=wanted,
                                                                request_id="r1")
    r = await client.post("/v2/models/mortality/infer", content=body,
                          headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    res = triton.InferResult.from_response_body(r.content)
    assert res.get_response()["id"] == "r1"
    assert res.as_numpy("risk").shape == (1, 1)
    assert res.as_numpy("risk")[0, 0] == pytest.approx(risk, abs=TOL)
    assert res.as_numpy("probability")[0, 0] == pytest.approx(
        ref["results"][0]["score"], abs=1e-6)
    assert bool(res.as_numpy("alert")[0, 0]) == ref["results"][0]["alert"]


# ------------------------------------------------------------------ FHIR in and out


async def test_risk_assessment_carries_what_the_chart_needs(client: httpx.AsyncClient) -> None:
    b = fhir_bundle()
    r = await client.post("/fhir/predict/mortality?explain=full", json=b)
    assert r.status_code == 200, r.text
    [ra] = risk_assessments(r.json())
    assert ra.status == "final" and ra.subject.reference == "Patient/p1"
    assert ra.encounter.reference == "Encounter/p1-icu"
    assert ra.occurrenceDateTime is not None
    model = client.app.state.registry.get("mortality").model  # type: ignore[attr-defined]
    [coding] = ra.method.coding
    assert (coding.code, coding.version) == (model.spec.ref.name, model.spec.ref.version)
    assert model.spec.ref.sha256 in ra.method.text
    n_obs = sum(e["resource"]["resourceType"] == "Observation" for e in b["entry"])
    assert len(ra.basis) == n_obs
    assert {x.reference for x in ra.basis} == {
        f"Observation/{e['resource']['id']}" for e in b["entry"]
        if e["resource"]["resourceType"] == "Observation"}
    [p] = ra.prediction
    assert (p.outcome.coding[0].system, p.outcome.coding[0].code) == (
        MORTALITY.system, MORTALITY.code)
    assert p.qualitativeRisk.coding[0].code in ("low", "moderate", "high")
    assert p.rationale.startswith("Risk ") and "anchor" in p.rationale
    assert "Variables raising the risk most" in p.rationale or "occlusion" not in p.rationale


async def test_phenotypes_give_one_risk_assessment_per_class(
        client: httpx.AsyncClient) -> None:
    r = await client.post("/fhir/predict/phenotypes", json=fhir_bundle(),
                          params={"end_hours": 50})
    assert r.status_code == 200, r.text
    ras = risk_assessments(r.json())
    ref = (await client.post("/predict/phenotypes", json=json_stay(end_hours=50))).json()
    assert len(ras) == len(ref["results"]) == 25
    for ra, res in zip(ras, ref["results"], strict=True):
        assert ra.prediction[0].outcome.text == res["label"]
        assert float(ra.prediction[0].probabilityDecimal) == pytest.approx(
            res["risk"], abs=TOL)


async def test_malformed_resource_is_422_naming_the_fhir_path(
        client: httpx.AsyncClient) -> None:
    b = fhir_bundle()
    b["entry"][3]["resource"]["valueQuantity"]["value"] = "ninety"
    r = await client.post("/fhir/predict/mortality", json=b)
    assert r.status_code == 422
    [p] = r.json()["detail"]
    assert p["loc"] == ["body", "entry", 3, "resource", "valueQuantity", "value"]
    assert p["message"].startswith("Bundle.entry[3].resource.valueQuantity.value")
    b = fhir_bundle()
    del b["entry"][4]["resource"]["status"]
    r = await client.post("/fhir/predict/mortality", json=b)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "status"
    for bad, rule in (({"resourceType": "Patient"}, "fhir_resource_type"),
                      ({**fhir_bundle(), "type": "transaction"}, "fhir_bundle_type")):
        r = await client.post("/fhir/predict/mortality", json=bad)
        assert r.status_code == 422 and r.json()["detail"][0]["rule"] == rule


async def test_unmapped_codes_and_units_are_warnings_naming_the_resource(
        client: httpx.AsyncClient) -> None:
    b = fhir_bundle()
    extra = bundle([[Item(3.0, "2524-7", 2.1, "mmol/L")],  # lactate: not a channel
                    [Item(4.0, "8310-5", 310.0, "K")]],  # kelvin: not convertible here
                   admission=ADMISSION, patient="p1")["entry"][2:]
    for i, e in enumerate(extra):
        e["resource"]["id"] = f"extra-{i}"
    b["entry"] += extra
    r = await client.post("/fhir/predict/mortality", json=b)
    assert r.status_code == 200, r.text
    body = Bundle.model_validate(r.json())
    [oo] = [e.resource for e in body.entry
            if e.resource.get_resource_type() == "OperationOutcome"]
    by_code = {i.details.text: i.diagnostics for i in oo.issue}
    assert "Observation/extra-0" in by_code["unmapped_code"]
    assert "Observation/extra-1" in by_code["unit_not_convertible"]
    [ra] = risk_assessments(r.json())
    assert "Observation/extra-0" not in {x.reference for x in ra.basis}
    ref = (await client.post("/fhir/predict/mortality", json=fhir_bundle())).json()
    assert ra.prediction[0].probabilityDecimal == risk_assessments(ref)[0].prediction[
        0].probabilityDecimal


async def test_loinc_codes_resolve_among_the_scoring_models_variables(tmp_path: Path) -> None:
    """Lactate (LOINC 2524-7) is an observation for a full-PhysioNet model and a warning for a
    benchmark-17 one, through FHIR and CDS Hooks alike; each discovery prefetches its codes."""
    write_model(tmp_path, "mortality", "full", feature_set=FEATURE_SETS["physionet2012-full"])
    write_model(tmp_path, "mortality", "bench")
    b = fhir_bundle()
    lactate = bundle([[Item(3.0, "2524-7", 2.1, "mmol/L")]], admission=ADMISSION,
                     patient="p1")["entry"][2:]
    lactate[0]["resource"]["id"] = "lactate-0"
    b["entry"] += lactate
    for version, reads_lactate in (("full", True), ("bench", False)):
        write_index(tmp_path, [("mortality", version)])
        async with serve(Settings(model_dir=tmp_path, device="cpu")) as client:
            r = await client.post("/fhir/predict/mortality", json=b)
            assert r.status_code == 200, r.text
            [ra] = risk_assessments(r.json())
            assert ("Observation/lactate-0" in {x.reference for x in ra.basis}) is reads_lactate
            assert ("unmapped_code" in r.text) is not reads_lactate, version
            cds_risk = await client.post("/cds-services/scehr-mortality", json=cds_request(b))
            assert cds_risk.status_code == 200, cds_risk.text
            ext = cds_risk.json()["cards"][0]["extension"]["dev.scehr.result"]
            assert abs(ext["risk"] - float(ra.prediction[0].probabilityDecimal)) <= TOL
            [svc] = (await client.get("/cds-services")).json()["services"]
            assert ("2524-7" in svc["prefetch"]["observations"]) is reads_lactate


async def test_admission_time_from_encounter_or_parameter(client: httpx.AsyncClient) -> None:
    b = fhir_bundle(with_encounter=False)
    r = await client.post("/fhir/predict/mortality", json=b)
    assert r.status_code == 422 and r.json()["error"] == "admission_time_required"
    r = await client.post("/fhir/predict/mortality", json=b,
                          params={"admission_time": ADMISSION.isoformat()})
    assert r.status_code == 200, r.text
    with_enc = (await client.post("/fhir/predict/mortality", json=fhir_bundle())).json()
    assert risk_assessments(r.json())[0].prediction[0].probabilityDecimal == \
        risk_assessments(with_enc)[0].prediction[0].probabilityDecimal
    r = await client.post("/fhir/predict/mortality", json=b,
                          params={"admission_time": "2026-03-01T06:30:00"})
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "timezone_required"


async def test_payload_problems_point_back_to_the_fhir_element(
        client: httpx.AsyncClient) -> None:
    b = fhir_bundle()
    b["entry"][3]["resource"]["valueQuantity"]["value"] = 1000.0  # systolic BP over the bound
    r = await client.post("/fhir/predict/mortality?strict=true", json=b)
    assert r.status_code == 422
    [p] = r.json()["detail"]
    assert p["loc"] == ["body", "entry", 3, "resource"] and "systolic_bp" in p["message"]


def test_fhir_path() -> None:
    assert fhir_path(["entry", 3, "resource", "component", 0, "code"]) == \
        "entry[3].resource.component[0].code"


# ------------------------------------------------------------------ CDS Hooks


async def test_cds_discovery_and_cards_follow_the_spec(client: httpx.AsyncClient) -> None:
    r = await client.get("/cds-services")
    assert r.status_code == 200
    jsonschema.validate(r.json(), cds.DISCOVERY)
    ids = {s["id"] for s in r.json()["services"]}
    assert ids == {"scehr-mortality", "scehr-phenotypes"}
    req = cds_request(fhir_bundle())
    jsonschema.validate(req, cds.REQUEST)
    for sid in sorted(ids):
        r = await client.post(f"/cds-services/{sid}", json=req, params={})
        assert r.status_code == 200, r.text
        jsonschema.validate(r.json(), cds.RESPONSE)
        cards = r.json()["cards"]
        assert 1 <= len(cards) <= 5
        for c in cards:
            assert len(c["summary"]) < 140
            assert c["links"] == []  # no public base URL configured: no link to guess
            assert "Top contributing variables" in c["detail"]


def test_the_docs_give_the_discovery_prefetch_templates() -> None:
    """docs/interfaces.md writes each template of a model reading the ICU type and
    ventilation as discovery serves it (the Observation search by its start and end: its
    codes are the model's)."""
    from scehr.service.interop.cds_hooks import prefetch_templates

    doc = (Path(__file__).resolve().parents[2] / "docs" / "interfaces.md").read_text()
    templates = prefetch_templates(FEATURE_SETS["physionet2012-full"].variables)
    assert set(templates) == {"patient", "encounter", "observations", "location", "procedures"}
    observations = templates.pop("observations")
    start, end = "Observation?patient={{context.patientId}}&code=", "&_count=1000"
    assert observations.startswith(start) and observations.endswith(end)
    assert f"`{start}`" in doc and f"`{end}`" in doc
    for key, template in templates.items():
        assert f"`{template}`" in doc, key


async def test_cds_card_links_use_the_configured_address_not_the_host_header(
        make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(public_base_url="https://scehr.hospital.example/api/")
    async with serve(settings) as c:
        r = await c.post("/cds-services/scehr-mortality", json=cds_request(fhir_bundle()),
                         headers={"host": "evil.example.com"})
    assert r.status_code == 200, r.text
    for card in r.json()["cards"]:
        assert card["links"][0]["url"] == \
            "https://scehr.hospital.example/api/models/mortality/card"
        assert card["source"]["url"] == card["links"][0]["url"]
        assert "evil" not in json.dumps(card)


def test_public_base_url_must_be_an_http_address() -> None:
    with pytest.raises(ValidationError, match="public_base_url"):
        Settings(public_base_url="evil.example.com/x")


async def test_cds_indicator_follows_the_operating_points(client: httpx.AsyncClient) -> None:
    from scehr.service.interop.readout import level_of

    registry = client.app.state.registry  # type: ignore[attr-defined]
    manifest = registry.get("phenotypes").model.spec.manifest
    ref = (await client.post("/predict/phenotypes", json=json_stay())).json()
    from scehr.schemas.payloads import Prediction

    pred = Prediction.model_validate(ref)
    r = await client.post("/cds-services/scehr-phenotypes", json=cds_request(fhir_bundle()))
    for c in r.json()["cards"]:
        label = c["extension"]["dev.scehr.result"]["label"]
        [res] = [x for x in pred.results if x.label == label]
        assert c["indicator"] == level_of(res, manifest)
        assert (c["indicator"] != "info") == res.alert or len(r.json()["cards"]) == 1


async def test_cds_missing_prefetch_is_412_never_a_guess(client: httpx.AsyncClient) -> None:
    req = cds_request(fhir_bundle())
    for key in ("observations", "encounter", "patient"):
        bad = copy.deepcopy(req)
        del bad["prefetch"][key]
        r = await client.post("/cds-services/scehr-mortality", json=bad)
        assert r.status_code == 412, r.text
        [p] = r.json()["detail"]
        assert p["loc"] == ["body", "prefetch", key] and "does not query FHIR" in p["message"]
    bad = copy.deepcopy(req)
    bad["prefetch"]["encounter"] = None
    assert (await client.post("/cds-services/scehr-mortality", json=bad)).status_code == 412
    bad["prefetch"] = None
    assert (await client.post("/cds-services/scehr-mortality", json=bad)).status_code == 412
    none = copy.deepcopy(req)
    none["prefetch"]["observations"] = None  # the client has no Observations: no advice
    r = await client.post("/cds-services/scehr-mortality", json=none)
    assert r.status_code == 200 and r.json() == {"cards": []}
    other = {**req, "hook": "order-sign"}
    r = await client.post("/cds-services/scehr-mortality", json=other)
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "hook"
    r = await client.post("/cds-services/other", json=req)
    assert r.status_code == 404


async def test_model_card_is_served(client: httpx.AsyncClient) -> None:
    r = await client.get("/models/mortality/card")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/markdown")
    assert len(r.text) > 0
    assert (await client.get("/models/nope/card")).status_code == 404


# ------------------------------------------------------------------ Open Inference Protocol


async def test_oip_health_and_metadata(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    r = await client.get("/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}
    assert (await client.get("/v2")).json()["name"] == "scehr"
    md = (await client.get("/v2/models/mortality")).json()
    assert md["name"] == "mortality" and md["platform"] == "onnxruntime_onnx"
    names = {t["name"]: t for t in md["inputs"]}
    assert names["x"]["shape"][-1] == BENCHMARK_48H.n_features and "stay" in names
    version = md["versions"][0]
    assert (await client.get(f"/v2/models/mortality/versions/{version}")).status_code == 200
    assert (await client.get("/v2/models/mortality/ready")).status_code == 200
    r = await client.get("/v2/models/mortality/versions/nope/ready")
    assert r.status_code == 404 and "error" in r.json()
    r = await client.get("/v2/models/nope")
    assert r.status_code == 404 and "nope" in r.json()["error"]


async def test_oip_rejects_bad_tensors_with_the_protocol_error(
        client: httpx.AsyncClient) -> None:
    f = BENCHMARK_48H.n_features
    x = {"name": "x", "shape": [1, 48, f], "datatype": "FP32", "data": [0.0] * (48 * f)}
    lengths = {"name": "lengths", "shape": [1], "datatype": "INT64", "data": [48]}
    static = {"name": "static", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}
    ok = await client.post("/v2/models/mortality/infer", json={"inputs": [x, lengths, static]})
    assert ok.status_code == 200, ok.text
    cases = [
        ([{**x, "shape": [1, 48, f - 1]}, lengths, static], "elements for shape"),
        ([{**x, "shape": [1, 47, f], "data": [0.0] * (47 * f)}, lengths, static],
         "time steps"),
        ([{**x, "datatype": "FP64"}, lengths, static], "datatype FP64"),
        ([x, {**lengths, "data": [49]}, static], "'lengths'"),
        ([x], "inputs must be exactly"),
        ([{"name": "stay", "shape": [1], "datatype": "BYTES", "data": ["{\"wide\": 1}"]}],
         "stay"),
    ]
    for inputs, words in cases:
        r = await client.post("/v2/models/mortality/infer", json={"inputs": inputs})
        assert r.status_code == 400, r.text
        assert words in r.json()["error"]
    text = json.dumps({"inputs": [x, lengths, {**static, "data": [0.0, 0.0, 0.0, 12345.0]}]})
    r = await client.post("/v2/models/mortality/infer", content=text.replace("12345.0", "1e999"),
                          headers={"content-type": "application/json"})
    assert r.status_code == 400 and "finite" in r.json()["error"]
    r = await client.post("/v2/models/mortality/infer", json={"inputs": [
        {"name": "stay", "shape": [1], "datatype": "BYTES", "data": [json.dumps(json_stay())]}],
        "outputs": [{"name": "nope"}]})
    assert r.status_code == 400 and "unknown outputs" in r.json()["error"]


def test_a_triton_client_talks_to_the_running_server(
        make_settings: Callable[..., Settings]) -> None:
    """tritonclient over real HTTP (it sends no JSON content type, and its own health,
    metadata and infer calls): the server is started in a thread on a free port."""
    import threading
    import time

    import uvicorn

    from scehr.service.app import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(make_settings()), host="127.0.0.1",
                                           port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        c = triton.InferenceServerClient(f"127.0.0.1:{port}")
        for _ in range(500):
            if c.is_server_ready():
                break
            time.sleep(0.01)
        assert c.is_server_live() and c.is_model_ready("mortality")
        assert c.get_model_metadata("mortality")["name"] == "mortality"
        s = triton.InferInput("stay", [1], "BYTES")
        s.set_data_from_numpy(np.array([json.dumps(json_stay()).encode()], dtype=object),
                              binary_data=False)
        r = c.infer("mortality", [s], outputs=[
            triton.InferRequestedOutput("risk", binary_data=False),
            triton.InferRequestedOutput("prediction", binary_data=False)])
        pred = json.loads(r.as_numpy("prediction")[0])
        assert r.as_numpy("risk")[0, 0] == pytest.approx(
            pred["results"][0]["risk"], abs=TOL)
        with pytest.raises(triton_utils.InferenceServerException, match="unknown model"):
            c.infer("nope", [s])
        c.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def test_cds_context_must_name_the_prefetched_patient(client: httpx.AsyncClient) -> None:
    req = cds_request(fhir_bundle())
    req["context"]["patientId"] = "someone-else"
    r = await client.post("/cds-services/scehr-mortality", json=req)
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "patient_mismatch"
    del req["context"]["patientId"]
    r = await client.post("/cds-services/scehr-mortality", json=req)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
        "body", "context", "patientId"]


async def test_panels_components_and_resources_without_ids(client: httpx.AsyncClient) -> None:
    b = fhir_bundle()
    panel = bundle([[Item(2.0, "8480-6", 120.0, "mm[Hg]"), Item(2.0, "8462-4", 70.0, "mm[Hg]"),
                     Item(2.0, "99999-9", 1.0, "mm[Hg]")]],
                   admission=ADMISSION, patient="p1")["entry"][2]
    del panel["resource"]["id"]
    del panel["fullUrl"]
    b["entry"].append(panel)
    b["entry"].append({"resource": {"resourceType": "Condition", "id": "c1",
                                    "subject": {"reference": "Patient/p1"}}})
    r = await client.post("/fhir/predict/mortality", json=b)
    assert r.status_code == 200, r.text
    body = Bundle.model_validate(r.json())
    [oo] = [e.resource for e in body.entry
            if e.resource.get_resource_type() == "OperationOutcome"]
    texts = {i.details.text: i for i in oo.issue}
    assert "99999-9" in texts["unmapped_code"].diagnostics
    assert texts["unmapped_code"].expression == [
        f"Bundle.entry[{len(b['entry']) - 2}].resource.component[2].code"]
    assert "Condition" in texts["resource_ignored"].diagnostics
    [ra] = risk_assessments(r.json())
    assert ra.basis[-1].reference is None
    assert ra.basis[-1].display == f"Bundle.entry[{len(b['entry']) - 2}].resource"


async def test_fhir_and_cds_scores_are_counted_by_drift_monitoring(
        client: httpx.AsyncClient) -> None:
    """Every interface's scores reach the monitoring window, not only /predict's."""
    async def stays() -> int:
        r = await client.get("/models/mortality/monitoring")
        assert r.status_code == 200, r.text
        return r.json()["stays"]

    before = await stays()
    r = await client.post("/fhir/predict/mortality", json=fhir_bundle())
    assert r.status_code == 200, r.text
    assert await stays() == before + 1
    r = await client.post("/cds-services/scehr-mortality", json=cds_request(fhir_bundle()))
    assert r.status_code == 200, r.text
    assert await stays() == before + 2
