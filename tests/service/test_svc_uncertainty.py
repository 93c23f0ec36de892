"""The risk's uncertainty as served: the manifest's map read out per stay, said in words (a
wide interval is information), and a model without a map serving no interval, without error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scehr.schemas.payloads import ClassResult, RiskInterval
from scehr.schemas.uncertainty import RiskUncertainty
from scehr.service.interop.fhir_out import RISK_INTERVAL_URL
from scehr.service.interop.oip import INTERVAL_OUTPUTS
from scehr.service.interop.readout import uncertainty_words
from scehr.service.responses import risk_intervals
from scehr.service.settings import Settings
from tests.service.conftest import serve
from tests.service.fixture_model import UNCERTAINTY_CARD, write_index, write_model
from tests.service.test_svc_interop import cds_request, fhir_bundle, json_stay

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def v2_request() -> dict[str, Any]:
    """The JSON stay as an Open Inference `stay` tensor."""
    return {"inputs": [{"name": "stay", "shape": [1], "datatype": "BYTES",
                        "data": [json.dumps(json_stay())]}]}


def test_intervals_read_the_steps_and_the_outcome_set() -> None:
    u = RiskUncertainty.model_validate(UNCERTAINTY_CARD)
    got = risk_intervals(u, np.array([0.1, 0.2, 0.4, 0.65, 0.9]))
    assert [(g["low"], g["high"]) for g in got if g] == [
        (0.0, 0.1), (0.15, 0.2), (0.15, 0.4), (0.4, 0.7), (0.6, 0.95)]  # [cut, next cut)
    # 0.1 and 0.4 sit beside their pairs (0.0, 0.05) and (0.15, 0.2): served as the hull
    assert [g["wide"] for g in got if g] == [True, False, True, True, True]
    assert [g["outcomes"] for g in got if g] == [
        ["no_outcome"], ["no_outcome"], ["outcome", "no_outcome"], ["outcome"], ["outcome"]]
    assert risk_intervals(None, np.array([0.3, 0.7])) == [None, None]


def test_a_wide_interval_is_said_plainly() -> None:
    wide = RiskInterval(low=0.4, high=0.7, wide=True, level=0.9, outcomes=["outcome"])
    words = uncertainty_words(ClassResult.model_construct(risk_interval=wide))
    assert "between 40.0% and 70.0%" in words and "a wide interval" in words
    assert "typical of the outcome only" in words
    narrow = wide.model_copy(update={"high": 0.45, "wide": False,
                                     "outcomes": ["outcome", "no_outcome"]})
    words = uncertainty_words(ClassResult.model_construct(risk_interval=narrow))
    assert "wide" not in words and "either outcome" in words
    none = uncertainty_words(ClassResult.model_construct(risk_interval=None))
    assert none == "This model version serves no uncertainty interval."


async def test_a_model_without_an_uncertainty_map_serves_no_interval(tmp_path: Path) -> None:
    write_model(tmp_path, "mortality", "v1", seed=4)  # contract 1.4, but no map
    write_index(tmp_path, [("mortality", "v1")])
    async with serve(Settings(model_dir=tmp_path, device="cpu")) as c:
        info = (await c.get("/models/mortality")).json()
        assert info["uncertainty"] is False
        r = await c.post("/predict/mortality", json=json_stay())
        assert r.status_code == 200 and r.json()["results"][0]["risk_interval"] is None
        fhir = await c.post("/fhir/predict/mortality", json=fhir_bundle())
        assert fhir.status_code == 200
        ra = next(e["resource"] for e in fhir.json()["entry"]
              if e["resource"]["resourceType"] == "RiskAssessment")
        assert "extension" not in ra["prediction"][0] and RISK_INTERVAL_URL not in fhir.text
        cds = await c.post("/cds-services/scehr-mortality", json=cds_request(fhir_bundle()))
        [card] = cds.json()["cards"]
        assert "serves no uncertainty interval" in card["detail"]
        assert card["extension"]["dev.scehr.result"]["risk_interval"] is None
        v2 = await c.post("/v2/models/mortality/infer", json=v2_request())
        assert v2.status_code == 200 and not INTERVAL_OUTPUTS.keys() & {
            o["name"] for o in v2.json()["outputs"]}
        meta = (await c.get("/v2/models/mortality")).json()
        assert not INTERVAL_OUTPUTS.keys() & {o["name"] for o in meta["outputs"]}


async def test_a_model_with_a_map_says_so_and_serves_it(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, device="cpu")) as c:
        assert (await c.get("/models/mortality")).json()["uncertainty"] is True
        res = (await c.post("/predict/mortality", json=json_stay())).json()["results"][0]
        ri = res["risk_interval"]
        assert ri["low"] <= ri["high"] and ri["level"] == 0.9
        schema = (await c.get("/openapi.json")).json()["components"]["schemas"]
        assert "RiskInterval" in schema
        assert "risk_interval" in schema["ClassResult"]["properties"]
        v2 = await c.post("/v2/models/mortality/infer", json=v2_request())
        assert v2.status_code == 200, v2.text
        out = {o["name"]: o for o in v2.json()["outputs"]}
        assert (out["risk_low"]["data"], out["risk_high"]["data"], out["risk_wide"]["data"]) \
            == ([ri["low"]], [ri["high"]], [ri["wide"]])
        assert out["risk_low"]["datatype"] == "FP64" and out["risk_wide"]["shape"] == [1, 1]
        meta = {o["name"]: o for o in (await c.get("/v2/models/mortality")).json()["outputs"]}
        assert {k: meta[k]["datatype"] for k in INTERVAL_OUTPUTS} == INTERVAL_OUTPUTS
