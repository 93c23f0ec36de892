"""The endpoint factory: one scoring loop behind every interface.

For a codec (`scehr.service.interfaces.base.Codec`) it builds the route's endpoint, which does what
every scoring route does, in this order: the model handle; the options (one decoder,
`scehr.service.interfaces.options`); the body, read once (the load-shedding middleware has already
checked the API key and media type, admitted the request and read the bytes); the arrival
time its deadline starts from; `decode` where the offload rule says (`scehr.service.offload.heavy`,
applied again once the stays are counted); the scorer (prepare -> batcher with the deadline
-> read-outs -> monitoring -> audit line); `encode`; and, for a heavy request, the freeing of
its large lists in a worker thread.

App objects come from `request.app.state`, not FastAPI dependencies: each dependency is
solved like a route of its own on every request.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request

from scehr.schemas.contract import RESPONSE_VERSION
from scehr.service.auth import API_KEY_SECURITY
from scehr.service.interfaces.base import Call, Codec, Decoded
from scehr.service.interfaces.options import OPTIONS, response_version, score_options
from scehr.service.offload import heavy, in_worker, released
from scehr.service.scorer import ScoredStays, Scorer

Endpoint = Callable[..., Awaitable[Any]]


def _signature(codec: Codec) -> inspect.Signature:
    """What FastAPI reads off the endpoint: the request, the path's parameters, the codec's
    options and its own query parameters (their order is the OpenAPI document's)."""
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=Request)
    path = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
            for name in _path_names(codec.path)]
    query = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                               default=codec.defaults.get(name, default))
             for name, (annotation, default) in
             [*((n, OPTIONS[n]) for n in codec.options), *codec.params.items()]]
    return inspect.Signature([request, *path, *query])


def _path_names(template: str) -> list[str]:
    return [part[1:-1] for part in template.split("/") if part.startswith("{")]


async def _scored(scorer: Scorer, call: Call, decoded: Decoded, heavy: bool, since: float
                  ) -> ScoredStays | None:
    """The scorer's results for what the codec decoded (None: nothing to score)."""
    if decoded.tensors is not None:
        return await scorer.score_tensors(call.handle, decoded.tensors, call.options,
                                          heavy=heavy, since=since)
    if not decoded.score:
        return None
    return await scorer.score(call.handle, decoded.stays, call.options, heavy=heavy,
                              refused=decoded.refused, since=since)


def endpoint(codec: Codec) -> Endpoint:
    """The route's endpoint for `codec`."""
    # every option's value where the request gives none: the codec's default, else the
    # service's (a codec without an option always scores at its default)
    defaults = {name: codec.defaults.get(name, default) for name, (_, default) in
                OPTIONS.items()} | {name: default for name, (_, default) in codec.params.items()}
    own_errors = type(codec).refusal is not Codec.refusal

    async def score(request: Request, **params: Any) -> Any:
        state = request.app.state
        settings = state.settings
        answer = response_version(request) if codec.versions else RESPONSE_VERSION
        values = defaults | params
        task = codec.task(values)
        if task is None:
            raise codec.not_found(values)
        handle = codec.handle(state.registry, settings, task, values["version"])
        options = score_options(handle.model.spec, values, whole=codec.whole,
                                answer_version=answer, per_hour=codec.per_hour(task))
        raw = await request.body()
        since = time.perf_counter()
        work = heavy(options.explain, len(raw) * codec.byte_cost, settings.offload_bytes)
        call = Call(request, handle.model.task, handle, raw, options, values, settings)
        decoded = await in_worker(work, codec.decode, call)
        work = work or heavy(options.explain, 0, settings.offload_bytes, decoded.rows)
        scored = await _scored(state.scorer, call, decoded, work, since)
        response = await in_worker(work, codec.encode, call, decoded, scored)
        if work and decoded.heaps:
            await released(True, *decoded.heaps, [] if scored is None else scored.results)
        return response

    async def score_or_refuse(request: Request, **params: Any) -> Any:
        try:
            return await score(request, **params)
        except Exception as e:
            answer = codec.refusal(e)
            if answer is None:
                raise
            return answer

    run = score_or_refuse if own_errors else score
    run.__signature__ = _signature(codec)  # type: ignore[attr-defined]
    run.codec = codec  # type: ignore[attr-defined]
    return run


def add_scoring_route(router: APIRouter, codec: Codec) -> None:
    """Register `codec`'s scoring route on `router`: `POST codec.path`, needing the API key
    (checked by the load-shedding middleware, before the body is read, as on every route
    that declares it), load-shed by the task it scores."""
    route = dict(codec.route)
    extra = {**route.pop("openapi_extra", {}), **API_KEY_SECURITY}
    router.add_api_route(codec.path, endpoint(codec), methods=["POST"], name=codec.name,
                         openapi_extra=extra, **route)
