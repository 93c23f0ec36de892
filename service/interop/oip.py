"""Open Inference Protocol (V2, KServe / Triton / MLServer) tensors <-> the service's rows.

Two ways in: the graph's own tensors (`x`, `lengths`, `static`, already normalized, as the
manifest's graph contract says), or `stay`, a BYTES tensor of raw stay payloads (JSON text),
which goes through the same validation and tensorization as `POST /predict/{task}`. Either
way the service's one scorer (`scehr.service.scorer`) runs and reads them, so `risk` is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import prod
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scehr.schemas.contract import INPUT_LENGTHS, INPUT_STATIC, INPUT_X
from scehr.schemas.payloads import Prediction, StayPayload
from scehr.service.batcher import ModelInputs, ModelOutputs
from scehr.service.interop.readout import alert_of, interval_of, risk_of
from scehr.service.model import ModelSpec

INPUT_STAY = "stay"
#: The risk's uncertainty as tensors, for a model that serves it (`RiskInterval`: the interval's
#: ends, and whether it is wide); its conformal outcome set, of varying length, is in
#: `prediction`.
INTERVAL_OUTPUTS = {"risk_low": "FP64", "risk_high": "FP64", "risk_wide": "BOOL"}
#: Longest dynamic input accepted (time steps): the benchmark's 240 h at 1 h steps.
MAX_STEPS = 240
DTYPES: dict[str, Any] = {"BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64,
                          "FP32": np.float32, "FP64": np.float64}

Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                   "INT64", "FP16", "FP32", "FP64", "BYTES"]


class OipError(ValueError):
    """A request the protocol answers with 400 and {"error": message}."""


class V2Error(BaseModel):
    """The protocol's error body: `{"error": message}` (400 bad request, 404 unknown model,
    503 not ready or overloaded)."""

    error: str


class TensorIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    shape: list[int] = Field(max_length=4)
    datatype: Datatype
    parameters: dict[str, Any] | None = None
    data: list[Any]


class OutputRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    """The protocol's $inference_request (JSON form)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, max_length=128)
    parameters: dict[str, Any] | None = None
    inputs: list[TensorIn] = Field(min_length=1, max_length=4)
    outputs: list[OutputRequest] | None = Field(default=None, max_length=8)


class TensorOut(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    data: list[Any]


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[TensorOut]


class TensorMeta(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]


def metadata(task: str, spec: ModelSpec, versions: list[str] | None = None) -> ModelMetadata:
    """The model's tensors; -1 marks a variable dimension. `versions`: every version served
    (default: this one's)."""
    n_cls = len(spec.assets.labels)
    steps = spec.fixed_t if spec.fixed_t is not None else -1
    inputs = [TensorMeta(name=INPUT_X, datatype="FP32", shape=[-1, steps, spec.fs.n_features]),
              TensorMeta(name=INPUT_LENGTHS, datatype="INT64", shape=[-1])]
    if spec.static is not None:
        inputs.append(TensorMeta(name=INPUT_STATIC, datatype="FP32",
                                 shape=[-1, spec.fs.n_static]))
    inputs.append(TensorMeta(name=INPUT_STAY, datatype="BYTES", shape=[-1]))
    outputs = [TensorMeta(name="z", datatype="FP32", shape=[-1, spec.manifest.encoder.out_dim]),
               TensorMeta(name="anchor_logits", datatype="FP32", shape=[-1, n_cls, 2]),
               TensorMeta(name="probability", datatype="FP32", shape=[-1, n_cls]),
               TensorMeta(name="risk", datatype="FP64", shape=[-1, n_cls]),
               TensorMeta(name="alert", datatype="BOOL", shape=[-1, n_cls]),
               TensorMeta(name="prediction", datatype="BYTES", shape=[-1])]
    if all(c.uncertainty is not None for c in spec.manifest.classes):  # served intervals
        outputs[4:4] = [TensorMeta(name=n, datatype=d, shape=[-1, n_cls])
                        for n, d in INTERVAL_OUTPUTS.items()]
    return ModelMetadata(name=task, versions=versions or [spec.manifest.version],
                         platform="onnxruntime_onnx", inputs=inputs, outputs=outputs)


#: The JSON value types each datatype takes: integers for integer tensors (1.5 is refused,
#: not truncated), numbers for float tensors, true/false for BOOL.
_KINDS: dict[str, tuple[type, ...]] = {"BOOL": (bool,), "INT32": (int,), "INT64": (int,),
                                       "FP32": (int, float), "FP64": (int, float)}
_KIND_WORDS = {"BOOL": "true or false", "INT32": "integers", "INT64": "integers",
               "FP32": "numbers", "FP64": "numbers"}


def _flat(data: list[Any], depth: int = 0) -> Iterator[Any]:
    """The elements of row-major data, flat or nested (at most 4 levels, the shape's limit)."""
    for v in data:
        if type(v) is list and depth < 3:
            yield from _flat(v, depth + 1)
        else:
            yield v


def _array(t: TensorIn, datatype: str, ndim: int) -> np.ndarray:
    if t.datatype != datatype and not (datatype == "INT64" and t.datatype == "INT32"):
        raise OipError(f"input {t.name!r}: datatype {t.datatype}, expected {datatype}")
    if len(t.shape) != ndim or any(d < 1 for d in t.shape):
        raise OipError(f"input {t.name!r}: shape {t.shape}, expected {ndim} positive dims")
    kinds = _KINDS[t.datatype]
    if not all(type(v) in kinds for v in _flat(t.data)):  # type(), not isinstance: bool is int
        raise OipError(f"input {t.name!r}: data must hold {t.datatype} numbers only "
                       f"({_KIND_WORDS[t.datatype]}; no booleans, strings or null), as on the "
                       "JSON route")
    try:
        a = np.asarray(t.data, dtype=DTYPES[t.datatype])
    except OverflowError:  # the message would quote the client's number: never echoed
        raise OipError(f"input {t.name!r}: a value is out of the {t.datatype} range") from None
    except (TypeError, ValueError):
        raise OipError(f"input {t.name!r}: data is not a list of {t.datatype} numbers") \
            from None
    if a.size != prod(t.shape):
        raise OipError(f"input {t.name!r}: {a.size} elements for shape {t.shape} "
                       f"({prod(t.shape)} expected)")
    a = a.reshape(t.shape)
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise OipError(f"input {t.name!r}: values must be finite")
    return a


def tensor_inputs(spec: ModelSpec, given: dict[str, TensorIn], max_rows: int) -> ModelInputs:
    """x / lengths / static, checked against the graph contract."""
    need = [INPUT_X, INPUT_LENGTHS] + ([INPUT_STATIC] if spec.static is not None else [])
    extra = sorted(set(given) - set(need))
    missing = [n for n in need if n not in given]
    if missing or extra:
        raise OipError(f"inputs must be exactly {need} (missing {missing}, unknown {extra})")
    x = _array(given[INPUT_X], "FP32", 3)
    n, t, f = x.shape
    if n > max_rows:
        raise OipError(f"input 'x': {n} rows; the limit is {max_rows}")
    if f != spec.fs.n_features:
        raise OipError(f"input 'x': {f} features, the model reads {spec.fs.n_features}")
    if (spec.fixed_t is not None and t != spec.fixed_t) or t > MAX_STEPS:
        allowed = spec.fixed_t if spec.fixed_t is not None else f"1 to {MAX_STEPS}"
        raise OipError(f"input 'x': {t} time steps, the model takes {allowed}")
    lengths = _array(given[INPUT_LENGTHS], "INT64", 1).astype(np.int64)
    if lengths.shape != (n,) or (lengths < 1).any() or (lengths > t).any():
        raise OipError(f"input 'lengths': shape [{n}] with values from 1 to {t} expected")
    static = None
    if spec.static is not None:
        static = _array(given[INPUT_STATIC], "FP32", 2)
        if static.shape != (n, spec.fs.n_static):
            raise OipError(f"input 'static': shape {list(static.shape)}, expected "
                           f"[{n}, {spec.fs.n_static}]")
    return ModelInputs(x, lengths, static)


def stays(t: TensorIn, max_rows: int) -> list[StayPayload]:
    """The BYTES `stay` tensor: one JSON stay payload per element."""
    if t.datatype != "BYTES" or len(t.shape) != 1 or t.shape[0] != len(t.data):
        raise OipError(f"input {INPUT_STAY!r}: BYTES of shape [N] with N JSON stay payloads "
                       "expected")
    if not 1 <= len(t.data) <= max_rows:
        raise OipError(f"input {INPUT_STAY!r}: 1 to {max_rows} stays")
    out = []
    for i, raw in enumerate(t.data):
        try:
            out.append(StayPayload.model_validate_json(raw) if isinstance(raw, str)
                       else StayPayload.model_validate(raw))
        except ValidationError as e:
            first = e.errors(include_input=False)[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise OipError(f"input {INPUT_STAY!r}[{i}]: {where or 'payload'}: "
                           f"{first.get('msg')}") from None
    return out


def _intervals(preds: list[Prediction]) -> dict[str, tuple[str, np.ndarray]]:
    """`INTERVAL_OUTPUTS` of the rows, when every risk has its interval (a model without an
    uncertainty map has none: the outputs are then absent, as in its metadata)."""
    rows = [[interval_of(r) for r in p.results] for p in preds]
    if not rows or any(ri is None for row in rows for ri in row):
        return {}
    return {"risk_low": ("FP64", np.asarray([[r.low for r in row] for row in rows])),
            "risk_high": ("FP64", np.asarray([[r.high for r in row] for row in rows])),
            "risk_wide": ("BOOL", np.asarray([[r.wide for r in row] for row in rows],
                                             dtype=np.bool_))}


def outputs(out: ModelOutputs, preds: list[Prediction], wanted: list[str] | None
            ) -> list[TensorOut]:
    """The requested outputs (all by default), row-major flattened."""
    n = len(preds)
    short = [(i, p) for i, p in enumerate(preds) if p.status == "insufficient_data"]
    if short:  # tensors are rectangular: no row may lack its risk, so say why and stop
        i, p = short[0]
        why = "; ".join(p.sufficiency.reasons) if p.sufficiency else ""
        raise OipError(f"{len(short)} stay(s) below the model's data minimum, e.g. row {i}: "
                       f"{why}. No risk is given for them (the JSON route answers status "
                       "insufficient_data per stay)")
    graph = {"z": out.z[:n], "anchor_logits": out.anchor_logits[:n],
             "probability": out.probability[:n]}
    risk = np.asarray([[risk_of(r) for r in p.results] for p in preds], dtype=np.float64)
    alert = np.asarray([[alert_of(r) for r in p.results] for p in preds], dtype=np.bool_)
    tensors: dict[str, tuple[str, np.ndarray | list[str]]] = {
        **{k: ("FP32", v.astype(np.float32)) for k, v in graph.items()},
        "risk": ("FP64", risk), **_intervals(preds), "alert": ("BOOL", alert),
        "prediction": ("BYTES", [p.model_dump_json() for p in preds]),
    }
    names = wanted or list(tensors)
    unknown = [w for w in names if w not in tensors]
    if unknown:
        raise OipError(f"unknown outputs {unknown}; this model has {list(tensors)}")
    res = []
    for name in names:
        dtype, v = tensors[name]
        if isinstance(v, list):
            res.append(TensorOut(name=name, shape=[len(v)], datatype=dtype, data=v))
        else:
            res.append(TensorOut(name=name, shape=list(v.shape), datatype=dtype,
                                 data=v.ravel().tolist()))
    return res

