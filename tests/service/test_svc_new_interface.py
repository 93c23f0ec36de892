"""A new interface is one codec and one registration line: a toy CSV interface, defined here
and registered on the JSON router, scores a stay with the JSON route's risk and audit record,
and gets what every scoring route gets without a line of its own (the API key checked and
load shedding before the body is read, the options, the 422 of a refused stay)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from fastapi.responses import PlainTextResponse

from scehr.schemas.payloads import StayPayload
from scehr.service.interfaces.base import Call, Codec, Decoded, one_prediction
from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.routes import predict
from scehr.service.scorer import ScoredStays
from scehr.service.settings import Settings
from tests.service.conftest import serve, stay

pytestmark = pytest.mark.anyio
CSV = "text/csv"


class CsvObservations(Codec):
    """`POST /csv/predict/{task}`: a CSV of observations (variable,time,value,unit) in,
    `label,risk,alert` lines out."""

    path = "/csv/predict/{task}"
    name = "csv_predict"
    route: ClassVar[dict[str, Any]] = {"response_class": PlainTextResponse, "openapi_extra": {
        "requestBody": {"required": True, "content": {CSV: {"schema": {"type": "string"}}}}}}

    def decode(self, call: Call) -> Decoded:
        rows = csv.DictReader(io.StringIO(call.raw.decode()))
        return Decoded([StayPayload.model_validate({"observations": [
            {k: _number(v) if k in ("time", "value") else v for k, v in r.items() if v}
            for r in rows]})])

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Any:
        pred, _ = one_prediction(scored)
        return PlainTextResponse("".join(f"{r.label},{r.risk!r},{r.alert}\n"
                                         for r in pred.results))


def _number(cell: str) -> float | str:
    try:
        return float(cell)
    except ValueError:
        return cell


def as_csv(payload: dict[str, Any]) -> bytes:
    out = io.StringIO()
    w = csv.DictWriter(out, ["variable", "time", "value", "unit"], lineterminator="\n")
    w.writeheader()
    for o in payload["observations"]:
        w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in o.items()})
    return out.getvalue().encode()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The JSON router with the toy interface registered (as it is after the test)."""
    monkeypatch.setattr(predict.router, "routes", list(predict.router.routes))
    add_scoring_route(predict.router, CsvObservations())  # the one registration line
    yield


async def test_a_toy_interface_scores_as_the_json_route(
        toy: None, make_settings: Callable[..., Settings]) -> None:
    body = stay()
    async with serve(make_settings()) as c:
        for params in ({}, {"operating_point": "high_sensitivity"}):
            want = (await c.post("/predict/mortality", json=body, params=params)).json()
            got = await c.post("/csv/predict/mortality", content=as_csv(body),
                               headers={"content-type": CSV}, params=params)
            assert got.status_code == 200, got.text
            assert got.text == "".join(f"{r['label']},{r['risk']!r},{r['alert']}\n"
                                       for r in want["results"])
        unknown = await c.post("/csv/predict/mortality", content=as_csv(body),
                               headers={"content-type": CSV}, params={"operating_point": "x"})
        assert unknown.status_code == 422
        assert unknown.json()["detail"][0]["rule"] == "unknown_operating_point"
        bad = {"observations": [{"variable": "heart_rate", "time": 1.0, "value": "fast"}]}
        refused = await c.post("/csv/predict/mortality", content=as_csv(bad),
                               headers={"content-type": CSV})
        assert refused.status_code == 422 and refused.json()["error"] == "invalid_stay"
        assert refused.json()["detail"][0]["loc"][:3] == ["body", "observations", 0]
        metrics = (await c.get("/metrics")).text
    assert 'scehr_requests_total{endpoint="/csv/predict/{task}",model="mortality"' in metrics


async def test_a_toy_interface_is_keyed_and_load_shed_before_its_body(
        toy: None, make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(api_keys="k", max_queue_size=2)) as c:
        unkeyed = await c.post("/csv/predict/mortality", content=b"not read",
                               headers={"content-type": CSV})
        assert unkeyed.status_code == 401
        c.app.state.load_shedder.admitted["mortality"] = 2  # type: ignore[attr-defined]
        full = await c.post("/csv/predict/mortality", content=b"not read",
                            headers={"content-type": CSV, "x-api-key": "k"})
        assert full.status_code == 503 and full.json()["error"] == "overloaded"
        form = await c.post("/csv/predict/mortality", content=b"a=1",
                            headers={"content-type": "application/x-www-form-urlencoded",
                                     "x-api-key": "k"})
        assert form.status_code == 415
