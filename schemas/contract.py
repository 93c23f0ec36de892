"""Versions pinned in one place: the model contract, the ONNX opset and task ids."""

from typing import Final, Literal

#: Major.minor of the model contract (manifest + ONNX inputs/outputs). The server refuses a
#: model whose manifest has another major version.
CONTRACT_VERSION: Final = "1.1"

#: Major.minor of the prediction response (`response_version` in every answer and the
#: `RESPONSE_VERSION_HEADER` header). 1.1 leads with `risk` (calibrated) and `score` (raw);
#: the 1.0 names `probability` and `calibrated_probability` stay as deprecated aliases for
#: this minor version only.
RESPONSE_VERSION: Final = "1.1"
RESPONSE_VERSION_HEADER: Final = "X-Scehr-Response-Version"

#: Every served risk lies in [RISK_EPS, 1 - RISK_EPS]: no finite training sample supports a
#: risk of exactly 0 or 1 (applied once, by `schemas.manifest.Calibration.apply`).
RISK_EPS: Final = 1e-4

#: The ONNX opset every export targets: the highest the pinned ONNX Runtime (1.31) supports.
#: 26 is ORT 1.31's last official opset (it refuses 27+ as "under development"); torch 2.13's
#: torch.export-based exporter reaches it and passes parity for the LSTM and channel-wise GRU
#: encoders, while the TorchScript exporter stops at 20.
ONNX_OPSET: Final = 26

#: Absolute tolerance of the ONNX Runtime vs PyTorch parity check run at every export.
PARITY_ATOL: Final = 1e-5

Task = Literal["mortality", "phenotypes"]
TASKS: Final[tuple[str, ...]] = ("mortality", "phenotypes")

#: ONNX graph input and output names.
INPUT_X: Final = "x"
INPUT_LENGTHS: Final = "lengths"
INPUT_STATIC: Final = "static"
OUTPUT_Z: Final = "z"
OUTPUT_ANCHOR_LOGITS: Final = "anchor_logits"
OUTPUT_PROBABILITY: Final = "probability"
