"""scehr: supervised contrastive ICU risk scoring.

The installed namespace: `scehr.schemas` (the clinical contract), `scehr.training` (PyTorch
training and export) and `scehr.service` (the FastAPI + ONNX Runtime service) are the
repository's `schemas/`, `training/` and `service/` folders; `scehr.cli` is the `scehr`
command.
"""
