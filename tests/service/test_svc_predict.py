"""POST /predict/{mortality,phenotypes}: probabilities, calibration, explanations, warnings."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from tests.service.conftest import stay

pytestmark = pytest.mark.anyio


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


async def post(client: httpx.AsyncClient, task: str, body: dict[str, Any],
               **params: Any) -> dict[str, Any]:
    r = await client.post(f"/predict/{task}", json=body, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def test_mortality_response_follows_the_contract(client: httpx.AsyncClient) -> None:
    body = stay(id="stay-7", demographics={"age": 70, "sex": "male"})
    out = await post(client, "mortality", body)
    assert out["id"] == "stay-7"
    m = out["model"]
    assert (m["task"], m["name"], m["version"], m["loss"]) == (
        "mortality", "fixture-mortality-cbce", "v1", "cbce")
    assert m["feature_set"] == "benchmark76-48h" and len(m["sha256"]) == 64
    [res] = out["results"]
    e = res["explanation"]
    su, sv = sig(e["positive_logit"]), sig(e["negative_logit"])
    assert res["score"] == pytest.approx(su / (su + sv), abs=1e-6)  # CBCE read-out
    assert e["margin"] == pytest.approx(e["positive_logit"] - e["negative_logit"])
    assert e["nearer_anchor"] == ("positive" if e["margin"] > 0 else "negative")
    assert -1 <= e["cosine_positive"] <= 1 and -1 <= e["cosine_negative"] <= 1
    # temperature calibration on the margin, T = 1.5 in the fixture manifest
    assert res["risk"] == pytest.approx(sig(e["margin"] / 1.5), abs=1e-9)
    # the 1.0 aliases are gone from the default response (1.2)
    assert not {"probability", "calibrated_probability", "threshold", "prototype"} & set(res)
    # a contract 1.0 point on a margin map stays on the score, and says so
    op = res["operating_point"]
    assert (op["name"], op["applies_to"], op["source"]) == ("high_sensitivity", "score",
                                                            "default")
    assert res["alert"] == (res["score"] >= op["threshold"])
    assert len(res["prototypes"]) == 3 and res["prototypes"][0]["count"] >= 20
    # the default explanation has no occlusion contributions (one model row per channel)
    assert res["contributions"] is None and res["contributions_total"] is None
    assert out["response_version"] == "1.2" and out["audit"]["model_version"] == "v1"
    top = (await client.post("/predict/mortality?explain=top", json=body)).json()["results"][0]
    assert len(top["contributions"]) == 3 and top["contributions_total"] == 5
    assert top["risk"] == res["risk"]


async def test_wide_form_scores_like_long_form(client: httpx.AsyncClient) -> None:
    long = {"observations": [
        {"variable": "heart_rate", "time": 1.0, "value": 88},
        {"variable": "heart_rate", "time": 5.0, "value": 101},
        {"variable": "temperature", "time": 1.0, "value": 38.1, "unit": "Cel"},
    ]}
    wide = {"wide": {"hours": [1.0, 5.0], "columns": {"Heart Rate": [88, 101],
                                                      "Temperature": [38.1, None]},
                     "units": {"Temperature": "Cel"}}}
    a, b = await post(client, "mortality", long), await post(client, "mortality", wide)
    assert a["results"][0]["score"] == b["results"][0]["score"]


async def test_phenotypes_csce_dynamic_length(client: httpx.AsyncClient) -> None:
    short = await post(client, "phenotypes", stay(hours=(1.0, 5.0)))
    long = await post(client, "phenotypes", stay(hours=(1.0, 50.0, 120.0)))
    for out in (short, long):
        assert out["model"]["loss"] == "csce" and len(out["results"]) == 25
        for r in out["results"]:
            e = r["explanation"]
            p = 1.0 / (1.0 + math.exp(e["negative_logit"] - e["positive_logit"]))
            assert r["score"] == pytest.approx(p, abs=1e-6)  # 2-way softmax
    methods = [r["risk"] == r["score"] for r in short["results"]]
    assert methods[2] and not all(methods)  # class 2 is 'none', others are calibrated


async def test_explain_full_occlusion(client: httpx.AsyncClient) -> None:
    body = stay()
    out = await post(client, "mortality", body, explain="full")
    [res] = out["results"]
    contrib = res["contributions"]
    assert {c["variable"] for c in contrib} == {"heart_rate", "systolic_bp", "temperature",
                                                 "gcs_total", "glucose"}
    deltas = [abs(c["delta"]) for c in contrib]
    assert deltas == sorted(deltas, reverse=True)
    # delta = risk(stay) - risk(stay with that channel not observed); the same on the score
    top = contrib[0]
    without = {**body, "observations": [o for o in body["observations"]
                                        if o["variable"] != top["variable"]]}
    other = (await post(client, "mortality", without))["results"][0]
    assert top["delta"] == pytest.approx(res["risk"] - other["risk"], abs=1e-6)
    assert top["delta_score"] == pytest.approx(res["score"] - other["score"], abs=1e-6)
    assert top["direction"] == ("raises" if top["delta"] > 0 else "lowers")


async def test_warnings_name_rules_not_values(client: httpx.AsyncClient) -> None:
    body = {"observations": [
        {"variable": "heart_rate", "time": 1.0, "value": 370},  # clipped to 350
        {"variable": "heart_rate", "time": 2.0, "value": 395},  # dropped (> 390)
        {"variable": "capillary_refill_rate", "time": 2.0, "value": "1.0"},  # unseen in training
        {"variable": "temperature", "time": 3.0, "value": 37.2, "unit": "Cel"},
    ]}
    out = await post(client, "mortality", body)
    codes = {w["code"] for w in out["warnings"]}
    assert {"value_clipped", "value_dropped", "channel_not_seen_in_training",
            "channel_not_observed", "stay_shorter_than_window"} <= codes
    clipped = next(w for w in out["warnings"] if w["code"] == "value_clipped")
    assert clipped["loc"] == ["observations", 0] and clipped["variable"] == "heart_rate"
    assert "370" not in str(out["warnings"])


async def test_unseen_channel_is_neutralised(client: httpx.AsyncClient) -> None:
    base = stay()
    with_crr = {**base, "observations": [
        *base["observations"], {"variable": "capillary_refill_rate", "time": 3.0, "value": 1}]}
    a, b = await post(client, "mortality", base), await post(client, "mortality", with_crr)
    assert a["results"][0]["score"] == b["results"][0]["score"]


async def test_strict_turns_cleaning_into_errors(client: httpx.AsyncClient) -> None:
    body = {"observations": [{"variable": "heart_rate", "time": 1.0, "value": 370}]}
    r = await client.post("/predict/mortality", json=body, params={"strict": "true"})
    assert r.status_code == 422
    [p] = r.json()["detail"]
    assert p["loc"] == ["body", "observations", 0] and p["rule"] == "out_of_range_clipped"
    assert p["allowed"] == "0 to 350"


async def test_static_inputs_change_the_score(client: httpx.AsyncClient) -> None:
    young = await post(client, "mortality", stay(demographics={"age": 20, "sex": "female"}))
    old = await post(client, "mortality", stay(demographics={"age": 95, "sex": "male"}))
    assert young["results"][0]["score"] != old["results"][0]["score"]
