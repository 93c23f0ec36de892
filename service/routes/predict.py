"""Scoring in the service's own JSON: one stay per task, or a batch where every stay succeeds
or fails on its own (codecs: `service/interfaces/json_single.py`, `json_batch.py`)."""

from fastapi import APIRouter

from scehr.schemas.tasks import TASK_NAMES, task_spec
from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.interfaces.json_batch import JsonBatch
from scehr.service.interfaces.json_single import JsonSingle

router = APIRouter(tags=["predict"])

for _task in TASK_NAMES:
    if not task_spec(_task).landmarks:  # a landmark task is served as a trajectory instead
        add_scoring_route(router, JsonSingle(_task))
add_scoring_route(router, JsonBatch())
