"""Trust at the edges, on the shipped default models: a FHIR client can send the whole stay
(ICU type and ventilation coded) and gets the JSON stay's risk; a stay below the model's data
minimum gets an explicit abstention on every interface; a paged Bundle is refused; `basis`
lists only what the model read; the words speak of the risk and its named points.

The FHIR Bundles here are written by this file from raw PhysioNet 2012 set-c records, with
its own LOINC / UCUM / SNOMED CT / HSLOC tables (not the adapter's).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fhir.resources.R4B.bundle import Bundle

from scehr.schemas.model_index import read_index
from scehr.service.settings import Settings
from tests.conftest import SHARED_DATA, needs_shared_data
from tests.service.conftest import serve
from tests.service.test_svc_interop_shipped import raw_records

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
ADMISSION = datetime.fromisoformat("2026-06-15T00:00:00+00:00")
FHIR = {"content-type": "application/fhir+json"}
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
SNOMED = "http://snomed.info/sct"
HSLOC = "https://www.cdc.gov/nhsn/cdaportal/terminology/codesystem/hsloc.html"
#: PhysioNet ICUType -> HSLOC: coronary care, cardiac surgery recovery, medical, surgical
ICU_HSLOC = {1: "1028-0", 2: "1032-2", 3: "1027-2", 4: "1030-6"}
#: PhysioNet parameter -> (LOINC, UCUM unit; None: a score) as a hospital would send it
LOINC_OF: dict[str, tuple[str, str | None]] = {
    "HR": ("8867-4", "/min"), "RespRate": ("9279-1", "/min"), "Temp": ("8310-5", "Cel"),
    "SysABP": ("76215-3", "mm[Hg]"), "DiasABP": ("76213-8", "mm[Hg]"),
    "MAP": ("76214-6", "mm[Hg]"), "NISysABP": ("76534-7", "mm[Hg]"),
    "NIDiasABP": ("76535-4", "mm[Hg]"), "NIMAP": ("76536-2", "mm[Hg]"),
    "GCS": ("9269-2", None), "FiO2": ("3150-0", "1"), "Urine": ("9187-6", "mL"),
    "Weight": ("29463-7", "kg"), "Height": ("8302-2", "cm"), "pH": ("2744-1", "[pH]"),
    "PaCO2": ("2019-8", "mm[Hg]"), "PaO2": ("2703-7", "mm[Hg]"), "SaO2": ("2708-6", "%"),
    "HCO3": ("1963-8", "mmol/L"), "Lactate": ("2524-7", "mmol/L"),
    "Glucose": ("2345-7", "mg/dL"), "BUN": ("3094-0", "mg/dL"),
    "Creatinine": ("2160-0", "mg/dL"), "Na": ("2951-2", "mmol/L"), "K": ("2823-3", "mmol/L"),
    "Mg": ("19123-9", "mg/dL"), "HCT": ("4544-3", "%"), "WBC": ("6690-2", "10*3/uL"),
    "Platelets": ("777-3", "10*3/uL"), "Albumin": ("1751-7", "g/dL"),
    "Bilirubin": ("1975-2", "mg/dL"), "ALP": ("6768-6", "U/L"), "ALT": ("1742-6", "U/L"),
    "AST": ("1920-8", "U/L"), "Cholesterol": ("2093-3", "mg/dL"),
    "TroponinI": ("10839-9", "ng/mL"), "TroponinT": ("6598-7", "ng/mL"),
}
#: The same values in the JSON stay: PhysioNet's own units
JSON_UNIT = {"Temp": "Cel", "FiO2": "fraction", "Weight": "kg", "Height": "cm",
             "Glucose": "mg/dL", "WBC": "10*9/L", "Platelets": "10*9/L"}


def set_c(n: int) -> list[tuple[str, list[tuple[float, str, float]]]]:
    """The first n records of set c: (record id, rows of (hours, parameter, value)); set c's
    rows without a parameter name are no data."""
    return [(rid, [(h + mi / 60.0, name, v) for h, mi, name, v in rows if name])
            for rid, rows in raw_records(n, "c")]


def _at(hours: float) -> str:
    return (ADMISSION + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


def both_forms(rows: list[tuple[float, str, float]], coded: bool = True
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(JSON stay, FHIR Bundle) of one record; `coded=False` leaves out the ICU type and the
    ventilation, as a FHIR client could before they had a code."""
    desc = {name: v for h, name, v in rows if h == 0 and name in ("Age", "Gender", "ICUType")}
    obs: list[dict[str, Any]] = []
    res: list[dict[str, Any]] = [{"resourceType": "Patient", "id": "pn"}]
    age, sex = desc.get("Age", -1), {0.0: "female", 1.0: "male"}.get(desc.get("Gender", -1))
    if age >= 0:
        d = ADMISSION.date()
        res[0]["birthDate"] = d.replace(year=d.year - int(age)).isoformat()
    if sex:
        res[0]["gender"] = sex
    enc: dict[str, Any] = {"resourceType": "Encounter", "id": "icu", "status": "in-progress",
                           "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                                     "code": "IMP"},
                           "subject": {"reference": "Patient/pn"}, "period": {"start": _at(0)}}
    res.append(enc)
    icu = int(desc.get("ICUType", -1))
    if icu in ICU_HSLOC:
        obs.append({"variable": "ICUType", "time": 0.0, "value": str(icu)})
        if coded:
            res.append({"resourceType": "Location", "id": "unit", "type": [{"coding": [
                {"system": HSLOC, "code": ICU_HSLOC[icu]}]}]})
            enc["location"] = [{"location": {"reference": "Location/unit"}}]
    for i, (h, name, v) in enumerate(rows):
        if name in ("RecordID", "Age", "Gender", "ICUType") or (v == -1 and h == 0):
            continue
        if name == "MechVent":
            obs.append({"variable": "MechVent", "time": h, "value": v})
            if coded:
                res.append({"resourceType": "Procedure", "id": f"v{i}", "status": "completed",
                            "code": {"coding": [{"system": SNOMED, "code": "40617009"}]},
                            "subject": {"reference": "Patient/pn"}, "performedDateTime": _at(h)})
            continue
        code, ucum = LOINC_OF[name]
        obs.append({"variable": name, "time": h, "value": v,
                    **({"unit": JSON_UNIT[name]} if name in JSON_UNIT else {})})
        q = {"value": v, "system": UCUM, "code": ucum or "{score}", "unit": ucum or "{score}"}
        res.append({"resourceType": "Observation", "id": f"o{i}", "status": "final",
                    "code": {"coding": [{"system": LOINC, "code": code}]},
                    "subject": {"reference": "Patient/pn"}, "effectiveDateTime": _at(h),
                    "valueQuantity": q})
    stay = {"observations": obs,
            "demographics": {"age": age if age >= 0 else None, "sex": sex}}
    return stay, {"resourceType": "Bundle", "type": "collection",
                  "entry": [{"fullUrl": f"urn:x:{r['resourceType']}/{r['id']}", "resource": r}
                            for r in res]}


def risk_of(body: dict[str, Any]) -> float:
    [ra] = [e.resource for e in Bundle.model_validate(body).entry
            if e.resource.get_resource_type() == "RiskAssessment"]
    return float(ra.prediction[0].probabilityDecimal)


def default_settings() -> Settings:
    return Settings(model_dir=MODELS, device="cpu")


@needs_shared_data
async def test_fhir_with_icu_type_and_ventilation_coded_gets_the_full_json_risk() -> None:
    if not (SHARED_DATA / "physionet2012" / "set-c.tar.gz").is_file():
        pytest.skip("physionet2012/set-c.tar.gz is absent")
    q = {"allow_insufficient": "true"}  # compare every stay, above the minimum or not
    diffs, uncoded, sent = [], [], 0
    async with serve(default_settings()) as client:
        for _record, rows in set_c(30):
            stay, fhir = both_forms(rows)
            r = await client.post("/predict/mortality", json=stay, params=q)
            assert r.status_code == 200, r.text
            want = r.json()["results"][0]["risk"]
            f = await client.post("/fhir/predict/mortality", json=fhir, params=q, headers=FHIR)
            assert f.status_code == 200, f.text
            diffs.append(abs(risk_of(f.json()) - want))
            sent += any(n == "MechVent" for _, n, _ in rows)
            _, bare = both_forms(rows, coded=False)
            b = await client.post("/fhir/predict/mortality", json=bare, params=q, headers=FHIR)
            uncoded.append(abs(risk_of(b.json()) - want))
    print(f"FHIR vs JSON risk on 30 set-c stays: max |diff| {max(diffs):.2e}; without the "
          f"ICU type and ventilation: max {max(uncoded):.3f}, median {np.median(uncoded):.3f}")
    assert max(diffs) <= 1e-6
    assert sent > 0 and max(uncoded) > 1e-3  # the codes carry information the risk uses


def _paged(kind: str) -> dict[str, Any]:
    _stay, b = both_forms([(0.0, "HR", 80.0)])
    b["type"] = "searchset"
    if kind == "next":
        b["link"] = [{"relation": "next", "url": "https://ehr.example/fhir/Observation?page=2"}]
    else:
        b["total"] = 1136
    return b


@pytest.mark.parametrize("kind", ["next", "total"])
async def test_a_paged_or_truncated_bundle_is_refused_with_the_reason(kind: str) -> None:
    async with serve(default_settings()) as client:
        r = await client.post("/fhir/predict/mortality", json=_paged(kind), headers=FHIR)
        assert r.status_code == 422, r.text
        [p] = r.json()["detail"]
        assert p["rule"] == "bundle_incomplete"
        assert ("next" in p["message"]) if kind == "next" else ("1136" in p["message"])
        obs = _paged(kind)
        req = {"hook": "patient-view", "hookInstance": "x", "context": {"patientId": "pn"},
               "prefetch": {"patient": obs["entry"][0]["resource"],
                            "encounter": obs["entry"][1]["resource"], "observations": obs}}
        c = await client.post("/cds-services/scehr-mortality", json=req)
        assert c.status_code == 422 and "bundle_incomplete" in c.text


def _one_heart_rate() -> dict[str, Any]:
    return {"observations": [{"variable": "heart_rate", "time": 3.0, "value": 80}]}


async def _fhir_and_cds_abstain_on_one_heart_rate(client: httpx.AsyncClient, task: str) -> None:
    """A Bundle with one heart-rate value gets no RiskAssessment, and the same data as a CDS
    Hooks prefetch gets one info card."""
    _, fhir = both_forms([(0.0, "Age", 70.0), (3.0, "HR", 80.0)])
    f = await client.post(f"/fhir/predict/{task}", json=fhir, headers=FHIR)
    assert f.status_code == 200, f.text
    kinds = [e.resource.get_resource_type() for e in Bundle.model_validate(f.json()).entry]
    assert "RiskAssessment" not in kinds and "insufficient_data" in f.text
    req = {"hook": "patient-view", "hookInstance": "x", "context": {"patientId": "pn"},
           "prefetch": {"patient": fhir["entry"][0]["resource"],
                        "encounter": fhir["entry"][1]["resource"],
                        "observations": {"resourceType": "Bundle", "type": "searchset",
                                         "entry": fhir["entry"][2:]}}}
    c = await client.post(f"/cds-services/scehr-{task}", json=req)
    assert c.status_code == 200, c.text
    [card] = c.json()["cards"]
    assert card["indicator"] == "info" and card["summary"].startswith("Not enough data")


async def test_below_the_minimum_every_interface_abstains_naming_what_is_missing() -> None:
    async with serve(default_settings()) as client:
        client: httpx.AsyncClient
        r = await client.post("/predict/mortality", json=_one_heart_rate())
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "insufficient_data" and body["results"] == []
        s = body["sufficiency"]
        assert not s["meets_minimum"] and s["observations"] == 1
        assert any("1 observation(s) inside the window" in w for w in s["reasons"])
        late = {"observations": [{"variable": "heart_rate", "time": 70.0, "value": 80}]}
        r = (await client.post("/predict/mortality", json=late)).json()
        assert r["status"] == "insufficient_data" and r["sufficiency"]["observations"] == 0
        r = (await client.post("/predict/mortality", json=_one_heart_rate(),
                               params={"allow_insufficient": "true"})).json()
        assert r["status"] == "scored" and len(r["results"]) == 1
        assert "below_data_minimum" in [w["code"] for w in r["warnings"]]
        b = (await client.post("/predict/mortality/batch",
                               json={"stays": [_one_heart_rate()]})).json()
        assert b["items"][0]["prediction"]["status"] == "insufficient_data"
        await _fhir_and_cds_abstain_on_one_heart_rate(client, "mortality")
        metrics = (await client.get("/metrics")).text
        assert 'code="insufficient_data"' in metrics
        v2 = await client.post("/v2/models/mortality/infer", json={
            "inputs": [{"name": "stay", "shape": [1], "datatype": "BYTES",
                        "data": [json.dumps(_one_heart_rate())]}]})
        assert v2.status_code == 400 and "data minimum" in v2.text


def offered_benchmark17() -> str:
    """The benchmark-17 mortality version the README offers clients with MIMIC-shaped stays."""
    found = re.search(r"`\./scripts/serve --version mortality=([\w.]+)`",
                      (REPO / "README.md").read_text())
    assert found, "README.md offers the benchmark-17 model with ./scripts/serve --version"
    return found.group(1)


async def test_the_benchmark17_model_the_readme_offers_abstains_on_every_interface() -> None:
    """A MIMIC-shaped client is sent to the benchmark-17 model, not the default: it too answers
    one heart-rate value with `insufficient_data` on JSON, FHIR and CDS Hooks (1.1.0 gave it a
    risk), and scores its example stay with an interval."""
    version = offered_benchmark17()
    pinned = Settings(model_dir=MODELS, device="cpu", versions={"mortality": version})
    async with serve(pinned) as client:
        client: httpx.AsyncClient
        r = (await client.post("/predict/mortality", json=_one_heart_rate())).json()
        assert r["model"]["version"] == version
        assert r["status"] == "insufficient_data" and r["results"] == [], r
        assert any("1 observation(s) inside the window" in w
                   for w in r["sufficiency"]["reasons"])
        await _fhir_and_cds_abstain_on_one_heart_rate(client, "mortality")
        example = json.loads((REPO / "examples" / "mortality_stay_benchmark17.json").read_text())
        ok = (await client.post("/predict/mortality", json=example)).json()
    assert ok["status"] == "scored" and ok["results"][0]["risk_interval"] is not None


async def test_an_abstention_keeps_the_data_warnings_and_claims_no_normal_value() -> None:
    """No risk was computed, so no channel's normal value was used: no `channel_not_observed`
    notice on any interface; what is true of the data (a value clipped) stays."""
    stay, fhir = both_forms([(0.0, "Age", 70.0), (3.0, "HR", 370.0)])  # clipped to 350
    cds = {"hook": "patient-view", "hookInstance": "x", "context": {"patientId": "pn"},
           "prefetch": {"patient": fhir["entry"][0]["resource"],
                        "encounter": fhir["entry"][1]["resource"],
                        "observations": {"resourceType": "Bundle", "type": "searchset",
                                         "entry": fhir["entry"][2:]}}}
    async with serve(default_settings()) as client:
        client: httpx.AsyncClient
        one = (await client.post("/predict/mortality", json=stay)).json()
        batch = (await client.post("/predict/mortality/batch", json={"stays": [stay]})).json()
        f = await client.post("/fhir/predict/mortality", json=fhir, headers=FHIR)
        c = await client.post("/cds-services/scehr-mortality", json=cds)
    for pred in (one, batch["items"][0]["prediction"]):
        assert pred["status"] == "insufficient_data"
        codes = [w["code"] for w in pred["warnings"]]
        assert "value_clipped" in codes and "channel_not_observed" not in codes
    assert f.status_code == c.status_code == 200
    [outcome] = [e["resource"] for e in f.json()["entry"]
                 if e["resource"]["resourceType"] == "OperationOutcome"]
    texts = [i["details"]["text"] for i in outcome["issue"]]
    assert "insufficient_data" in texts and "value_clipped" in texts
    assert "channel_not_observed" not in texts
    for answer in (f.text, c.text):
        assert "normal value is used" not in answer


async def test_basis_lists_only_observations_the_model_read() -> None:
    rows = [(0.0, "ICUType", 3.0), *[(float(h), "HR", 80.0 + h) for h in range(48)]]
    rows += [(float(h), "Temp", 37.0) for h in range(0, 48, 2)]
    rows += [(5.0, "HR", 900.0), (60.0, "HR", 90.0)]  # implausible, after the window
    _, fhir = both_forms(rows)
    async with serve(default_settings()) as client:
        f = await client.post("/fhir/predict/mortality", json=fhir, headers=FHIR,
                              params={"allow_insufficient": "true"})
    assert f.status_code == 200, f.text
    [ra] = [e.resource for e in Bundle.model_validate(f.json()).entry
            if e.resource.get_resource_type() == "RiskAssessment"]
    basis = {b.reference for b in ra.basis}
    n = len(rows)
    assert f"Observation/o{n - 2}" not in basis and f"Observation/o{n - 1}" not in basis
    assert "Observation/o1" in basis and "Location/unit" in basis


def test_no_served_point_alerts_for_more_than_half_of_validation_stays() -> None:
    from scehr.schemas.manifest import load_manifest

    index = read_index(MODELS)
    for task, version in index.defaults.items():
        m = load_manifest(MODELS / index.entry(task, version).path / "manifest.json")
        for c in m.classes:
            for p in c.named_points:
                assert p.validation.alert_rate <= 0.5, (task, c.label, p.name)
                assert 1e-4 < p.threshold < 1 - 1e-4


async def test_words_speak_of_the_risk_and_its_named_points() -> None:
    stay = json.loads((REPO / "examples" / "phenotypes_stay.json").read_text())
    fhir = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    async with serve(default_settings()) as client:
        f = await client.post("/fhir/predict/phenotypes", json=fhir, headers=FHIR,
                              params={"end_hours": 48, "allow_insufficient": "true"})
        assert f.status_code == 200, f.text
        text = f.text
        assert "model score" not in text and "against the default operating point" not in text
        ras = [e.resource for e in Bundle.model_validate(f.json()).entry
               if e.resource.get_resource_type() == "RiskAssessment"]
        ami = [ra for ra in ras if ra.prediction[0].outcome.text ==
               "Acute myocardial infarction"]
        assert ami and "operating point" in ami[0].prediction[0].rationale
        r = (await client.post("/predict/phenotypes", json={**stay, "end_hours": 48},
                               params={"operating_point": "high_sensitivity"})).json()
        res = {c["label"]: c for c in r["results"]}
        op = res["Acute myocardial infarction"]["operating_point"]
        assert op["threshold"] is None and op["withheld"] == withheld_reason(
            "Acute myocardial infarction", "high_sensitivity")
        assert res["Acute myocardial infarction"]["alert"] is False


def withheld_reason(label: str, point: str) -> str:
    """Why the default phenotypes model withholds `point` for class `label` (its manifest)."""
    from scehr.schemas.manifest import load_manifest

    index = read_index(MODELS)
    m = load_manifest(MODELS / index.entry("phenotypes", index.defaults["phenotypes"]).path
                      / "manifest.json")
    [reason] = [w.reason for c in m.classes if c.label == label
                for w in c.withheld_points if w.name == point]
    return reason


async def test_a_withheld_default_point_falls_back_without_a_warning_per_request() -> None:
    """Phenotypes 1.1.1 and 1.1.2 withhold `balanced` for classes validation cannot support: at the
    model's default (a point per class) the class's point is shown in its result, not warned
    on every request; a client who asks for `balanced` by name gets no alert for those classes,
    with the reason."""
    stay = json.loads((Path(__file__).parents[2] / "examples" / "phenotypes_stay.json")
                      .read_text())
    async with serve(Settings(model_dir=Path(__file__).parents[2] / "models",
                              device="cpu", tasks=["phenotypes"])) as c:
        default = (await c.post("/predict/phenotypes", json=stay)).json()
        asked = (await c.post("/predict/phenotypes", json=stay,
                              params={"operating_point": "balanced"})).json()
    used = {r["operating_point"]["name"] for r in default["results"]}
    assert len(used) > 1  # some classes fell back from the default point
    assert "operating_point_unavailable" not in {w["code"] for w in default["warnings"]}
    held = [r for r in asked["results"] if r["operating_point"]["threshold"] is None]
    assert held and all(r["operating_point"]["withheld"] and r["alert"] is False for r in held)


async def test_a_phenotypes_stay_with_one_value_abstains_and_the_example_does_not() -> None:
    """The default phenotypes model declares its minimum too: one heart-rate value gets no
    risk on JSON, FHIR or CDS Hooks; the shipped example, above the minimum, is scored."""
    index = read_index(MODELS)
    from scehr.schemas.manifest import load_manifest

    m = load_manifest(MODELS / index.entry("phenotypes", index.defaults["phenotypes"]).path
                      / "manifest.json")
    assert m.data_minimum is not None and m.data_minimum.min_observations > 1
    stay = json.loads((REPO / "examples" / "phenotypes_stay.json").read_text())
    async with serve(default_settings()) as client:
        client: httpx.AsyncClient
        r = (await client.post("/predict/phenotypes", json=_one_heart_rate())).json()
        assert r["status"] == "insufficient_data" and r["results"] == []
        assert any("1 observation(s) inside the window" in w
                   for w in r["sufficiency"]["reasons"])
        ok = (await client.post("/predict/phenotypes", json=stay)).json()
        assert ok["status"] == "scored" and len(ok["results"]) == 25
        assert ok["sufficiency"]["meets_minimum"]
        await _fhir_and_cds_abstain_on_one_heart_rate(client, "phenotypes")
