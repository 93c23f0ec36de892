"""The scoring outputs: risk first, named operating points, explanations, audit, old manifests."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from scehr.schemas.contract import RESPONSE_VERSION, RESPONSE_VERSION_HEADER, RISK_EPS
from scehr.schemas.manifest import Calibration
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def named_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Contract 1.1 fixtures: named points, margin percentiles, risk and value references."""
    root = tmp_path_factory.mktemp("named")
    write_model(root, "mortality", "n1", loss="cbce", seed=1, named=True)
    write_model(root, "phenotypes", "n1", loss="csce", seed=3, named=True)
    write_index(root, [("mortality", "n1"), ("phenotypes", "n1")])
    return root


@pytest.fixture
async def named(named_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(Settings(model_dir=named_dir, device="cpu")) as c:
        yield c


def test_risk_is_strictly_inside_0_1_whatever_the_map() -> None:
    p = np.array([0.0, 1e-9, 0.0155, 0.5, 1.0])
    iso = Calibration(method="isotonic", x=[0.0, 0.02, 0.9, 1.0], y=[0.0, 0.0, 1.0, 1.0])
    temp = Calibration(method="temperature", input="margin", temperature=0.01)
    none = Calibration(method="none")
    for cal, margin in ((iso, p), (temp, np.array([-50.0, -9, 0, 9, 50])), (none, p)):
        r = cal.apply(p, margin)
        assert (r > 0).all() and (r < 1).all()
        assert r.min() >= RISK_EPS and r.max() <= 1 - RISK_EPS
    assert iso.apply(np.array([0.0155]), np.zeros(1))[0] == RISK_EPS  # was exactly 0.0


async def test_response_leads_with_risk_and_is_versioned(named: httpx.AsyncClient) -> None:
    r = await named.post("/predict/mortality", json=stay(id="s1"))
    assert r.status_code == 200 and r.headers[RESPONSE_VERSION_HEADER] == RESPONSE_VERSION
    out = r.json()
    assert out["response_version"] == RESPONSE_VERSION
    [res] = out["results"]
    assert list(res)[:3] == ["label", "risk", "score"]
    assert 0 < res["risk"] < 1 and 0 < res["score"] < 1
    op = res["operating_point"]
    assert op == {"name": "high_sensitivity", "threshold": 0.2, "applies_to": "risk",
                  "source": "default", "withheld": None}
    assert res["alert"] == (res["risk"] >= 0.2)
    a = out["audit"]
    assert a["operating_point"] == "high_sensitivity" and a["model_version"] == "n1"
    assert len(a["feature_set_hash"]) == len(a["input_sha256"]) == 64
    assert a["feature_set_hash"] == out["model"]["feature_set_hash"]
    schema = (await named.get("/openapi.json")).json()["components"]["schemas"]
    assert schema["ClassResultV1_1"]["properties"]["probability"]["deprecated"] is True


@pytest.mark.parametrize(("params", "name", "threshold"), [
    ({"operating_point": "balanced"}, "balanced", 0.5),
    ({"operating_point": "high_ppv"}, "high_ppv", 0.8),
    ({"threshold": 0.05}, "custom", 0.05),
])
async def test_request_chooses_the_operating_point(named: httpx.AsyncClient,
                                                   params: dict[str, Any], name: str,
                                                   threshold: float) -> None:
    body = {"stays": [stay(hr=60 + 9 * k) for k in range(6)]}
    r = await named.post("/predict/phenotypes/batch", json=body, params=params)
    assert r.status_code == 200, r.text
    assert r.json()["response_version"] == RESPONSE_VERSION
    for item in r.json()["items"]:
        assert item["prediction"]["audit"]["operating_point"] == name
        for res in item["prediction"]["results"]:
            assert res["operating_point"]["name"] == name
            assert res["operating_point"]["threshold"] == threshold
            assert res["operating_point"]["source"] == "request"
            assert res["alert"] == (res["risk"] >= threshold)


@pytest.mark.parametrize(("params", "loc", "rule"), [
    ({"operating_point": "nope"}, ["query", "operating_point"], "unknown_operating_point"),
    ({"threshold": 1.5}, ["query", "threshold"], "less_than"),
    ({"threshold": "abc"}, ["query", "threshold"], "float_parsing"),
    ({"threshold": 0.3, "operating_point": "balanced"}, ["query", "operating_point"],
     "exclusive_parameters"),
])
async def test_bad_operating_point_is_a_422_naming_the_parameter(
        named: httpx.AsyncClient, params: dict[str, Any], loc: list[str], rule: str) -> None:
    r = await named.post("/predict/mortality", json=stay(), params=params)
    assert r.status_code == 422
    [p] = r.json()["detail"]
    assert p["loc"] == loc and p["rule"] == rule
    if rule == "unknown_operating_point":
        assert p["allowed"] == "high_sensitivity, balanced, high_ppv"


async def test_explanations_carry_percentiles_prototypes_and_top_contributions(
        named: httpx.AsyncClient) -> None:
    top = (await named.post("/predict/mortality?explain=top", json=stay())).json()["results"][0]
    mp = top["explanation"]["margin_percentile"]
    m = top["explanation"]["margin"]
    # fixture quantiles: without outcome linspace(-3, 1), with outcome linspace(-1, 3)
    assert mp["without_outcome"] == pytest.approx(np.interp(m, np.linspace(-3, 1, 99),
                                                            np.arange(1, 100)), abs=0.05)
    assert mp["with_outcome"] <= mp["without_outcome"] and "%" in mp["summary"]
    protos = top["prototypes"]
    assert len(protos) == 3 and [p["cosine"] for p in protos] == sorted(
        [p["cosine"] for p in protos], reverse=True)
    for p in protos:
        assert p["ci_low"] <= p["outcome_rate"] <= p["ci_high"] and p["count"] >= 20
        assert p["name"].startswith(f"outcome rate {p['outcome_rate']:.1%}")
    assert len(top["contributions"]) == 3 and top["contributions_total"] == 5
    full = (await named.post("/predict/mortality", json=stay(), params={"explain": "full"})
            ).json()["results"][0]
    assert len(full["contributions"]) == 5 and full["contributions"][:3] == top["contributions"]
    deltas = [abs(c["delta"]) for c in full["contributions"]]
    assert deltas == sorted(deltas, reverse=True)
    basic = (await named.post("/predict/mortality", json=stay(), params={"explain": "basic"})
             ).json()["results"][0]
    assert basic["contributions"] is None and basic["risk"] == top["risk"]


async def test_audit_hash_names_the_input_never_its_values(
        named: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    long = {"observations": [{"variable": "heart_rate", "time": 1.0, "value": 88.125},
                             {"variable": "heart_rate", "time": 5.0, "value": 101.375}]}
    wide = {"wide": {"hours": [1.0, 5.0], "columns": {"Heart Rate": [88.125, 101.375]}}}
    changed = {"observations": [{"variable": "heart_rate", "time": 1.0, "value": 88.125},
                                {"variable": "heart_rate", "time": 5.0, "value": 102.625}]}
    with caplog.at_level(logging.INFO, logger="scehr.audit"):
        a, b, c = [(await named.post("/predict/mortality", json=x)).json()["audit"]
                   for x in (long, wide, changed)]
    assert a["input_sha256"] == b["input_sha256"] != c["input_sha256"]
    lines = [r for r in caplog.records if r.name == "scehr.audit"]
    assert len(lines) == 3
    rec = lines[0].__dict__
    assert rec["input_sha256"] == a["input_sha256"] and rec["model_version"] == "n1"
    assert rec["feature_set_hash"] == a["feature_set_hash"]
    assert rec["operating_point"] == "high_sensitivity"
    text = " ".join(json.dumps({k: str(v) for k, v in r.__dict__.items()}) for r in lines)
    assert "88.125" not in text and "101.375" not in text and "102.625" not in text


async def test_contract_1_0_manifest_serves_its_one_point_sensibly(
        client: httpx.AsyncClient) -> None:
    """The standard fixtures have 1.0 assets only: one default threshold on the score."""
    info = (await client.get("/models/phenotypes")).json()
    assert info["operating_points"] == ["high_sensitivity"]
    out = (await client.post("/predict/phenotypes", json=stay())).json()
    by_method = {0: "score", 1: "risk", 2: "risk"}  # temperature on margin, isotonic, none
    for i, res in enumerate(out["results"]):
        op = res["operating_point"]
        assert op["applies_to"] == by_method[i % 3]
        value = res["score"] if op["applies_to"] == "score" else res["risk"]
        assert res["alert"] == (value >= op["threshold"])
        assert res["explanation"]["margin_percentile"] is None  # not faked
    iso = out["results"][1]["operating_point"]
    # the fixture's 0.5 on the score through its isotonic map (0.3 -> 0.2, 0.7 -> 0.8) is 0.5
    assert iso["threshold"] == pytest.approx(0.5)
    r = await client.post("/predict/phenotypes", json=stay(),
                          params={"operating_point": "balanced"})
    assert r.status_code == 422 and r.json()["detail"][0]["allowed"] == "high_sensitivity"


async def test_worsening_a_vital_raises_its_contribution_on_the_shipped_model() -> None:
    """Same stay, heart rate climbing to 150/min: its contribution to the risk grows and points
    up (the shipped mortality model, explain=full)."""
    hours = [float(h) for h in range(1, 48, 2)]

    def body(hr_end: float) -> dict[str, Any]:
        obs = []
        for k, t in enumerate(hours):
            hr = 85 + (hr_end - 85) * k / (len(hours) - 1)
            # blood pressures and saturation by LOINC code: every shipped feature set reads them
            obs += [{"variable": "8480-6", "time": t, "value": 125},
                    {"variable": "8462-4", "time": t, "value": 70},
                    {"variable": "8478-0", "time": t, "value": 85},
                    {"variable": "heart_rate", "time": t, "value": round(hr, 1)},
                    {"variable": "respiratory_rate", "time": t, "value": 16},
                    {"variable": "2708-6", "time": t, "value": 97}]
        obs.append({"variable": "gcs_total", "time": 1.0, "value": "15"})
        return {"observations": obs, "demographics": {"age": 60, "sex": "male"}}

    async with serve(Settings(model_dir=REPO / "models", device="cpu",
                              tasks=["mortality"])) as c:
        stable, shock = [(await c.post("/predict/mortality", json=body(end),
                                       # 7 variables: below the default's data
                                       # minimum, scored for this study of the model
                                       params={"explain": "full",
                                               "allow_insufficient": "true"})
                                ).json()["results"][0]
                         for end in (85.0, 150.0)]

    def hr(res: dict[str, Any]) -> dict[str, Any]:
        return next(x for x in res["contributions"] if x["variable"] == "heart_rate")
    assert shock["risk"] > stable["risk"] + 0.02
    assert hr(shock)["delta"] > hr(stable)["delta"] + 0.02
    assert hr(shock)["direction"] == "raises"


async def test_openapi_response_example_follows_the_contract(client: httpx.AsyncClient) -> None:
    from scehr.schemas.payloads import Prediction

    example = json.loads((REPO / "examples" / "mortality_response.json").read_text())
    Prediction.model_validate(example)
    assert example["response_version"] == RESPONSE_VERSION
    paths = (await client.get("/openapi.json")).json()["paths"]
    shown = paths["/predict/mortality"]["post"]["responses"]["200"]["content"][
        "application/json"]["example"]
    # FastAPI writes its OpenAPI document without null members (examples included)
    assert (shown["results"], shown["audit"]) == (_no_nulls(example["results"]),
                                                  _no_nulls(example["audit"]))
    batch = paths["/predict/{task}/batch"]["post"]["responses"]["200"]["content"][
        "application/json"]["example"]
    assert batch["items"][0]["prediction"]["results"] == _no_nulls(example["results"])


def _no_nulls(v: object) -> object:
    if isinstance(v, dict):
        return {k: _no_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_no_nulls(x) for x in v]
    return v


def test_feature_set_hash_is_the_recorded_content_hash_when_there_is_one() -> None:
    import hashlib

    from scehr.schemas.audit import feature_set_hash
    from scehr.schemas.featureset import BENCHMARK_48H

    d = BENCHMARK_48H.to_dict()
    canon = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    assert feature_set_hash(d) == hashlib.sha256(canon).hexdigest()
    assert feature_set_hash({**d, "sha256": "f" * 64}) == "f" * 64
    assert feature_set_hash({**d, "timestep": 2.0}) != feature_set_hash(d)
