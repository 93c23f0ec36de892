"""JSON, one stay: `POST /predict/{task}` takes a `StayPayload` and answers its `Prediction`."""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from scehr.schemas.contract import RESPONSE_VERSION_HEADER
from scehr.schemas.payloads import Prediction, PredictionV1_1, StayPayload
from scehr.service.examples import mortality_response, response_examples, stay_examples
from scehr.service.interfaces.base import ERRORS, Call, Codec, Decoded, one_prediction
from scehr.service.interfaces.bodies import as_body_parameter
from scehr.service.interfaces.options import VERSION_HEADER
from scehr.service.query_route import QueryRoute
from scehr.service.scorer import ScoredStays

#: The task of the recorded response example (examples/*_response.json), when there is one.
_EXAMPLE_TASK = ((mortality_response() or {}).get("model") or {}).get("task")


def parse_stay(raw: bytes) -> StayPayload:
    """The stay from the request bytes. pydantic validates while it parses (one pass in Rust,
    no intermediate dict tree); a body it refuses goes through `json.loads` + validation
    instead, so every error answer is the one a FastAPI body parameter would give."""
    try:
        return StayPayload.model_validate_json(raw)
    except ValidationError:
        pass
    if not raw.strip():
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required"}])
    return as_body_parameter(StayPayload, raw, json.loads)


def _stay_body(task: str) -> dict[str, Any]:
    """The request body in OpenAPI (the endpoint reads the bytes itself); `StayPayload` is
    added to the components by `scehr.service.app.openapi_components`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/StayPayload"},
        "examples": stay_examples(task)}}}}


class JsonSingle(Codec):
    """One stay of one task (a route per task, so that its query takes `QueryRoute`'s fast
    path: no path parameter)."""

    versions = True

    def __init__(self, task: str) -> None:
        self.fixed_task = task
        self.path = f"/predict/{task}"
        self.name = f"predict_{task}"
        self.route = {
            "response_model": Prediction | PredictionV1_1,
            "responses": {**ERRORS, **(response_examples() if task == _EXAMPLE_TASK else {})},
            "summary": f"Score one stay ({task})", "operation_id": f"predict_{task}",
            "description": f"Score one ICU stay with the {task} model.",
            "openapi_extra": {**_stay_body(task), **VERSION_HEADER},
            "route_class_override": QueryRoute}

    def task(self, path: Any) -> str:
        return self.fixed_task

    def decode(self, call: Call) -> Decoded:
        return Decoded([parse_stay(call.raw)])

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> Response:
        """Serialized once (the route's response_model is for the schema only)."""
        pred, _ = one_prediction(scored)
        return Response(pred.model_dump_json(), media_type="application/json",
                        headers={RESPONSE_VERSION_HEADER: pred.response_version})
