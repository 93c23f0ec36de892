"""FHIR R4: `POST /fhir/predict/{task}` takes a Bundle and answers RiskAssessments (codec:
`service/interfaces/fhir.py`)."""

from fastapi import APIRouter

from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.interfaces.fhir import Fhir

router = APIRouter(tags=["fhir"])

add_scoring_route(router, Fhir())
