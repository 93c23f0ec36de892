"""GET /models, /models/{task}, /livez, /readyz (503 while loading or failed), /openapi.json."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import jsonschema
import pytest

from scehr.service.registry import Registry
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay, wait_ready
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio


async def test_models_lists_provider_and_metrics(client: httpx.AsyncClient) -> None:
    body = (await client.get("/models")).json()
    tasks = {m["task"]: m for m in body["models"]}
    assert set(tasks) == {"mortality", "phenotypes"}
    m = tasks["mortality"]
    assert m["provider"] == "CPUExecutionProvider" and m["device"] == "cpu"
    assert m["metrics"]["auroc"]["value"] == 0.85 and m["loss"] == "cbce"
    assert m["neutralised_channels"] == ["capillary_refill_rate"]
    assert m["uses_static"] is True and m["dynamic_length"] is False
    assert {(a["task"], a["version"], a["default"]) for a in body["available"]} == {
        ("mortality", "v1", True), ("mortality", "v2", False), ("phenotypes", "v1", True)}
    one = (await client.get("/models/phenotypes")).json()
    assert one["label_names"][0] == "phenotype_00" and one["dynamic_length"] is True
    r = await client.get("/models/sepsis")
    assert r.status_code == 404 and r.json()["error"] == "model_not_found"


async def test_livez_and_readyz(client: httpx.AsyncClient) -> None:
    assert (await client.get("/livez")).json() == {"status": "ok", "models": {}}
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "models": {"mortality": "ready",
                                                       "phenotypes": "ready"},
                        "workers": "1/1 workers ready"}


async def test_readyz_503_until_loaded_and_predict_503_meanwhile(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real = Registry._load

    def slow_load(self: Registry, folder: Path, task: str):
        gate.wait(10)
        return real(self, folder, task)

    monkeypatch.setattr(Registry, "_load", slow_load)
    async with serve(make_settings(tasks="mortality"), wait=False) as c:
        assert (await c.get("/livez")).status_code == 200
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["models"] == {"mortality": "loading"}
        p = await c.post("/predict/mortality", json=stay())
        assert p.status_code == 503 and p.json()["error"] == "model_not_ready"
        assert "retry-after" in p.headers
        r = await c.get("/models/mortality")
        assert r.status_code == 503
        gate.set()
        await wait_ready(c)
        assert (await c.post("/predict/mortality", json=stay())).status_code == 200
        r = await c.post("/predict/phenotypes", json=stay())  # not configured here
        assert r.status_code == 404


async def test_model_failing_warmup_keeps_readyz_503(tmp_path: Path) -> None:
    write_model(tmp_path, "phenotypes", "v1", ignore_lengths=True)  # wrong for batch > 1
    write_index(tmp_path, [("phenotypes", "v1")])
    async with serve(Settings(model_dir=tmp_path, device="cpu"), wait=False) as c:
        for _ in range(200):
            body = (await c.get("/readyz")).json()
            if body["models"]["phenotypes"] != "loading":
                break
            await asyncio.sleep(0.01)
        assert body["status"] == "not_ready"
        assert body["models"]["phenotypes"].startswith("failed: a stay scored alone differs")


async def test_openapi_has_every_route_and_examples(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert {"/predict/mortality", "/predict/phenotypes", "/predict/{task}/batch", "/models",
            "/models/{task}", "/livez", "/readyz", "/metrics"} <= set(spec["paths"])
    op = spec["paths"]["/predict/mortality"]["post"]
    examples = op["requestBody"]["content"]["application/json"]["examples"]
    assert {"long", "wide"} <= set(examples)
    assert op["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ErrorBody")
    assert "/admin/models/{task}/reload" not in spec["paths"]  # no key configured
    assert "X-API-Key" in str(spec["components"]["securitySchemes"])


#: The shipped models, which the examples in examples/ are written for.
MODELS = Path(__file__).resolve().parents[2] / "models"
#: Path parameters for the request examples (each route's example is for the first task).
PARAMS = {"task": "mortality", "name": "mortality", "service_id": "scehr-mortality"}


async def test_openapi_shows_the_interop_bodies_typed_with_examples_that_score() -> None:
    """FHIR: a Bundle (resourceType, type, entries whose resources carry theirs), under FHIR's
    media type and plain JSON, with examples/fhir_bundle.json; CDS Hooks: the service call
    with examples/cds_hooks_request.json; V2 infer: a stay tensor. Every request example of
    the document is answered 200 by the shipped models, and every body route documents 415."""
    fhir_file, cds_file = MODELS.parent / "examples" / "fhir_bundle.json", \
        MODELS.parent / "examples" / "cds_hooks_request.json"
    async with serve(Settings(model_dir=MODELS, device="cpu")) as c:
        spec = (await c.get("/openapi.json")).json()
        fhir = spec["paths"]["/fhir/predict/{task}"]["post"]["requestBody"]["content"]
        assert set(fhir) == {"application/fhir+json", "application/json"}
        bundle = fhir["application/fhir+json"]["schema"]
        assert fhir["application/json"]["schema"] == bundle
        assert bundle["properties"]["resourceType"] == {"const": "Bundle"}
        assert {"resourceType", "type"} <= set(bundle["required"])
        assert set(bundle["properties"]["type"]["enum"]) == {"collection", "searchset"}
        entry = bundle["properties"]["entry"]
        assert entry["type"] == "array"
        resource = entry["items"]["properties"]["resource"]
        assert resource["type"] == "object" and resource["required"] == ["resourceType"]
        example = fhir["application/fhir+json"]["examples"]["stay"]["value"]
        assert example == json.loads(fhir_file.read_text())
        jsonschema.validate(example, bundle)
        for wrong in ({"resourceType": "Patient", "type": "collection"},
                      {"resourceType": "Bundle"},
                      {"resourceType": "Bundle", "type": "document"},
                      {"resourceType": "Bundle", "type": "collection", "entry": [
                          {"resource": {"id": "no-type"}}]}):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(wrong, bundle)
        cds = spec["paths"]["/cds-services/{service_id}"]["post"]["requestBody"]["content"]
        assert cds["application/json"]["examples"]["patient-view"]["value"] == json.loads(
            cds_file.read_text())
        v2 = spec["paths"]["/v2/models/{name}/infer"]["post"]["requestBody"]
        v2_example = v2["content"]["application/json"]["examples"]["stay"]["value"]
        jsonschema.validate(v2_example, v2["content"]["application/json"]["schema"])
        assert v2["x-content-type-optional"] is True
        params = {**PARAMS, "version": (await c.get("/v2/models/mortality")).json()[
            "versions"][0]}
        sent = 0
        for path, item in spec["paths"].items():
            body = item.get("post", {}).get("requestBody")
            if body is None:
                continue
            assert item["post"]["responses"]["415"]["content"]["application/json"][
                "schema"]["$ref"].endswith("/ErrorBody"), path
            for media_type, content in body["content"].items():
                for name, ex in content.get("examples", {}).items():
                    r = await c.post(path.format(**params), json=ex["value"],
                                     headers={"content-type": media_type})
                    assert r.status_code == 200, (path, name, r.text[:300])
                    sent += 1
        assert sent >= 8  # 2 x (long, wide), batch, FHIR, CDS Hooks, V2 (twice: 2 routes)
