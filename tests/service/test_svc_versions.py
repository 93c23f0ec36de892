"""Several versions of a task served at once (SCEHR_VERSIONS), chosen per request on every
interface; a stay the chosen model cannot read gets a compact 422 naming a version that can."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scehr.service.settings import Settings, parse_versions
from tests.service.conftest import serve, stay
from tests.service.test_svc_interop import cds_request, fhir_bundle, json_stay

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"


def test_versions_setting_lists_several_versions_per_task() -> None:
    assert parse_versions("mortality=1.2.0,1.1.0,phenotypes=1.1.0") == {
        "mortality": ["1.2.0", "1.1.0"], "phenotypes": ["1.1.0"]}
    assert parse_versions("mortality=1.2.0,mortality=1.1.0") == {  # --version, repeated
        "mortality": ["1.2.0", "1.1.0"]}
    for bad, rule in (("1.1.0,mortality=1.2.0", "TASK=VERSION"),
                      ("mortality=1.2.0,1.2.0", "listed twice"), ("mortality=", "empty")):
        with pytest.raises(ValueError, match=rule):
            Settings(versions=bad)


async def test_each_interface_serves_the_version_a_request_names(
        make_settings: Callable[..., Settings]) -> None:
    # listed v2 first: requests without ?version= still get the index's default, v1
    async with serve(make_settings(versions="mortality=v2,v1")) as c:
        def version_of(r: Any) -> str:
            assert r.status_code == 200, r.text
            return r.json()["model"]["version"]

        for v in (None, "v1", "v2"):
            q = {} if v is None else {"version": v}
            want = v or "v1"
            assert version_of(await c.post("/predict/mortality", json=stay(), params=q)) == want
            r = await c.post("/predict/mortality/batch", json={"stays": [stay()]}, params=q)
            assert version_of(r) == want
            r = await c.post("/fhir/predict/mortality", json=fhir_bundle(), params=q)
            assert r.status_code == 200, r.text
            [ra] = [e["resource"] for e in r.json()["entry"]
                    if e["resource"]["resourceType"] == "RiskAssessment"]
            assert want in json.dumps(ra)
            r = await c.post("/cds-services/scehr-mortality", params=q,
                             json=cds_request(fhir_bundle()))
            assert r.status_code == 200, r.text
            assert r.json()["cards"][0]["extension"]["dev.scehr.result"]["version"] == want
            path = "/v2/models/mortality" + ("" if v is None else f"/versions/{v}")
            r = await c.post(f"{path}/infer", json={"inputs": [{
                "name": "stay", "shape": [1], "datatype": "BYTES",
                "data": [json.dumps(json_stay())]}]})
            assert r.status_code == 200 and r.json()["model_version"] == want, r.text
            r = await c.get("/models/mortality", params=q)
            assert r.json()["version"] == want
        # the two versions are different models: different risks for one stay
        risks = {v: (await c.post("/predict/mortality", json=stay(), params={"version": v})
                     ).json()["results"][0]["risk"] for v in ("v1", "v2")}
        assert risks["v1"] != risks["v2"]
        # a version not served: 404 naming the ones that are
        r = await c.post("/predict/mortality", json=stay(), params={"version": "v9"})
        assert r.status_code == 404 and r.json()["error"] == "version_not_served"
        assert r.json()["detail"][0]["allowed"] == "v1, v2"
        r = await c.post("/v2/models/mortality/versions/v9/infer", json={"inputs": []})
        # V2 says the version is not here, never which are (that is /models' to tell, and
        # closable)
        assert r.status_code == 404 and "'v9'" in r.json()["error"]
        assert "v1" not in r.json()["error"] and "v2" not in r.json()["error"]
        assert (await c.get("/v2/models/mortality")).json()["versions"] == ["v1", "v2"]
        listed = [(m["task"], m["version"]) for m in (await c.get("/models")).json()["models"]]
        assert listed == [("mortality", "v1"), ("mortality", "v2"), ("phenotypes", "v1")]
        # each version has its own monitor; the gauges (labelled by task) show the default's
        s1 = (await c.get("/models/mortality/monitoring")).json()
        s2 = (await c.get("/models/mortality/monitoring", params={"version": "v2"})).json()
        assert (s1["model_version"], s2["model_version"]) == ("v1", "v2")
        # 5 interfaces per loop (v1 twice: without ?version= and with it), + the risk check
        assert s2["stays"] == 6 and s1["stays"] == 11
        metrics = (await c.get("/metrics")).text
        assert 'scehr_monitor_window_stays{model="mortality"} 11.0' in metrics
        info = [ln for ln in metrics.splitlines() if ln.startswith("scehr_model_info{")
                and 'task="mortality"' in ln]
        assert len(info) == 2 and all(ln.endswith(" 1.0") for ln in info), info


async def test_a_pinned_version_is_the_default_when_the_index_default_is_not_listed(
        make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(versions="mortality=v2")) as c:
        r = await c.post("/predict/mortality", json=stay())
        assert r.json()["model"]["version"] == "v2"
        r = await c.post("/predict/mortality", json=stay(), params={"version": "v1"})
        assert r.status_code == 404 and r.json()["detail"][0]["allowed"] == "v2"


def _benchmark17_stay() -> dict[str, Any]:
    return json.loads((REPO / "examples" / "mortality_stay_benchmark17.json").read_text())


async def test_a_stay_the_chosen_version_cannot_read_gets_a_compact_422_naming_one_that_can(
        ) -> None:
    """MIMIC-shaped stays (the 17 benchmark channels) sent to the PhysioNet model 1.2.2 while
    1.1.1 is served too: one problem per distinct variable, the allowed names once, catalog
    variables "not read by this model", and a first problem naming 1.1.1."""
    body = _benchmark17_stay()
    settings = Settings(model_dir=MODELS, device="cpu", versions="mortality=1.2.2,1.1.1")
    async with serve(settings) as c:
        r = await c.post("/predict/mortality", json=body)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        hint, *per_variable = detail
        assert hint["rule"] == "served_version_reads_them" and hint["allowed"] == "1.1.1"
        assert "?version=1.1.1" in hint["message"]
        variables = [body["observations"][p["loc"][2]]["variable"] for p in per_variable
                     if p["loc"][:2] == ["body", "observations"]]
        assert len(variables) == len(set(variables)) == len(per_variable)
        assert {p["rule"] for p in per_variable} == {"variable_not_read"}
        assert all("not read by this model" in p["message"] for p in per_variable)
        assert [p["allowed"] is not None for p in per_variable].count(True) == 1
        assert len(r.content) < 8_000, len(r.content)
        ok = await c.post("/predict/mortality", json=body, params={"version": "1.1.1"})
        assert ok.status_code == 200 and ok.json()["model"]["version"] == "1.1.1"
        # the batch route compacts each stay's errors the same way
        r = await c.post("/predict/mortality/batch", json={"stays": [body, body]})
        items = r.json()["items"]
        assert [len(i["errors"]) for i in items] == [len(detail)] * 2


async def test_without_a_version_that_reads_them_there_is_no_hint() -> None:
    body = _benchmark17_stay()
    async with serve(Settings(model_dir=MODELS, device="cpu", tasks="mortality")) as c:
        r = await c.post("/predict/mortality", json=body)
        assert r.status_code == 422
        rules = {p["rule"] for p in r.json()["detail"]}
        assert rules == {"variable_not_read"}, rules


async def test_a_reload_makes_its_version_the_default_and_drops_the_previous_one(
        make_settings: Callable[..., Settings]) -> None:
    key = {"X-API-Key": "k"}
    async with serve(make_settings(versions="mortality=v1,v2", api_keys="k")) as c:
        r = await c.post("/admin/models/mortality/reload", json={"version": "v2"}, headers=key)
        assert r.status_code == 200 and r.json()["previous_version"] == "v1", r.text
        r = await c.post("/predict/mortality", json=stay(), headers=key)
        assert r.json()["model"]["version"] == "v2"
        r = await c.post("/predict/mortality", json=stay(), headers=key, params={"version": "v1"})
        assert r.status_code == 404 and r.json()["detail"][0]["allowed"] == "v2"
        info = [ln for ln in (await c.get("/metrics")).text.splitlines()
                if ln.startswith("scehr_model_info{") and 'task="mortality"' in ln]
        assert len(info) == 1 and 'version="v2"' in info[0], info


def test_offline_scoring_compacts_the_problems_the_same_way() -> None:
    from scehr.service.offline_scoring import score_chunk
    from scehr.service.registry import load_model

    settings = Settings(model_dir=MODELS, device="cpu")
    model = load_model(MODELS / "mortality" / "1.2.2", "mortality", settings)
    [problems] = score_chunk(model, [_benchmark17_stay()], model.max_batch_size,
                             settings.max_observations)
    assert isinstance(problems, list) and 1 < len(problems) < 20
    assert {p.rule for p in problems} == {"variable_not_read"}


async def test_a_legacy_version_is_served_only_when_asked_for() -> None:
    """mortality 1.1.0 (manifest contract 1.1) never abstains and serves no interval: a server
    asked for it refuses to start, naming 1.1.1 (its re-issue) and the setting, as does a load on
    reload or for `scehr score`; with SCEHR_ALLOW_LEGACY_MODELS it serves as it always did
    (one heart-rate value gets a risk: why it is legacy)."""
    from scehr.service.load_errors import ModelLoadError
    from scehr.service.registry import Registry, load_model

    pinned = Settings(model_dir=MODELS, device="cpu", versions="mortality=1.1.0")
    with pytest.raises(ModelLoadError, match=r"re-issue mortality 1\.1\.1") as e:
        Registry(pinned, None, None).preflight()  # type: ignore[arg-type]
    assert e.value.rule == "legacy_model"
    assert "SCEHR_ALLOW_LEGACY_MODELS=true" in str(e.value) and "no data minimum" in str(e.value)
    with pytest.raises(ModelLoadError, match="legacy"):
        load_model(MODELS / "phenotypes" / "1.1.2", "phenotypes", pinned)
    one = {"observations": [{"variable": "heart_rate", "time": 3.0, "value": 80}]}
    allowed = pinned.model_copy(update={"allow_legacy_models": True})
    async with serve(allowed) as c:
        r = (await c.post("/predict/mortality", json=one)).json()
    assert r["model"]["version"] == "1.1.0" and r["status"] == "scored"
    assert r["results"][0]["risk_interval"] is None
