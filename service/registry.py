"""Model artifacts -> warmed-up ONNX Runtime sessions, and the per-task swap on reload.

A model is loaded in full before it can serve: manifest (contract major version), sha256 of
model.onnx, a session on the provider the `device` setting allows (checked after creation,
because onnxruntime-gpu silently falls back to CPU when CUDA cannot start), graph inputs and
outputs, then a warm-up through the real pipeline that also checks the manifest's anchors
against the graph and that padding a stay in a batch does not change its result. Only then is
it swapped in; a request holds the handle it started with, so it finishes on that model.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.contract import (
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
    OUTPUT_Z,
    TASKS,
)
from schemas.manifest import ContractError, Manifest, load_manifest, sha256_file
from schemas.payloads import AvailableModel, ModelInfo, Observation, StayPayload
from service.batcher import MicroBatcher, ModelInputs, ModelOutputs, run_chunked
from service.metrics import Metrics
from service.pipeline import ModelSpec, predictions, prepare
from service.settings import Settings

log = logging.getLogger("scehr.registry")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
OUTPUTS = [OUTPUT_Z, OUTPUT_ANCHOR_LOGITS, OUTPUT_PROBABILITY]


class ModelLoadError(ValueError):
    """A model that cannot serve; `rule` names why, `status` is the HTTP answer on reload."""

    def __init__(self, message: str, rule: str = "model_invalid", status: int = 422) -> None:
        super().__init__(message)
        self.rule = rule
        self.status = status


class DeviceError(ModelLoadError):
    def __init__(self, message: str) -> None:
        super().__init__(message, rule="device_unavailable", status=500)


# ---------------------------------------------------------------- the model index


class IndexEntry(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    task: str
    version: str
    name: str | None = None
    path: str


class ModelIndex(BaseModel):
    model_config = ConfigDict(extra="allow")

    defaults: dict[str, str]
    models: list[IndexEntry]


def read_index(model_dir: Path) -> ModelIndex:
    path = Path(model_dir) / "index.json"
    if not path.is_file():
        raise ModelLoadError(f"no model index at {path}: train and export a model, or point "
                             "SCEHR_MODEL_DIR / --model-dir at a folder with index.json",
                             rule="index_missing", status=500)
    try:
        return ModelIndex.model_validate_json(path.read_text())
    except (OSError, ValidationError) as e:
        raise ModelLoadError(f"{path} is not a valid model index: {e}", rule="index_invalid",
                             status=500) from e


def resolve(model_dir: Path, index: ModelIndex, task: str, *, version: str | None = None,
            path: str | None = None) -> Path:
    """The folder of a model: by index version, by path under the model dir, or the default."""
    root = Path(model_dir).resolve()
    if path is not None:
        p = Path(path)
        folder = (p if p.is_absolute() else root / p).resolve()
        if not folder.is_relative_to(root):
            raise ModelLoadError(f"path {path!r} is outside the model directory",
                                 rule="path_outside_model_dir", status=422)
        if not (folder / "manifest.json").is_file():
            raise ModelLoadError(f"no manifest.json in {path!r}", rule="model_not_found",
                                 status=404)
        return folder
    version = version or index.defaults.get(task)
    if version is None:
        raise ModelLoadError(f"index.json has no default model for {task!r}",
                             rule="no_default_model", status=404)
    for e in index.models:
        if e.task == task and e.version == version:
            folder = (root / e.path).resolve()
            if not folder.is_relative_to(root):
                raise ModelLoadError(f"index path {e.path!r} is outside the model directory",
                                     rule="path_outside_model_dir", status=422)
            return folder
    folder = root / task / version
    if (folder / "manifest.json").is_file():
        return folder
    raise ModelLoadError(f"no {task} model with version {version!r} in index.json",
                         rule="model_not_found", status=404)


def inspect(folder: Path, task: str) -> tuple[Manifest, str]:
    """Manifest (contract version checked) and the verified sha256 of its ONNX file."""
    try:
        m = load_manifest(folder / "manifest.json")
    except ContractError as e:
        raise ModelLoadError(str(e), rule="contract_version") from e
    except ValidationError as e:
        raise ModelLoadError(f"{folder}/manifest.json does not follow the manifest schema: "
                             f"{e.error_count()} errors, first: {e.errors()[0]['msg']} at "
                             f"{'.'.join(map(str, e.errors()[0]['loc']))}",
                             rule="manifest_invalid") from e
    if m.task != task:
        raise ModelLoadError(f"{folder} is a {m.task} model, not {task}", rule="task_mismatch")
    onnx_path = folder / m.onnx.file
    if not onnx_path.is_file():
        raise ModelLoadError(f"{onnx_path} is missing", rule="onnx_missing")
    sha = sha256_file(onnx_path)
    if sha != m.onnx.sha256:
        raise ModelLoadError(f"sha256 of {onnx_path} is {sha}, the manifest says "
                             f"{m.onnx.sha256}: the file was changed after export",
                             rule="sha256_mismatch")
    c = len(m.label_names)
    u, v = m.anchors.get("u"), m.anchors.get("v")
    if len(m.classes) != c or u is None or v is None or len(u) != c or len(v) != c:
        raise ModelLoadError("manifest label_names, classes and anchors disagree on the number "
                             "of classes", rule="manifest_inconsistent")
    if any(len(row) != m.encoder.out_dim for row in (*u, *v)):
        raise ModelLoadError("anchor length differs from encoder.out_dim",
                             rule="manifest_inconsistent")
    return m, sha


# ---------------------------------------------------------------- sessions and devices


#: Whether CUDA really started in this process (None: not tried yet); spares every later
#: session under `auto` the failed attempt and its error log once CUDA is known not to work.
_cuda_works: bool | None = None


def providers_for(device: str) -> list[Any]:
    available = ort.get_available_providers()
    if device == "cpu" or (device == "auto" and _cuda_works is False):
        return [CPU]
    if CUDA not in available:
        if device == "cuda":
            raise DeviceError("device=cuda but this onnxruntime build has no CUDA provider "
                              "(install onnxruntime-gpu), or use SCEHR_DEVICE=auto/cpu")
        return [CPU]
    return [(CUDA, {"cudnn_conv_algo_search": "HEURISTIC"}), CPU]


def _check_provider(device: str, provider: str) -> None:
    global _cuda_works
    if device != "cpu":
        _cuda_works = provider == CUDA
    if device == "cuda" and provider != CUDA:
        raise DeviceError(
            "device=cuda but ONNX Runtime could not start its CUDA provider and fell back to "
            f"{provider} (onnxruntime-gpu lists CUDA as available even without a usable GPU or "
            "CUDA/cuDNN libraries; its own error is logged above). Fix the GPU setup, or set "
            "SCEHR_DEVICE=auto to run on CPU.")
    if device == "auto" and provider != CUDA and CUDA in ort.get_available_providers():
        log.warning("CUDA provider listed but not usable: running on CPU",
                    extra={"provider": provider})


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


def create_session(onnx_path: Path, device: str, threads: int) -> ort.InferenceSession:
    sess = ort.InferenceSession(str(onnx_path), session_options(threads),
                                providers=providers_for(device))
    _check_provider(device, sess.get_providers()[0])
    return sess


#: A one-node ONNX graph (Identity, opset 13), serialized, so the probe needs no `onnx` package.
_PROBE_MODEL = base64.b64decode(
    "CAgSBXNjZWhyOjsKEAoBYRIBYiIISWRlbnRpdHkSBXByb2JlWg8KAWESCgoICAESBAoCCAFiDwoBYhIKCggIARIE"
    "CgIIAUIECgAQDQ==")


def probe_device(device: str) -> str:
    """The provider a session really gets under `device`; raises DeviceError at start."""
    sess = ort.InferenceSession(_PROBE_MODEL, session_options(1), providers=providers_for(device))
    provider = sess.get_providers()[0]
    _check_provider(device, provider)
    return provider


# ---------------------------------------------------------------- a loaded model

RunObserver = Callable[[int, float], None]  # rows, seconds of one ORT run


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

    @property
    def task(self) -> str:
        return self.spec.task

    def run(self, inputs: ModelInputs) -> ModelOutputs:
        """One blocking ORT call (releases the GIL; call it from a worker thread)."""
        feeds = {INPUT_X: inputs.x, INPUT_LENGTHS: inputs.lengths}
        if INPUT_STATIC in self.input_names:
            feeds[INPUT_STATIC] = inputs.static
        t0 = time.perf_counter()
        z, al, p = self.session.run(OUTPUTS, feeds)
        if self.observe is not None:
            self.observe(inputs.rows, time.perf_counter() - t0)
        return ModelOutputs(z, al, p)

    def info(self, available: list[AvailableModel] | None = None) -> ModelInfo:
        m = self.spec.manifest
        return ModelInfo(
            task=m.task, name=m.name, version=m.version, sha256=self.spec.ref.sha256,
            path=str(self.path), loss=m.loss.name, encoder=m.encoder.name,
            feature_set=self.spec.fs.name, window_hours=self.spec.fs.window_hours,
            label_names=m.label_names, uses_static=m.encoder.uses_static,
            dynamic_length=m.onnx.dynamic_length, contract_version=m.contract_version,
            created_at=m.created_at, code_version=m.code_version, provider=self.provider,
            providers=self.session.get_providers(), device=self.device,
            calibration=[c.calibration.method for c in m.classes],
            operating_points=list(self.spec.points.names),
            default_operating_point=self.spec.points.default_choice().name,
            neutralised_channels=[self.spec.fs.variable_ids[i] for i in self.spec.neutralised],
            metrics=m.metrics, loaded_at=self.loaded_at, worker_pid=os.getpid(),
        )


def _check_graph(sess: ort.InferenceSession, m: Manifest) -> tuple[list[str], int | None]:
    names = [i.name for i in sess.get_inputs()]
    want = [INPUT_X, INPUT_LENGTHS] + ([INPUT_STATIC] if m.encoder.uses_static else [])
    if sorted(names) != sorted(want):
        raise ModelLoadError(f"graph inputs {names}, expected {want} (uses_static="
                             f"{m.encoder.uses_static})", rule="graph_inputs")
    outs = [o.name for o in sess.get_outputs()]
    if not set(OUTPUTS) <= set(outs):
        raise ModelLoadError(f"graph outputs {outs} lack some of {OUTPUTS}", rule="graph_outputs")
    t = next(i for i in sess.get_inputs() if i.name == INPUT_X).shape[1]
    return names, t if isinstance(t, int) else None


def warmup_stays(spec: ModelSpec) -> list[StayPayload]:
    """Two synthetic stays of normal values and different lengths (no patient data)."""
    stays = []
    for hours in (6, 30):
        obs = []
        for k, var in enumerate(spec.fs.variables):
            value: float | str = var.normal if var.is_categorical else float(var.normal)
            for t in range(1, hours + 1, 3):
                obs.append(Observation(variable=var.id, time=float(t) + k / 100.0, value=value,
                                       unit=None if var.is_categorical else var.unit))
        stays.append(StayPayload(observations=obs))
    return stays


def warm_up(model: LoadedModel, max_batch_size: int) -> None:
    """Run the real pipeline; check shapes, anchors vs graph and batch-vs-single equality."""
    spec = model.spec
    stays = warmup_stays(spec)
    prep = prepare(spec, stays, explain_full=True)
    if prep.problems or prep.inputs is None:
        raise ModelLoadError("warm-up stays did not validate against the feature set",
                             rule="warmup_failed")
    out = run_chunked(model.run, prep.inputs, max_batch_size)
    n, c, d = prep.inputs.rows, len(spec.assets.labels), spec.manifest.encoder.out_dim
    for name, arr, shape in ((OUTPUT_Z, out.z, (n, d)), (OUTPUT_ANCHOR_LOGITS, out.anchor_logits,
                             (n, c, 2)), (OUTPUT_PROBABILITY, out.probability, (n, c))):
        if arr.shape != shape:
            raise ModelLoadError(f"warm-up: {name} has shape {arr.shape}, expected {shape}",
                                 rule="warmup_failed")
        if not np.isfinite(arr).all():
            raise ModelLoadError(f"warm-up: {name} is not finite", rule="warmup_failed")
    if (out.probability < 0).any() or (out.probability > 1).any():
        raise ModelLoadError("warm-up: probability outside [0, 1]", rule="warmup_failed")
    z = out.z.astype(np.float64)
    for k, a in ((0, spec.assets.u), (1, spec.assets.v)):
        if not np.allclose(z @ a.T, out.anchor_logits[..., k], rtol=1e-3, atol=1e-3):
            raise ModelLoadError("the manifest's anchors do not reproduce the graph's "
                                 "anchor_logits: explanations would be wrong",
                                 rule="anchors_mismatch")
    n_ok = len(prep.ok)
    for r in range(n_ok):  # each stay alone must equal its row in the padded batch
        one = ModelInputs(prep.inputs.x[r : r + 1, : int(prep.inputs.lengths[r])],
                          prep.inputs.lengths[r : r + 1],
                          None if prep.inputs.static is None else prep.inputs.static[r : r + 1])
        if spec.fixed_t is not None:
            one.x = prep.inputs.x[r : r + 1]
        single = model.run(one)
        if not np.allclose(single.probability, out.probability[r : r + 1], atol=1e-4):
            raise ModelLoadError("a stay scored alone differs from the same stay in a padded "
                                 "batch: the export is wrong for batch > 1 or variable length",
                                 rule="batch_inconsistent")
    predictions(spec, prep, out)


def load_model(folder: Path, task: str, settings: Settings,
               observe: RunObserver | None = None) -> LoadedModel:
    """Everything up to a warmed-up model; raises ModelLoadError with a rule on any failure."""
    m, sha = inspect(folder, task)
    try:
        sess = create_session(folder / m.onnx.file, settings.device, settings.ort_threads)
    except ModelLoadError:
        raise
    except Exception as e:  # ORT's own errors (corrupt graph, unsupported opset)
        raise ModelLoadError(f"ONNX Runtime cannot load {folder / m.onnx.file}: {e}",
                             rule="onnx_invalid") from e
    names, fixed_t = _check_graph(sess, m)
    try:
        spec = ModelSpec.from_manifest(m, sha, fixed_t)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"manifest cannot be served: {e}", rule="manifest_invalid") from e
    model = LoadedModel(spec, folder, sess, sess.get_providers()[0], settings.device,
                        datetime.now(UTC), names)
    try:
        warm_up(model, settings.max_batch_size)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"warm-up failed: {type(e).__name__}: {e}",
                             rule="warmup_failed") from e
    model.observe = observe
    log.info("model loaded", extra={"task": task, "model": m.name, "version": m.version,
                                    "provider": model.provider,
                                    "intra_op_threads": settings.ort_threads})
    return model


# ---------------------------------------------------------------- the registry


@dataclass
class ModelHandle:
    """What a request holds for its whole life: the model and the batcher feeding it."""

    model: LoadedModel
    batcher: MicroBatcher


class ModelNotReady(Exception):
    pass


class Registry:
    """Configured tasks -> handles; loads in the background, swaps atomically on reload."""

    def __init__(self, settings: Settings, metrics: Metrics, executor: Executor) -> None:
        self.settings = settings
        self.metrics = metrics
        self.executor = executor
        self.handles: dict[str, ModelHandle] = {}
        self.state: dict[str, str] = {}
        self.folders: dict[str, Path] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    # -- start-up
    def preflight(self) -> None:
        """Fail fast at start: device, index, manifests and checksums of every configured model."""
        provider = probe_device(self.settings.device)
        log.info("execution provider", extra={"device": self.settings.device,
                                              "provider": provider})
        index = read_index(self.settings.model_dir)
        tasks = self.settings.tasks or [t for t in TASKS if t in index.defaults]
        if not tasks:
            raise ModelLoadError(f"{self.settings.model_dir}/index.json names no default model",
                                 rule="no_default_model", status=500)
        for task in tasks:
            folder = resolve(self.settings.model_dir, index, task)
            inspect(folder, task)
            self.folders[task] = folder
            self.state[task] = "loading"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._load_all())

    async def _load_all(self) -> None:
        for task, folder in self.folders.items():
            try:
                model = await asyncio.to_thread(self._load, folder, task)
            except Exception as e:
                self.state[task] = f"failed: {e}"
                log.error("model failed to load", extra={
                    "task": task, "rule": getattr(e, "rule", type(e).__name__),
                    "reason": str(e)})
                continue
            self._install(task, model)
        # The long-lived objects (sessions, manifests, tables) now exist: move them out of the
        # collector's reach, so full collections under load scan only per-request garbage.
        gc.collect()
        gc.freeze()

    def _load(self, folder: Path, task: str) -> LoadedModel:
        return load_model(folder, task, self.settings, self._observe_run(task))

    def _observe_run(self, task: str) -> RunObserver:
        def observe(rows: int, seconds: float) -> None:
            self.metrics.batch_size.labels(task).observe(rows)
            self.metrics.compute_seconds.labels(task).observe(seconds)
        return observe

    def _observe_queue(self, task: str) -> Callable[[list[float]], None]:
        hist = self.metrics.queue_seconds.labels(task)

        def observe(waits: list[float]) -> None:
            for w in waits:
                hist.observe(w)
        return observe

    def _install(self, task: str, model: LoadedModel) -> ModelHandle | None:
        s = self.settings
        batcher = MicroBatcher(model.run, max_batch_size=s.max_batch_size,
                               max_queue_delay=s.max_queue_delay, max_queue_size=s.max_queue_size,
                               executor=self.executor, observe=self._observe_queue(task),
                               name=task)
        batcher.start()
        old = self.handles.get(task)
        self.handles[task] = ModelHandle(model, batcher)  # the atomic swap
        self.state[task] = "ready"
        prev = None
        if old is not None:
            om = old.model.spec.manifest
            prev = (om.name, om.version, old.model.provider)
        m = model.spec.manifest
        self.metrics.set_model(task, m.name, m.version, model.provider, prev)
        return old

    # -- serving
    @property
    def ready(self) -> bool:
        return bool(self.state) and all(v == "ready" for v in self.state.values())

    def get(self, task: str) -> ModelHandle:
        h = self.handles.get(task)
        if h is None:
            if task in self.state:
                raise ModelNotReady(self.state[task])
            raise KeyError(task)
        return h

    def available(self) -> list[AvailableModel]:
        try:
            index = read_index(self.settings.model_dir)
        except ModelLoadError:
            return []
        return [AvailableModel(task=e.task, version=e.version, name=e.name, path=e.path,
                               default=index.defaults.get(e.task) == e.version)
                for e in index.models]

    async def reload(self, task: str, *, version: str | None = None,
                     path: str | None = None) -> tuple[LoadedModel, str | None]:
        """Load and warm up off the event loop, then swap; the old model serves meanwhile."""
        lock = self._locks.setdefault(task, asyncio.Lock())
        async with lock:
            index = read_index(self.settings.model_dir) if path is None else ModelIndex(
                defaults={}, models=[])
            folder = resolve(self.settings.model_dir, index, task, version=version, path=path)
            model = await asyncio.to_thread(self._load, folder, task)
            old = self._install(task, model)
            self.folders[task] = folder
        prev = None
        if old is not None:
            prev = old.model.spec.manifest.version
            asyncio.get_running_loop().create_task(old.batcher.close())  # drain in background
        log.info("model reloaded", extra={"task": task, "version": model.spec.manifest.version,
                                          "previous_version": prev})
        return model, prev

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for h in list(self.handles.values()):
            await h.batcher.close()
