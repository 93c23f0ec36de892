"""CDS Hooks 2.0 routes (`/cds-services`; the service's codec:
`service/interfaces/cds_hooks.py`) and the model card they link to."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from scehr.schemas.variables import CATALOG, Variable
from scehr.service.deps import RegistryDep, SettingsDep, handle_for
from scehr.service.errors import ApiError
from scehr.service.interfaces.cds_hooks import CdsHooks
from scehr.service.interfaces.endpoint import add_scoring_route
from scehr.service.interop.cds_hooks import CdsDiscovery, discovery
from scehr.service.registry import ModelNotReady, Registry

router = APIRouter(tags=["cds-hooks"])
#: The model card tells the served version, its checksums and metrics: served with /models
#: (closed by `SCEHR_OPEN_MODELS=false`, like them).
card_router = APIRouter(tags=["cds-hooks"])


@router.get("/cds-services", response_model=CdsDiscovery,
            summary="CDS Hooks discovery: one patient-view service per served task")
async def cds_discovery(registry: RegistryDep) -> CdsDiscovery:
    return discovery({t: _variables(registry, t) for t in sorted(registry.state)})


def _variables(registry: Registry, task: str) -> Sequence[Variable]:
    """The variables the task's model reads; the whole catalog while it is not ready (the
    prefetch then asks for more than it will use, and the unused codes are warnings)."""
    try:
        return registry.get(task).model.spec.fs.variables
    except (KeyError, ModelNotReady):
        return CATALOG


add_scoring_route(router, CdsHooks())


@card_router.get("/models/{task}/card", response_class=PlainTextResponse, name="model_card",
            responses={200: {"content": {"text/markdown": {}}},
                       404: {"content": {"application/json": {
                           "schema": {"$ref": "#/components/schemas/ErrorBody"}}}}},
            summary="The served model's card (Markdown)")
async def model_card(task: str, registry: RegistryDep, settings: SettingsDep) -> Response:
    handle = handle_for(registry, settings, task)
    path = handle.model.path / "MODEL_CARD.md"
    if not path.is_file():
        raise ApiError(404, "model_card_not_found",
                       message=f"the {task} model ships no MODEL_CARD.md")
    return Response(path.read_text(), media_type="text/markdown; charset=utf-8")
