"""CDS Hooks 2.0: `POST /cds-services/scehr-{task}` takes a patient-view request with its
prefetch and answers risk cards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from scehr.schemas.payloads import ErrorBody
from scehr.schemas.tasks import TASK_SPECS
from scehr.service.errors import ApiError
from scehr.service.examples import cds_examples
from scehr.service.interfaces.base import (
    ERRORS,
    Call,
    Codec,
    Decoded,
    one_prediction,
    one_trajectory,
)
from scehr.service.interfaces.bodies import as_body_parameter
from scehr.service.interfaces.fhir import FHIR_BYTE_COST
from scehr.service.interop.cds_hooks import (
    SERVICE_PREFIX,
    CdsRequest,
    CdsResponse,
    cards,
    model_card_url,
    read_prefetch,
    trend_card,
)
from scehr.service.interop.fhir_limits import FhirLimits, check_raw
from scehr.service.scorer import ScoredStays


def cds_request(raw: bytes, limits: FhirLimits) -> CdsRequest:
    """The request, its size limits checked before FHIR validation (`fhir_limits`)."""
    check_raw(raw, limits)
    return as_body_parameter(CdsRequest, raw)


class CdsHooks(Codec):
    """Cards by operating point (info / warning / critical), with the top contributing
    variables (occlusion) and a link to the model card. Its only option is the model version:
    a CDS Client sends no others, and cards always name the contributing variables
    (`explain=full`)."""

    path = "/cds-services/{service_id}"
    name = "cds_service"
    route: ClassVar[Mapping[str, Any]] = {
        "response_model": CdsResponse, "response_model_exclude_none": True,
        "responses": {**ERRORS, 412: {"model": ErrorBody, "description":
                      "A required prefetch key is missing or null (this service cannot "
                      "query a FHIR server)"}},
        "summary": "CDS Hooks patient-view: risk cards from the prefetched data",
        "description": "Cards by operating point (info / warning / critical), with the top "
        "contributing\nvariables (occlusion) and a link to the model card.",
        "openapi_extra": {"requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CdsRequest"},
                                 "examples": cds_examples()}}}}}
    options = ("version",)
    defaults: ClassVar[Mapping[str, Any]] = {"explain": "full"}
    byte_cost = FHIR_BYTE_COST  # the FHIR reader's (and explain=full is heavy anyway)

    def task(self, path: Any) -> str | None:
        service_id = path.get("service_id", "")
        return service_id.removeprefix(SERVICE_PREFIX) \
            if service_id.startswith(SERVICE_PREFIX) else None

    def per_hour(self, task: str) -> bool:
        """A landmark task's service answers the trend of its trajectory (`trend_card`)."""
        spec = TASK_SPECS.get(task)
        return spec is not None and spec.landmarks

    def not_found(self, path: Any) -> ApiError:
        return ApiError(404, "service_not_found",
                        message=f"no CDS service {path.get('service_id')!r}")

    def decode(self, call: Call) -> Decoded:
        body = cds_request(call.raw, FhirLimits(call.settings.max_observations))
        stay = read_prefetch(body, call.spec.fs.variables,
                             call.settings.fhir_validation == "full")
        if stay is None:  # the client has no Observations: no decision support to give
            return Decoded(score=False)
        return Decoded([stay.payload], context=stay)

    def encode(self, call: Call, decoded: Decoded, scored: ScoredStays | None) -> CdsResponse:
        stay = decoded.context
        if stay is None:
            return CdsResponse(cards=[])
        s = call.settings
        url = model_card_url(s.public_base_url if s.open_models else None, call.task)
        if call.options.trajectory:
            traj, _ = one_trajectory(scored, stay.locate)
            return CdsResponse(cards=[trend_card(traj, url, stay.issues)])
        pred, _ = one_prediction(scored, stay.locate)
        return cards(pred, call.spec.manifest, url, stay.issues)
