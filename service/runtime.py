"""ONNX Runtime set-up: session options, execution providers and the check that CUDA started.

onnxruntime-gpu lists CUDA as available even when it cannot start (no GPU, missing CUDA/cuDNN
libraries) and then silently falls back to CPU, so the provider a session really got is checked
after creation. What was learnt about CUDA lives on an `OrtRuntime` object (one per registry),
not in a module global, so two apps in one process never share a stale answer.
"""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path
from typing import Any

import onnxruntime as ort

from scehr.service.load_errors import DeviceError

log = logging.getLogger("scehr.registry")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

#: A one-node ONNX graph (Identity, opset 13), serialized, so the probe needs no `onnx` package.
_PROBE_MODEL = base64.b64decode(
    "CAgSBXNjZWhyOjsKEAoBYRIBYiIISWRlbnRpdHkSBXByb2JlWg8KAWESCgoICAESBAoCCAFiDwoBYhIKCggIARIE"
    "CgIIAUIECgAQDQ==")


def session_options(threads: int) -> ort.SessionOptions:
    """Throughput without oversubscription: `threads` = cores // uvicorn workers, no spinning."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle ORT threads spinning would steal the cores the event loop parses requests on.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


#: Set by `scehr serve` for its workers once its start-up check found CUDA unusable under
#: device=auto (a process-internal variable, not a setting).
CUDA_UNUSABLE_ENV = "_SCEHR_CUDA_UNUSABLE"


class OrtRuntime:
    """Creates sessions on the provider `device` ("auto", "cuda" or "cpu") allows."""

    def __init__(self, device: str, threads: int) -> None:
        self.device = device
        self.threads = threads
        #: Whether CUDA really started (None: not tried yet); spares every later session under
        #: `auto` the failed attempt and its error log once CUDA is known not to work. A worker
        #: of `scehr serve` starts knowing what the parent's start-up check found (one warning
        #: per start, not one per process).
        self.cuda_works: bool | None = (
            False if device == "auto" and os.environ.get(CUDA_UNUSABLE_ENV) == "1" else None)

    def providers(self) -> list[Any]:
        if self.device == "cpu" or (self.device == "auto" and self.cuda_works is False):
            return [CPU]
        if CUDA not in ort.get_available_providers():
            if self.device == "cuda":
                raise DeviceError("device=cuda but this onnxruntime build has no CUDA provider "
                                  "(install onnxruntime-gpu), or use SCEHR_DEVICE=auto/cpu")
            return [CPU]
        return [(CUDA, {"cudnn_conv_algo_search": "HEURISTIC"}), CPU]

    def check_provider(self, provider: str) -> None:
        """Remember whether CUDA started; under device=cuda a CPU fallback is an error."""
        first = self.cuda_works is None
        if self.device != "cpu":
            self.cuda_works = provider == CUDA
        if self.device == "cuda" and provider != CUDA:
            raise DeviceError(
                "device=cuda but ONNX Runtime could not start its CUDA provider and fell back "
                f"to {provider} (onnxruntime-gpu lists CUDA as available even without a usable "
                "GPU or CUDA/cuDNN libraries; its own error is logged above). Fix the GPU "
                "setup, or set SCEHR_DEVICE=auto to run on CPU.")
        if (first and self.device == "auto" and provider != CUDA
                and CUDA in ort.get_available_providers()):
            log.warning("CUDA provider listed but not usable (no GPU, or CUDA/cuDNN libraries "
                        "missing): running on CPU; SCEHR_DEVICE=cpu skips the attempt, "
                        "SCEHR_DEVICE=cuda shows ONNX Runtime's own error",
                        extra={"provider": provider})

    def _create(self, model: str | bytes, threads: int) -> ort.InferenceSession:
        """A session on `providers()`. Under `auto` on a machine without a usable GPU,
        onnxruntime-gpu prints red "Failed to load library ... libcublasLt" errors while it
        tries CUDA; that attempt runs with ONNX Runtime's own log silenced, and
        `check_provider` says it in one warning instead. Under `cuda` its error stays: it
        explains the refusal to start."""
        providers = self.providers()
        quiet = self.device == "auto" and providers[0] != CPU
        if quiet:
            ort.set_default_logger_severity(4)  # fatal only, for this attempt
        try:
            sess = ort.InferenceSession(model, session_options(threads), providers=providers)
        finally:
            if quiet:
                ort.set_default_logger_severity(2)  # ONNX Runtime's default: warnings
        self.check_provider(sess.get_providers()[0])
        return sess

    def session(self, onnx_path: Path, threads: int | None = None) -> ort.InferenceSession:
        """A session with `threads` intra-op threads (default: this runtime's)."""
        return self._create(str(onnx_path), self.threads if threads is None else threads)

    def probe(self) -> str:
        """The provider a session really gets here; raises DeviceError at start."""
        return self._create(_PROBE_MODEL, 1).get_providers()[0]


def probe_device(device: str) -> str:
    """The provider a fresh runtime gets under `device` (raises DeviceError)."""
    return OrtRuntime(device, 1).probe()
