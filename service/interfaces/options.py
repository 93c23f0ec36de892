"""The query options of the scoring routes, decoded in one place for every interface.

An interface (its codec) names the options it takes (`Codec.options`) and may change their
defaults (`Codec.defaults`): the same name always means the same thing, with the same
validation and the same 422 when it is wrong.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.exceptions import RequestValidationError

from scehr.schemas.contract import (
    PREVIOUS_RESPONSE_VERSION,
    RESPONSE_VERSION,
    RESPONSE_VERSION_HEADER,
    RESPONSE_VERSIONS,
)
from scehr.schemas.payloads import Problem
from scehr.service.deps import VersionParam
from scehr.service.errors import ApiError
from scehr.service.explain import DEFAULT_EXPLAIN, Explain
from scehr.service.model import ModelSpec
from scehr.service.operating import Choice
from scehr.service.scorer import ScoreOptions

_EXPLAIN = ("basic (the default): anchors, margin percentiles and nearest prototypes; top: "
            "also the 3 channels contributing most to the risk (occlusion: one more model row "
            "per observed channel; for a model with an explanation screen, only for the "
            "channels it ranks highest, with the warning contributions_screened); full: every "
            "channel's contribution by exact occlusion of every observed channel")
ExplainParam = Annotated[Explain, Query(description=_EXPLAIN)]
PointName = Annotated[str | None, Query(
    max_length=64, description="A named operating point of the model (GET /models/{task} "
    "lists them, e.g. high_sensitivity, balanced, high_ppv); default: the model's default")]
Threshold = Annotated[float | None, Query(
    gt=0, lt=1, description="Your own alert threshold on the risk, instead of a named point")]
Strict = Annotated[bool, Query(description="Reject values outside the cleaning ranges "
                                           "instead of dropping or clipping them")]
AllowInsufficient = Annotated[bool, Query(description="Research use: score a stay below the "
                                          "model's data minimum anyway (with a warning) "
                                          "instead of answering status insufficient_data")]

#: Every query option a scoring route may take: its annotation and the service's default, in
#: the order the routes declare them.
OPTIONS: dict[str, tuple[Any, Any]] = {
    "explain": (ExplainParam, DEFAULT_EXPLAIN),
    "operating_point": (PointName, None),
    "threshold": (Threshold, None),
    "strict": (Strict, False),
    "version": (VersionParam, None),
    "allow_insufficient": (AllowInsufficient, False),
}

#: The request header that asks for the previous response version (declared in OpenAPI; read
#: by `response_version`, so that the single-stay route keeps `QueryRoute`'s fast path).
VERSION_HEADER = {"parameters": [{
    "name": RESPONSE_VERSION_HEADER, "in": "header", "required": False,
    "schema": {"type": "string", "enum": list(RESPONSE_VERSIONS), "default": RESPONSE_VERSION},
    "description": f"The response version: {RESPONSE_VERSION} (the default) or "
    f"{PREVIOUS_RESPONSE_VERSION}, which adds the deprecated aliases `probability`, "
    "`calibrated_probability`, `threshold` and `prototype` to each result; "
    f"{PREVIOUS_RESPONSE_VERSION} is served in this release only"}]}


def response_version(request: Request) -> str:
    """The response version the request asks for in `RESPONSE_VERSION_HEADER` (the current
    one without it), refused as FastAPI refuses a header outside its allowed values."""
    asked = request.headers.get(RESPONSE_VERSION_HEADER)
    if asked is None or asked == RESPONSE_VERSION:
        return RESPONSE_VERSION
    if asked == PREVIOUS_RESPONSE_VERSION:
        return asked
    allowed = " or ".join(f"'{v}'" for v in RESPONSE_VERSIONS)
    raise RequestValidationError([{
        "type": "literal_error", "loc": ("header", RESPONSE_VERSION_HEADER),
        "msg": f"Input should be {allowed}: the response versions served "
        f"({PREVIOUS_RESPONSE_VERSION} for this release only)", "ctx": {"expected": allowed}}])


def choose_point(spec: ModelSpec, name: str | None, threshold: float | None,
                 allow_insufficient: bool = False) -> Choice:
    """The request's operating point (and whether it scores a stay below the model's data
    minimum anyway); 422 naming the query parameter when it is not valid."""
    if name is not None and threshold is not None:
        raise ApiError(422, "validation_error", [Problem(
            loc=["query", "operating_point"], rule="exclusive_parameters",
            message="give `operating_point` or `threshold`, not both",
            allowed="one of operating_point, threshold")])
    if name is not None and name not in spec.points.names:
        raise ApiError(422, "validation_error", [Problem(
            loc=["query", "operating_point"], rule="unknown_operating_point",
            message=f"{spec.task} model {spec.ref.version} has no operating point {name!r}",
            allowed=", ".join(spec.points.names))])
    choice = spec.points.choose(name, threshold)
    return replace(choice, allow_insufficient=True) if allow_insufficient else choice


def score_options(spec: ModelSpec, values: dict[str, Any], *, whole: bool,
                  answer_version: str = RESPONSE_VERSION, per_hour: bool = False
                  ) -> ScoreOptions:
    """The scorer's options from a request's option `values` (every name of `OPTIONS`, at
    its default where the request or its interface gives none); `per_hour`: answer each
    stay's trajectory."""
    return ScoreOptions(values["explain"], values["strict"], choose_point(
        spec, values["operating_point"], values["threshold"], values["allow_insufficient"]),
        all_or_none=whole, response_version=answer_version, trajectory=per_hour)
