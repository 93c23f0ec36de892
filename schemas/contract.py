"""Versions pinned in one place: the model contract, the ONNX opset, task ids, the graph."""

from dataclasses import dataclass
from typing import Final

#: Major.minor of the model contract (manifest + ONNX inputs/outputs). The server refuses a
#: model whose manifest has another major version. 1.2 adds the `platt` calibration map
#: (intercept and slope on the logit): a 1.1 server cannot read a model that uses it. 1.3 adds
#: the model's data minimum, withheld operating points and warning/critical levels. 1.4 adds
#: each class's uncertainty map (`scehr.schemas.uncertainty`); a manifest without it still loads.
#: 1.5 adds landmark tasks: the optional `trajectory` section and the per-hour graph outputs
#: `anchor_logits_by_hour` and `probability_by_hour` (`LANDMARK_OUTPUTS`). 1.6 adds the optional
#: `explanation_screen` (`scehr.schemas.explanation_screen`): the channels `explain=top` occludes.
CONTRACT_VERSION: Final = "1.6"

#: Major.minor of the prediction response (`response_version` in every answer and the
#: `RESPONSE_VERSION_HEADER` header). 1.1 leads with `risk` (calibrated) and `score` (raw);
#: 1.2 drops the 1.0 aliases 1.1 still carried (`probability`, `calibrated_probability`,
#: `threshold`, `prototype`): a client could show the uncalibrated score by mistake.
RESPONSE_VERSION: Final = "1.2"
#: The version before, answered when a request asks for it in `RESPONSE_VERSION_HEADER`: for
#: this release only (it goes away in the next one).
PREVIOUS_RESPONSE_VERSION: Final = "1.1"
#: The versions a request may ask for, the default first.
RESPONSE_VERSIONS: Final = (RESPONSE_VERSION, PREVIOUS_RESPONSE_VERSION)
RESPONSE_VERSION_HEADER: Final = "X-Scehr-Response-Version"

#: Every served risk lies in [RISK_EPS, 1 - RISK_EPS]: no finite training sample supports a
#: risk of exactly 0 or 1 (applied once, by `scehr.schemas.manifest.Calibration.apply`).
RISK_EPS: Final = 1e-4

#: The ONNX opset every export targets: the highest the pinned ONNX Runtime (1.31) supports.
#: 26 is ORT 1.31's last official opset (it refuses 27+ as "under development"); torch 2.13's
#: torch.export-based exporter reaches it and passes parity for the LSTM and channel-wise GRU
#: encoders, while the TorchScript exporter stops at 20.
ONNX_OPSET: Final = 26

#: Absolute tolerance of the ONNX Runtime vs PyTorch parity check run at every export.
PARITY_ATOL: Final = 1e-5


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, numpy dtype and axes (symbolic names or sizes)."""

    name: str
    dtype: str
    axes: tuple[str, ...]


@dataclass(frozen=True)
class GraphContract:
    """The ONNX graph every export produces and the service runs, declared once.

    Axes: `batch` and `time` are dynamic (`time` is fixed at export for fixed-window tasks),
    `features`/`static_features`/`dim`/`classes` are fixed per model; `anchor_logits[..., 0]`
    is uᵀz, the positive anchor's logit, and `[..., 1]` vᵀz, the negative one's (the layout of
    training/heads.py and docs/method.md).
    """

    x: TensorSpec
    lengths: TensorSpec
    static: TensorSpec
    z: TensorSpec
    anchor_logits: TensorSpec
    probability: TensorSpec
    opset: int
    parity_atol: float

    def input_names(self, uses_static: bool) -> list[str]:
        """The graph's inputs, in feed order; `static` only for encoders that use it."""
        return [self.x.name, self.lengths.name] + ([self.static.name] if uses_static else [])

    @property
    def inputs(self) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        return (self.x, self.lengths, self.static)

    @property
    def outputs(self) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        return (self.z, self.anchor_logits, self.probability)

    @property
    def output_names(self) -> tuple[str, str, str]:
        return (self.z.name, self.anchor_logits.name, self.probability.name)


GRAPH: Final = GraphContract(
    x=TensorSpec("x", "float32", ("batch", "time", "features")),
    lengths=TensorSpec("lengths", "int64", ("batch",)),
    static=TensorSpec("static", "float32", ("batch", "static_features")),
    z=TensorSpec("z", "float32", ("batch", "dim")),
    anchor_logits=TensorSpec("anchor_logits", "float32", ("batch", "classes", "2")),
    probability=TensorSpec("probability", "float32", ("batch", "classes")),
    opset=ONNX_OPSET,
    parity_atol=PARITY_ATOL,
)

#: The extra outputs of a landmark task's graph (contract 1.5): step t (0-based) is the risk from
#: the data of hours [0, t+1); steps at or beyond a stay's length are undefined.
ANCHOR_LOGITS_BY_HOUR: Final = TensorSpec("anchor_logits_by_hour", "float32",
                                          ("batch", "time", "classes", "2"))
PROBABILITY_BY_HOUR: Final = TensorSpec("probability_by_hour", "float32",
                                        ("batch", "time", "classes"))
LANDMARK_OUTPUTS: Final = (ANCHOR_LOGITS_BY_HOUR, PROBABILITY_BY_HOUR)

#: The names alone, for call sites that only feed or fetch by name.
INPUT_X: Final = GRAPH.x.name
INPUT_LENGTHS: Final = GRAPH.lengths.name
INPUT_STATIC: Final = GRAPH.static.name
OUTPUT_Z: Final = GRAPH.z.name
OUTPUT_ANCHOR_LOGITS: Final = GRAPH.anchor_logits.name
OUTPUT_PROBABILITY: Final = GRAPH.probability.name
