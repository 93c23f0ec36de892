"""Why a model cannot serve: one exception type with a rule name and the HTTP status of a reload."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model that cannot serve; `rule` names why, `status` is the HTTP answer on reload."""

    def __init__(self, message: str, rule: str = "model_invalid", status: int = 422) -> None:
        super().__init__(message)
        self.rule = rule
        self.status = status


class DeviceError(ModelLoadError):
    """The configured device cannot run sessions (a start-up failure, never a client error)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, rule="device_unavailable", status=500)
