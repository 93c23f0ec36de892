"""Scoring in the service's own JSON: one stay per task, or a batch where every stay succeeds
or fails on its own, and the risk at every hour of them (codecs:
`service/interfaces/json_single.py`, `json_batch.py`, `trajectory.py`)."""

from fastapi import APIRouter

from scehr.schemas.tasks import TASK_NAMES, landmark_task, task_spec
from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.interfaces.json_batch import JsonBatch
from scehr.service.interfaces.json_single import JsonSingle
from scehr.service.interfaces.trajectory import JsonTrajectory, JsonTrajectoryBatch

router = APIRouter(tags=["predict"])

for _task in TASK_NAMES:  # a landmark task's risk for the whole stay (its last hour) too
    add_scoring_route(router, JsonSingle(_task))
add_scoring_route(router, JsonBatch())
for _task in TASK_NAMES:  # the risk at every hour of an outcome a landmark task gives
    if not task_spec(_task).landmarks and landmark_task(_task) is not None:
        add_scoring_route(router, JsonTrajectory(_task))
add_scoring_route(router, JsonTrajectoryBatch())
