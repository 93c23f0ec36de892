"""The GPU path: a batch-size policy and ORT runs through a reused I/O binding.

On the CUDA provider a run's cost is mostly fixed (kernel launches, one host->device copy per
input, one copy back per output), so the policy lets batches grow larger than on CPU
(`SCEHR_GPU_MAX_BATCH_SIZE`) and pads a batch's row count up to a power of two: a handful of
shapes recur, so cuDNN's algorithm choices and ORT's memory arena are reused instead of
re-planned per row count. Padding rows are zeros with length 1 and are cut off the outputs;
rows do not interact in the graph, so the real rows' outputs are those of an unpadded run.

`BoundRunner` stages the inputs in host buffers that it keeps between runs (page-locked
"pinned" memory when ONNX Runtime's CUDA device offers a host-accessible allocator, so the
copy to the GPU is one DMA; ordinary memory otherwise) and binds them by pointer, with the
outputs bound on the session's device. Not yet verified on a GPU (docs/benchmarks.md, "GPU path");
on CPU it is tested to give outputs identical to `session.run`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import numpy as np
import onnxruntime as ort

from scehr.schemas.contract import GRAPH
from scehr.service.batcher import ModelInputs, ModelOutputs
from scehr.service.runtime import CUDA

log = logging.getLogger("scehr.registry")


def max_batch_rows(provider: str, cpu_max: int, gpu_max: int) -> int:
    """Rows per ORT run on `provider`: `gpu_max` on CUDA, else the CPU setting."""
    return gpu_max if provider == CUDA else cpu_max


def padded_rows(rows: int, max_rows: int) -> int:
    """Rows a GPU run of `rows` is padded to: the next power of two, at most `max_rows`, never
    fewer than `rows`. (On CPU runs are not padded: padding rows would only cost compute.)"""
    if rows <= 1:
        return rows
    return max(rows, min(1 << (rows - 1).bit_length(), max_rows))


class _HostBuffer:
    """A growable host staging buffer; pinned when `allocate` returns device-accessible memory."""

    def __init__(self, allocate: Any) -> None:
        self._allocate = allocate
        self._keep: Any = None  # the OrtValue or array that owns the memory
        self.view = np.zeros(0, dtype=np.uint8)

    def fit(self, arr: np.ndarray) -> np.ndarray:
        """`arr` copied into the buffer (grown to the next power of two of bytes if short)."""
        if arr.nbytes > self.view.nbytes:
            self._keep, self.view = self._allocate(1 << max(arr.nbytes - 1, 1).bit_length())
        out = self.view[: arr.nbytes].view(arr.dtype).reshape(arr.shape)
        np.copyto(out, arr)
        return out


def _numpy_alloc(nbytes: int) -> tuple[Any, np.ndarray]:
    arr = np.empty(nbytes, dtype=np.uint8)
    return arr, arr


def pinned_allocator() -> Any | None:
    """An allocator of page-locked host memory from ORT's CUDA device, if ORT offers one."""
    try:
        devices = [d for d in ort.get_ep_devices() if d.ep_name == CUDA]
        info = devices[0].memory_info(ort.OrtDeviceMemoryType.HOST_ACCESSIBLE) if devices else None
    except (AttributeError, RuntimeError, IndexError):  # older ORT, or no CUDA plugin device
        info = None
    if info is None:
        return None

    def allocate(nbytes: int) -> tuple[Any, np.ndarray]:
        ov = ort.OrtValue.ortvalue_from_shape_and_type([nbytes], np.uint8, memory_info=info)
        view = np.ctypeslib.as_array(
            ctypes.cast(ov.data_ptr(), ctypes.POINTER(ctypes.c_uint8)), shape=(nbytes,))
        return ov, view

    return allocate


class BoundRunner:
    """Runs a session through one reused I/O binding with staged inputs (see module doc)."""

    def __init__(self, session: ort.InferenceSession, max_rows: int, *, gpu: bool,
                 pad: bool | None = None) -> None:
        """`gpu`: outputs bound on CUDA and inputs staged in pinned memory if ORT offers it;
        `pad` (default: `gpu`): pad row counts with `padded_rows`."""
        self.session = session
        self.max_rows = max_rows
        self.pad = gpu if pad is None else pad
        self.binding = session.io_binding()
        self.device = "cuda" if gpu else "cpu"
        allocate = pinned_allocator() if gpu else None
        self.pinned = allocate is not None
        if gpu and not self.pinned:
            log.warning("no pinned host memory from ONNX Runtime's CUDA device: staging "
                        "inputs in ordinary memory")
        self._buffers: dict[str, _HostBuffer] = {}
        self._allocate = allocate or _numpy_alloc
        self._lock = threading.Lock()  # one binding and one set of buffers: one run at a time

    def _feeds(self, inputs: ModelInputs, names: list[str]) -> dict[str, np.ndarray]:
        n = inputs.rows
        rows = padded_rows(n, self.max_rows) if self.pad else n
        x, lengths, static = inputs.x, inputs.lengths, inputs.static
        if rows > n:
            pad = rows - n
            x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), dtype=x.dtype)])
            lengths = np.concatenate([lengths, np.ones(pad, dtype=lengths.dtype)])
            if static is not None:
                static = np.concatenate([static, np.zeros((pad, *static.shape[1:]),
                                                          dtype=static.dtype)])
        feeds = {GRAPH.x.name: x, GRAPH.lengths.name: lengths}
        if GRAPH.static.name in names and static is not None:
            feeds[GRAPH.static.name] = static
        return feeds

    def run(self, inputs: ModelInputs, names: list[str],
            outputs: tuple[str, ...] = GRAPH.output_names) -> ModelOutputs:
        """One blocking run of the `outputs` (`ModelOutputs` order); cut to the input's rows."""
        with self._lock:
            return self._run(inputs, names, outputs)

    def _run(self, inputs: ModelInputs, names: list[str],
             outputs: tuple[str, ...]) -> ModelOutputs:
        b = self.binding
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        for name, arr in self._feeds(inputs, names).items():
            staged = self._buffers.setdefault(name, _HostBuffer(self._allocate)).fit(arr)
            b.bind_input(name, "cpu", 0, staged.dtype, list(staged.shape),
                         staged.ctypes.data)
        for name in outputs:
            b.bind_output(name, self.device)
        self.session.run_with_iobinding(b)
        return ModelOutputs(*(o[: inputs.rows] for o in b.copy_outputs_to_cpu()))
