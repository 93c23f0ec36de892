"""The one configuration object of the service, read from `SCEHR_*` environment variables.

Every field below is an environment variable with the `SCEHR_` prefix (e.g. `SCEHR_MODEL_DIR`,
`SCEHR_MAX_BATCH_SIZE`). `scehr serve` sets the ones it takes as options before uvicorn starts,
so every worker process reads the same values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from scehr.schemas.tasks import TASK_NAMES


def default_model_dir() -> Path:
    """The repository's `models/` when running from a checkout, else `./models`."""
    repo = Path(__file__).resolve().parents[1] / "models"
    return repo if repo.is_dir() else Path.cwd() / "models"


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The CPU quota of this process's cgroup in whole cores (rounded up), None when unlimited
    or unknown: a container limited to 2 CPUs on a 64-core host should start 2 workers."""
    try:  # cgroup v2
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else max(1, -(-q // p))
    except (OSError, ValueError):
        return None


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return min(cores, quota) if quota else cores


def parse_versions(text: str) -> dict[str, list[str]]:
    """`mortality=1.2.0,1.1.0,phenotypes=1.1.0` -> {"mortality": ["1.2.0", "1.1.0"],
    "phenotypes": ["1.1.0"]}: an item without `=` is one more version of the task before it
    (`scehr serve --version mortality=1.2.0 --version mortality=1.1.0` says the same)."""
    out: dict[str, list[str]] = {}
    task = None
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item.count("=") > 1 or (task is None and "=" not in item):
            raise ValueError("versions must be TASK=VERSION[,VERSION...], comma-separated; "
                             f"got {text!r}")
        if "=" in item:
            task, version = (x.strip() for x in item.split("="))
            out.setdefault(task, [])
        else:
            version = item
        if not version:
            raise ValueError(f"an empty version in {text!r}")
        out[task].append(version)  # type: ignore[index]
    return out


class Settings(BaseSettings):
    """Service settings; env prefix `SCEHR_`."""

    model_config = SettingsConfigDict(env_prefix="SCEHR_", protected_namespaces=(),
                                      extra="ignore")

    model_dir: Path = Field(default_factory=default_model_dir,
                            description="Folder holding index.json and <task>/<version>/")
    tasks: Annotated[list[str] | None, NoDecode] = Field(
        None, description="Tasks to serve (comma-separated); default: every task with a default "
        "model in index.json")
    versions: Annotated[dict[str, list[str]], NoDecode] = Field(
        default_factory=dict, description="The versions of index.json a task serves instead of "
        "its default alone: TASK=VERSION[,VERSION...], tasks comma-separated (e.g. "
        "mortality=1.3.1,1.1.1 serves both; a request picks one with `?version=`). Requests "
        "without one get the index's default when it is listed, else the first listed (so "
        "mortality=1.1.1 pins the task to 1.1.1)")
    allow_legacy_models: bool = Field(
        False, description="Serve (and `scehr score`) models exported before manifest "
        "contract 1.4, which carry no uncertainty interval and mostly no data minimum (e.g. "
        "mortality 1.1.0, whose re-issued graph 1.1.1 has both); refused by default with a "
        "message naming the version re-issued from the same graph")
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="auto: CUDA when ONNX Runtime can really use it, else CPU; cuda: fail "
        "at start without a working CUDA provider")
    io_binding: Literal["auto", "on", "off"] = Field(
        "auto", description="Run ORT through an I/O binding (inputs copied to the device once "
        "per run from reused, pinned where available, host buffers; outputs bound on the device); "
        "auto: on the CUDA provider only")
    workers: int = Field(1, ge=1, description="uvicorn worker processes (sizes ORT threads); "
                         "`scehr serve` sets it, by default to the available cores")
    intra_op_threads: int | None = Field(
        None, ge=1, description="ORT intra-op threads per session; default cores // workers "
        "(with more than one, runs of at most 8 rows use a second, one-thread session)")
    max_batch_size: int = Field(32, ge=1, description="Rows per ONNX run of the micro-batcher; "
                                "1 turns batching off")
    gpu_max_batch_size: int = Field(
        256, ge=1, description="Rows per ONNX run on the CUDA provider (it replaces "
        "max_batch_size there; batches are padded to a power of two)")
    max_queue_delay_ms: float = Field(
        0.0, ge=0, description="How long the batcher waits for more requests once one is "
        "queued. 0: run what is queued at once; under load batches still form while the "
        "previous one computes, and a lone request pays no wait (on the CPU it runs at once "
        "on the event loop's thread, without the hand-off to an ORT worker thread)")
    max_queue_size: int = Field(
        256, ge=1, description="Load-shedding units per model (requests being parsed, queued or "
        "computed; a request counts one unit per started 32 kB of body, at least one, so a "
        "256-stay batch counts like its stays) before new ones are refused with 503 + "
        "Retry-After (before their body is read when the model is already full; a request is "
        "admitted once its body has arrived; one request alone is always admitted)")
    request_timeout_s: float = Field(
        5.0, gt=0, description="Deadline per scoring request (any interface), per ORT run it "
        "needs, from the arrival of its body (decoding, preprocessing, queue wait and compute): "
        "503 + Retry-After if it has not reached the model or is still queued then, 504 if "
        "computing")
    body_timeout_s: float = Field(
        10.0, gt=0, description="Seconds a scoring request's body may take to arrive once its "
        "headers have: a body still incomplete then gets 408 and its connection is closed. "
        "Requests count against the model's load-shedding limit only once their body is in, so "
        "stalled uploads never lock other clients out")
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with overload 503s")
    gil_switch_ms: float = Field(
        1.0, gt=0, le=100, description="The interpreter's switch interval in each worker "
        "process (ms): the longest the event loop's thread waits for the GIL while a worker "
        "thread runs a heavy request's Python, each time it needs it (Python's default: 5)")
    offload_bytes: int = Field(
        64 * 1024, ge=0, description="A request whose body costs more to decode than this "
        "many bytes of JSON stays (a FHIR or CDS Hooks body counts 20 times its size), that "
        "carries several stays, or that asks for explain=full is decoded, preprocessed and "
        "answered in a worker thread, off the event loop. The default keeps a single stay "
        "of up to 64 kB (498 of 500 PhysioNet set-C stays as LOINC-coded JSON; about 1 ms "
        "of decoding) on the loop: its hand-offs to a worker thread and back cost more CPU "
        "under load than the loop waits for it")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger bodies get 413")
    max_batch_stays: int = Field(256, ge=1, description="Stays per batch request")
    max_observations: int = Field(20_000, ge=1, description="Observations per stay")
    fhir_validation: Literal["lean", "full"] = Field(
        "lean", description="FHIR and CDS Hooks input: `lean` validates the elements the "
        "adapter reads, with FHIR's rules (types, patterns, required elements, one value[x]); "
        "`full` validates every element of every resource with `fhir.resources` (slower per "
        "Observation, docs/interfaces.md; refuses unknown elements and missing elements never "
        "read)")
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Comma-separated keys for `X-API-Key`; when set, "
        "predict and admin routes need one; admin routes exist only when set")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    open_docs: bool = Field(True, description="Serve /docs, /redoc and /openapi.json")
    open_models: bool = Field(
        True, description="Serve /models, /models/{task}, the model card (/models/{task}/card), "
        "the transparency documents (/models/{task}/{version}/transparency/...) and V2 model "
        "metadata (/v2/models/{name}): what is served, its checksums and metrics")
    open_metrics: bool = Field(True, description="Serve /metrics")
    monitor_window: int = Field(
        1000, ge=10, le=100_000, description="Drift monitoring: the last N scored stays per "
        "model (and worker) the gauges and GET /models/{task}/monitoring summarize; memory is "
        "fixed by N, whatever the traffic")
    public_base_url: str | None = Field(
        None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="The service's address as clients reach it (e.g. https://scehr.example.org"
        "); CDS cards link to the model card under it. Unset: cards carry no link, since a "
        "request's own Host header is the client's word, not the service's address")

    @field_validator("tasks", mode="before")
    @classmethod
    def _split_tasks(cls, v: object) -> object:
        if isinstance(v, str):
            v = [t.strip() for t in v.split(",") if t.strip()] or None
        for t in v or []:
            if t not in TASK_NAMES:
                raise ValueError(f"unknown task {t!r}; known: {', '.join(TASK_NAMES)}")
        return v

    @field_validator("versions", mode="before")
    @classmethod
    def _split_versions(cls, v: object) -> object:
        if isinstance(v, str):
            v = parse_versions(v)
        if isinstance(v, dict):
            v = {t: [vs] if isinstance(vs, str) else vs for t, vs in v.items()}
        for t, vs in (v or {}).items():
            if t not in TASK_NAMES:
                raise ValueError(f"unknown task {t!r} in versions; known: {', '.join(TASK_NAMES)}")
            if len(set(vs)) != len(vs):
                raise ValueError(f"versions of {t} are listed twice: {', '.join(vs)}")
        return v

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: object) -> object:
        if isinstance(v, str):
            return [k.strip() for k in v.split(",") if k.strip()]
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    @property
    def max_queue_delay(self) -> float:
        return self.max_queue_delay_ms / 1000.0

    @property
    def ort_threads(self) -> int:
        """Threads per ORT session: the cores shared out between worker processes."""
        return self.intra_op_threads or max(1, available_cores() // self.workers)
