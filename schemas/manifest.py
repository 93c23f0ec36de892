"""The model manifest: everything the server needs to serve an exported model, as data.

Both sides read it: training writes it at export, the service validates it at load and
refuses a manifest whose contract major version differs from its own. `manifest.schema.json`
beside this file is generated from these models (`python -m schemas.manifest`), and a test
checks it is current.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from schemas.contract import CONTRACT_VERSION
from schemas.tasks import TASK_NAMES

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class LossSpec(_M):
    name: Literal["bce", "cbce", "csce", "focal"] = Field(
        description="The classification loss; also fixes the probability read-out"
    )
    lam: float = Field(0.0, description="Weight of the supervised contrastive regularizer")
    temperature: float = 0.1
    params: dict[str, Any] = Field(default_factory=dict)


class EncoderSpec(_M):
    name: str
    hparams: dict[str, Any]
    out_dim: int
    uses_static: bool


class OnnxSpec(_M):
    file: str = "model.onnx"
    sha256: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    dynamic_length: bool
    parity_max_abs_error: dict[str, float] = Field(default_factory=dict)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Overflow-free logistic function (tanh form)."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def logit(p: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Log-odds, clipped so that p of exactly 0 or 1 stays finite."""
    q = np.clip(np.asarray(p, dtype=np.float64), eps, 1.0 - eps)
    return np.log(q) - np.log1p(-q)


class Calibration(_M):
    """Applied by the service on top of the model's probability, per class.

    `apply` is the one read-out: the service serves it and export scores candidates with it.
    """

    method: Literal["none", "temperature", "isotonic"]
    input: Literal["margin", "probability"] = Field(
        "probability", description="temperature: p = σ(margin / T); isotonic: interp(p, x, y)"
    )
    temperature: float | None = None
    x: list[float] | None = None
    y: list[float] | None = None
    fitted_on: str = Field("", description="Which data it was fitted on")
    ece_before: float | None = None
    ece_after: float | None = None

    def apply(self, p: np.ndarray, margin: np.ndarray) -> np.ndarray:
        """Calibrated probability from the model's probability `p` and margin uᵀz − vᵀz."""
        if self.method == "none":
            return p
        x = margin if self.input == "margin" else p
        if self.method == "temperature":
            m = x if self.input == "margin" else logit(x)
            return sigmoid(m / float(self.temperature or 1.0))
        return np.interp(x, np.asarray(self.x, dtype=np.float64),
                         np.asarray(self.y, dtype=np.float64))


class OperatingPoint(_M):
    threshold: float
    sensitivity: float
    ppv: float
    specificity: float
    alert_rate: float
    name: str = ""


class ClassCard(_M):
    """Per-class serving assets."""

    label: str
    calibration: Calibration
    operating_points: list[OperatingPoint] = Field(default_factory=list)
    default_threshold: float = 0.5
    prototypes: list[PrototypeSpec] = Field(default_factory=list)


class PrototypeSpec(_M):
    """A k-means centre of training embeddings of one outcome; never one patient."""

    label: int = Field(description="1 = outcome present, 0 = absent")
    centroid: list[float]
    count: int = Field(ge=20)
    outcome_rate: float


class Interval(_M):
    value: float | None
    low: float | None = None
    high: float | None = None


class SplitInfo(_M):
    n: int
    prevalence: list[float]


class Provenance(_M):
    dataset: str
    description: str = ""
    splits: dict[str, SplitInfo]
    source: str = ""


class Manifest(_M):
    """The versioned model manifest (contract version `CONTRACT_VERSION`)."""

    contract_version: str = CONTRACT_VERSION
    name: str
    version: str
    task: Literal[TASK_NAMES]  # type: ignore[valid-type]  # the task registry's names
    label_names: list[str]
    loss: LossSpec
    encoder: EncoderSpec
    feature_set: dict[str, Any] = Field(description="schemas.featureset.FeatureSet.to_dict()")
    normalizer: dict[str, Any] = Field(description="schemas.tensorize.Normalizer.to_dict()")
    static: dict[str, Any] | None = Field(
        None, description="schemas.tensorize.StaticImputer.to_dict(), when the encoder uses it"
    )
    coverage: dict[str, float] = Field(
        description="Per variable id: fraction of training stays where it was ever observed"
    )
    anchors: dict[str, list[list[float]]] = Field(description="u and v, each [C, D]")
    classes: list[ClassCard]
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="Test metrics with CIs: name -> Interval-like dict"
    )
    provenance: Provenance
    onnx: OnnxSpec
    created_at: str
    code_version: str
    notes: list[str] = Field(default_factory=list)


class ContractError(ValueError):
    """A manifest the server cannot serve (other contract major version, bad file)."""


def major(version: str) -> int:
    return int(version.split(".", 1)[0])


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest; refuse another contract major version clearly."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ContractError(f"cannot read manifest {path}: {e}") from e
    found = str(raw.get("contract_version", "missing"))
    try:
        same = major(found) == major(CONTRACT_VERSION)
    except ValueError:
        same = False
    if not same:
        raise ContractError(
            f"{path}: manifest contract version {found} is not served by this server "
            f"(contract {CONTRACT_VERSION}; the major version must match). Re-export the model "
            "with a matching scehr version."
        )
    return Manifest.model_validate(raw)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def json_schema() -> dict[str, Any]:
    schema = Manifest.model_json_schema()
    schema["$id"] = f"https://scehr.dev/schemas/manifest-{CONTRACT_VERSION}.json"
    return schema


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
