"""Model lifecycle: load (off the event loop), serve, and swap a task's model on reload.

A model is loaded in full before it can serve (`load_model`: a session from `runtime`, then every
check of `validation`, ending in a warm-up). Only then is it swapped in; a request holds the handle
it started with, so it finishes on that model. The jobs around it live apart:
`scehr.service.runtime` (ONNX Runtime set-up), `scehr.service.validation` (checks and start-up
preflight), `scehr.service.model_store` (index and folders).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

import numpy as np
import onnxruntime as ort

from scehr.schemas.contract import GRAPH
from scehr.schemas.model_index import ModelIndex
from scehr.schemas.payloads import AvailableModel, ModelInfo
from scehr.service import readiness
from scehr.service.batcher import MicroBatcher, ModelInputs, ModelOutputs
from scehr.service.device_io import BoundRunner, max_batch_rows
from scehr.service.load_errors import DeviceError, ModelLoadError
from scehr.service.metrics import Metrics
from scehr.service.model import ModelSpec
from scehr.service.model_store import read_index, resolve
from scehr.service.runtime import CPU, CUDA, OrtRuntime, probe_device
from scehr.service.settings import Settings
from scehr.service.validation import (
    check_graph,
    graph_outputs,
    inspect,
    preflight,
    refuse_legacy,
    warm_up,
)

__all__ = [
    "DeviceError",
    "LoadedModel",
    "ModelHandle",
    "ModelLoadError",
    "ModelNotReady",
    "ModelState",
    "Registry",
    "TaskState",
    "VersionNotServed",
    "inspect",
    "load_model",
    "probe_device",
    "read_index",
    "resolve",
]

log = logging.getLogger("scehr.registry")


class ModelState(Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class TaskState:
    """A configured task's model: its state and, when failed, why."""

    state: ModelState
    reason: str = ""

    def __str__(self) -> str:
        """As /readyz shows it: "loading", "ready" or "failed: <reason>"."""
        return f"failed: {self.reason}" if self.state is ModelState.FAILED else self.state.value

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY


# ---------------------------------------------------------------- a loaded model

RunObserver = Callable[[int, float], None]  # rows, seconds of one ORT run

#: Rows per ORT run on the CPU session are a multiple of this. ONNX Runtime's CPU GEMM works
#: through the rows in blocks of 4 and takes another path for the 1-3 rows left over, whose
#: float32 sums differ in the last bits (up to 9e-8 in risk on the benchmark-17 LSTM, set-c
#: stays) from a full block's; a row in a full block gives the same result at any position and
#: run size. So a run is padded up to a multiple of this many rows (copies of its last row, cut
#: back; at most 3 rows): `scehr score` then gives the same bytes for any chunk size, and the
#: HTTP routes whatever the batcher coalesces.
#: benchmarks/chunk_invariance.py measures it; tests/service/test_offline_scoring.py checks it.
RUN_ROW_BLOCK = 4
#: Runs of at most this many rows (a lone stay padded to RUN_ROW_BLOCK, or two) go to a
#: second CPU session with one intra-op thread when the model's has more. A small run has
#: too little work per operator to share: a second non-spinning thread is woken for every
#: parallel section (each step of a recurrent graph) and costs more CPU than it saves time
#: (docs/benchmarks.md, "ORT threads for small runs"). The outputs are bit for bit the same
#: with either session (tests/service/test_svc_light_session.py checks every shipped model).
LIGHT_ROWS = 2 * RUN_ROW_BLOCK


@dataclass
class LoadedModel:
    spec: ModelSpec
    path: Path
    session: ort.InferenceSession
    provider: str
    device: str
    loaded_at: datetime
    input_names: list[str]
    observe: RunObserver | None = field(default=None, repr=False)
    shown_path: str = ""  # relative to the model dir: /models never shows server paths
    default_version: str | None = None
    default_since: datetime | None = None
    #: Rows per ORT run (`device_io.max_batch_rows`: SCEHR_GPU_MAX_BATCH_SIZE on CUDA).
    max_batch_size: int = 32
    #: Set when runs go through an ORT I/O binding (SCEHR_IO_BINDING; `scehr.service.device_io`).
    #: Not yet verified on a GPU (docs/benchmarks.md, "GPU path").
    bound: BoundRunner | None = field(default=None, repr=False)
    #: The same graph with one intra-op thread, for runs of at most LIGHT_ROWS rows (None:
    #: the session has one thread already, or runs on a GPU).
    light: ort.InferenceSession | None = field(default=None, repr=False)
    #: The graph outputs each run fetches, in `ModelOutputs` order (a landmark model's add
    #: its per-step outputs).
    output_names: tuple[str, ...] = GRAPH.output_names

    @property
    def io_binding(self) -> bool:
        return self.bound is not None

    @property
    def task(self) -> str:
        return self.spec.task

    def feeds(self, inputs: ModelInputs) -> dict[str, np.ndarray]:
        """The session's input feed of `inputs` (`static` only where the graph takes it)."""
        feeds = {GRAPH.x.name: inputs.x, GRAPH.lengths.name: inputs.lengths}
        if GRAPH.static.name in self.input_names:
            feeds[GRAPH.static.name] = inputs.static
        return feeds

    def run(self, inputs: ModelInputs) -> ModelOutputs:
        """One blocking ORT call (releases the GIL; call it from a worker thread)."""
        t0 = time.perf_counter()
        if self.bound is not None:
            out = self.bound.run(inputs, self.input_names, self.output_names)
        else:
            session = (self.light if self.light is not None and inputs.rows <= LIGHT_ROWS
                       else self.session)
            if inputs.rows % RUN_ROW_BLOCK:
                out = self._run_padded(session, inputs)
            else:
                out = ModelOutputs(*session.run(list(self.output_names), self.feeds(inputs)))
        if self.observe is not None:
            self.observe(inputs.rows, time.perf_counter() - t0)
        return out

    def _run_padded(self, session: ort.InferenceSession, inputs: ModelInputs) -> ModelOutputs:
        """A run padded to a multiple of RUN_ROW_BLOCK rows with copies of its last row, cut
        back: a stay's outputs then never depend on how many stays share its run."""
        extra = -inputs.rows % RUN_ROW_BLOCK

        def pad(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.repeat(a[-1:], extra, axis=0)])

        padded = ModelInputs(pad(inputs.x), pad(inputs.lengths),
                             None if inputs.static is None else pad(inputs.static))
        return ModelOutputs(*session.run(list(self.output_names),
                                         self.feeds(padded))).take(0, inputs.rows)

    def info(self, available: list[AvailableModel] | None = None) -> ModelInfo:
        m = self.spec.manifest
        return ModelInfo(
            task=m.task, name=m.name, version=m.version, sha256=self.spec.ref.sha256,
            path=self.shown_path or self.path.name, loss=m.loss.name, encoder=m.encoder.name,
            feature_set=self.spec.fs.name, window_hours=self.spec.fs.window_hours,
            label_names=m.label_names, uses_static=m.encoder.uses_static,
            dynamic_length=m.onnx.dynamic_length, contract_version=m.contract_version,
            created_at=m.created_at, code_version=m.code_version, provider=self.provider,
            providers=self.session.get_providers(), device=self.device,
            calibration=[c.calibration.method for c in m.classes],
            uncertainty=all(c.uncertainty is not None for c in m.classes),
            operating_points=list(self.spec.points.names),
            default_operating_point=self.spec.points.default_choice().name,
            neutralised_channels=[self.spec.fs.variable_ids[i] for i in self.spec.neutralised],
            metrics=m.metrics, loaded_at=self.loaded_at, default_version=self.default_version,
            default_since=self.default_since, worker_pid=os.getpid(),
        )


def load_model(folder: Path, task: str, settings: Settings,
               observe: RunObserver | None = None,
               runtime: OrtRuntime | None = None) -> LoadedModel:
    """Everything up to a warmed-up model; raises ModelLoadError with a rule on any failure."""
    runtime = runtime or OrtRuntime(settings.device, settings.ort_threads)
    m, sha = inspect(folder, task)
    refuse_legacy(m, settings.allow_legacy_models)
    try:
        sess = runtime.session(folder / m.onnx.file)
    except ModelLoadError:
        raise
    except Exception as e:  # ORT's own errors (corrupt graph, unsupported opset)
        raise ModelLoadError(f"ONNX Runtime cannot load {folder / m.onnx.file}: {e}",
                             rule="onnx_invalid") from e
    names, fixed_t = check_graph(sess, m)
    try:
        spec = ModelSpec.from_manifest(m, sha, fixed_t)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"manifest cannot be served: {e}", rule="manifest_invalid") from e
    model = LoadedModel(spec, folder, sess, sess.get_providers()[0], settings.device,
                        datetime.now(UTC), names, output_names=graph_outputs(sess, m))
    model.max_batch_size = max_batch_rows(model.provider, settings.max_batch_size,
                                          settings.gpu_max_batch_size)
    if settings.io_binding == "on" or (settings.io_binding == "auto" and model.provider == CUDA):
        model.bound = BoundRunner(sess, model.max_batch_size, gpu=model.provider == CUDA)
    elif model.provider == CPU and runtime.threads > 1:
        model.light = runtime.session(folder / m.onnx.file, threads=1)
    try:
        warm_up(model, model.max_batch_size)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"warm-up failed: {type(e).__name__}: {e}",
                             rule="warmup_failed") from e
    root = Path(settings.model_dir).resolve()
    if folder.resolve().is_relative_to(root):
        model.shown_path = folder.resolve().relative_to(root).as_posix()
    model.observe = observe
    log.info("model loaded", extra={"task": task, "model": m.name, "version": m.version,
                                    "provider": model.provider,
                                    "intra_op_threads": settings.ort_threads})
    return model


# ---------------------------------------------------------------- the registry


@dataclass
class ModelHandle:
    """What a request holds for its whole life: the model and the batcher feeding it.
    `default`: the version of its task that requests without `?version=` get."""

    model: LoadedModel
    batcher: MicroBatcher
    default: bool = True


class ModelNotReady(Exception):
    pass


class VersionNotServed(LookupError):
    """A version of a served task that this server has not loaded; `served` lists those it
    has (SCEHR_VERSIONS), the default first."""

    def __init__(self, task: str, version: str, served: list[str]) -> None:
        super().__init__(f"{task} {version}")
        self.task, self.version, self.served = task, version, served


class Registry:
    """Configured tasks -> handles (one per served version, SCEHR_VERSIONS); loads in the
    background, swaps atomically on reload."""

    def __init__(self, settings: Settings, metrics: Metrics, executor: Executor) -> None:
        self.settings = settings
        self.metrics = metrics
        self.executor = executor
        #: task -> the handle of the version requests get without `?version=`
        self.handles: dict[str, ModelHandle] = {}
        #: task -> version -> handle, every loaded version (the default among them)
        self.versions: dict[str, dict[str, ModelHandle]] = {}
        self.runtime = OrtRuntime(settings.device, settings.ort_threads)
        self.states: dict[str, TaskState] = {}
        #: task -> its model folders, the default version's first
        self.folders: dict[str, list[Path]] = {}
        #: task -> (default version in index.json, since when) as read at start-up
        self.defaults: dict[str, tuple[str | None, datetime | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    # -- start-up
    def preflight(self) -> None:
        """Fail fast at start (see `validation.preflight`); every model is then loading."""
        checked = preflight(self.settings.model_dir, list(self.settings.tasks or []),
                            self.runtime, self.settings.versions,
                            self.settings.allow_legacy_models)
        self.defaults = checked.defaults
        for task, folders in checked.folders.items():
            self.folders[task] = folders
            self.states[task] = TaskState(ModelState.LOADING)

    @property
    def state(self) -> dict[str, str]:
        """Each configured task's state as text (what /readyz and /models show)."""
        return {task: str(s) for task, s in self.states.items()}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._load_all())

    async def _load_all(self) -> None:
        for task, folders in self.folders.items():
            try:
                models = [await asyncio.to_thread(self._load, folder, task)
                          for folder in folders]
            except Exception as e:
                self.states[task] = TaskState(ModelState.FAILED, str(e))
                log.error("model failed to load", extra={
                    "task": task, "rule": getattr(e, "rule", type(e).__name__),
                    "reason": str(e)})
                continue
            for k, model in enumerate(models):
                self._install(task, model, default=k == 0)
        # The long-lived objects (sessions, manifests, tables) now exist: move them out of the
        # collector's reach, so full collections under load scan only per-request garbage.
        gc.collect()
        gc.freeze()
        if self.ready:
            readiness.mark_ready(readiness.shared_folder())

    def _load(self, folder: Path, task: str) -> LoadedModel:
        return load_model(folder, task, self.settings, self._observe_run(task), self.runtime)

    def _observe_run(self, task: str) -> RunObserver:
        def observe(rows: int, seconds: float) -> None:
            self.metrics.child(self.metrics.batch_size, task).observe(rows)
            self.metrics.child(self.metrics.compute_seconds, task).observe(seconds)
        return observe

    def _observe_queue(self, task: str) -> Callable[[list[float]], None]:
        hist = self.metrics.queue_seconds.labels(task)

        def observe(waits: list[float]) -> None:
            for w in waits:
                hist.observe(w)
        return observe

    def _install(self, task: str, model: LoadedModel, *, default: bool = True
                 ) -> list[ModelHandle]:
        """Serve `model` (as the task's default version, or beside it); the handles it
        replaces (the old default, or an older load of the same version) are returned for
        draining."""
        s = self.settings
        batcher = MicroBatcher(model.run, max_batch_size=model.max_batch_size,
                               max_queue_delay=s.max_queue_delay, max_queue_size=s.max_queue_size,
                               executor=self.executor, observe=self._observe_queue(task),
                               name=task,
                               # a lone request runs at once on the CPU, unless told to wait
                               inline_when_idle=model.provider == CPU and s.max_queue_delay == 0)
        batcher.start()
        m = model.spec.manifest
        handle = ModelHandle(model, batcher, default)
        loaded = dict(self.versions.get(task, {}))
        replaced = [loaded[m.version]] if m.version in loaded else []
        old = self.handles.get(task)
        if default and old is not None and old.model.spec.manifest.version != m.version:
            replaced.append(loaded.pop(old.model.spec.manifest.version, old))
        loaded[m.version] = handle
        for h in loaded.values():
            h.default = h is handle if default else h.default
        if default:
            self.handles[task] = handle  # the atomic swap
            self.states[task] = TaskState(ModelState.READY)
        self.versions[task] = dict(sorted(loaded.items(), key=lambda kv: not kv[1].default))
        for r in replaced:
            om = r.model.spec.manifest
            self.metrics.set_model(task, m.name, m.version, model.provider,
                                   (om.name, om.version, r.model.provider))
        self.metrics.set_model(task, m.name, m.version, model.provider)
        version, since = self.defaults.get(task, (None, None))
        model.default_version, model.default_since = version, since
        if version is not None:
            self.metrics.set_default(task, version, since)
        return replaced

    # -- serving
    @property
    def ready(self) -> bool:
        return bool(self.states) and all(s.ready for s in self.states.values())

    def get(self, task: str, version: str | None = None) -> ModelHandle:
        """The task's default handle, or that of `version`: KeyError when the task is not
        served, ModelNotReady while it loads, VersionNotServed for a version not loaded."""
        h = self.handles.get(task)
        if h is None:
            if task in self.states:
                raise ModelNotReady(str(self.states[task]))
            raise KeyError(task)
        if version is None or version == h.model.spec.manifest.version:
            return h
        loaded = self.versions.get(task, {})
        if version not in loaded:
            raise VersionNotServed(task, version, list(loaded))
        return loaded[version]

    def loaded(self, task: str) -> list[ModelHandle]:
        """Every loaded version of `task`, the default first ([] when none)."""
        return list(self.versions.get(task, {}).values())

    def available(self) -> list[AvailableModel]:
        try:
            index = read_index(self.settings.model_dir)
        except ModelLoadError:
            return []
        out = []
        for e in index.models:
            default = index.defaults.get(e.task) == e.version
            out.append(AvailableModel(task=e.task, version=e.version, name=e.name, path=e.path,
                                      default=default,
                                      default_since=index.since(e.task) if default else None))
        return out

    async def reload(self, task: str, *, version: str | None = None,
                     path: str | None = None) -> tuple[LoadedModel, str | None]:
        """Load and warm up off the event loop, then swap; the old model serves meanwhile."""
        lock = self._locks.setdefault(task, asyncio.Lock())
        async with lock:
            index = read_index(self.settings.model_dir) if path is None else ModelIndex(
                defaults={}, models=[])
            folder = resolve(self.settings.model_dir, index, task, version=version, path=path)
            model = await asyncio.to_thread(self._load, folder, task)
            old = self.handles.get(task)
            replaced = self._install(task, model)
            self.folders[task] = [h.model.path for h in self.loaded(task)]
        prev = None if old is None else old.model.spec.manifest.version
        for r in replaced:
            asyncio.get_running_loop().create_task(r.batcher.close())  # drain in background
        log.info("model reloaded", extra={"task": task, "version": model.spec.manifest.version,
                                          "previous_version": prev})
        return model, prev

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for loaded in list(self.versions.values()):
            for h in list(loaded.values()):
                await h.batcher.close()
