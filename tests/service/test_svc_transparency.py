"""GET /models/{task}/{version}/transparency/{document}: built from the served version's
manifest on the fly, equal to `scehr.schemas.transparency`'s text; problems for unknown names;
closed with the model routes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scehr.schemas.manifest import load_manifest
from scehr.schemas.transparency import DOCUMENTS, chai_card_errors, document_text
from scehr.service.settings import Settings
from tests.service.conftest import serve

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
DEFAULTS = json.loads((MODELS / "index.json").read_text())["defaults"]
#: a served version that is not the default: the route serves every served version
OLDER = "1.3.1"

pytestmark = pytest.mark.anyio


async def test_the_route_serves_each_document_of_every_served_version() -> None:
    settings = Settings(model_dir=MODELS, device="cpu", tasks=list(DEFAULTS),
                        versions={"mortality": [DEFAULTS["mortality"], OLDER]})
    async with serve(settings) as c:
        for task, version in (*DEFAULTS.items(), ("mortality", OLDER)):
            m = load_manifest(MODELS / task / version / "manifest.json")
            for name, (_, media, _) in DOCUMENTS.items():
                r = await c.get(f"/models/{task}/{version}/transparency/{name}")
                assert r.status_code == 200, (task, version, name, r.text[:300])
                assert r.headers["content-type"].startswith(media)
                assert r.text == document_text(name, m), (task, version, name)
            xml = (await c.get(f"/models/{task}/{version}/transparency/chai-model-card")).text
            assert chai_card_errors(xml) == []

        r = await c.get(f"/models/mortality/{DEFAULTS['mortality']}/transparency/model-facts")
        assert r.status_code == 404 and r.json()["error"] == "document_not_found"
        problem = r.json()["detail"][0]
        assert problem["loc"] == ["path", "document"] and problem["rule"] == "unknown_document"
        assert problem["allowed"] == "hti1, chai-model-card, tripod-ai, markdown"

        r = await c.get("/models/mortality/1.1.0/transparency/hti1")  # shipped, not served
        assert r.status_code == 404 and r.json()["error"] == "version_not_served"
        r = await c.get("/models/sepsis/1.0.0/transparency/hti1")
        assert r.status_code == 404 and r.json()["error"] == "model_not_found"
        r = await c.get("/models/mortality/..%2F1.0.0/transparency/hti1")
        assert r.status_code in (404, 422) and "Traceback" not in r.text


async def test_closed_models_close_the_transparency_documents(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, device="cpu", open_models=False)
    async with serve(settings) as c:
        assert (await c.get("/v2/models/mortality/ready")).status_code == 200
        r = await c.get("/models/mortality/1.0.0/transparency/hti1")
        assert r.status_code == 404 and r.json()["error"] != "document_not_found"
