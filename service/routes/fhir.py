"""FHIR R4: `POST /fhir/predict/{task}` takes a Bundle and answers RiskAssessments, and
`/fhir/predict/{task}/trajectory` one per hour (codecs: `service/interfaces/fhir.py`,
`trajectory.py`)."""

from fastapi import APIRouter

from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.interfaces.fhir import Fhir
from scehr.service.interfaces.trajectory import FhirTrajectory

router = APIRouter(tags=["fhir"])

add_scoring_route(router, Fhir())
add_scoring_route(router, FhirTrajectory())
