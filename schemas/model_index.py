"""`models/index.json`, the hand-over between export (writes) and the service (reads).

One module reads and writes it, so the file has one schema: a default version per task (and
since when it is the default) and a list of entries, each pointing at a `<task>/<version>/`
folder under the index's directory. Unknown keys are kept (extra="allow") so an older reader
still loads a newer index.

Every change is explicit and reported: adding a version never replaces an existing one and
never changes a default unless asked; the default moves only through `set_default` (or a
task's first model); the default cannot be removed. Writes are atomic (temporary file +
rename), so a reader never sees half an index.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

INDEX_FILE = "index.json"


class ModelIndexError(ValueError):
    """The index is missing or invalid; `rule` names which."""

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class MetricCI(BaseModel):
    value: float | None = None
    low: float | None = None
    high: float | None = None


class IndexEntry(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    task: str
    version: str
    name: str | None = None
    path: str
    loss: str | None = None
    encoder: str | None = None
    feature_set: str | None = None
    metrics: dict[str, MetricCI | float] | None = None


class ModelIndex(BaseModel):
    model_config = ConfigDict(extra="allow")

    defaults: dict[str, str] = {}
    default_since: dict[str, str] = Field(
        default_factory=dict, description="task -> UTC ISO time its current default was set")
    models: list[IndexEntry] = []

    def entry(self, task: str, version: str) -> IndexEntry | None:
        return next((e for e in self.models if e.task == task and e.version == version), None)

    def since(self, task: str) -> dt.datetime | None:
        raw = self.default_since.get(task)
        return dt.datetime.fromisoformat(raw) if raw else None

    def upsert(self, entry: IndexEntry, make_default: bool = False) -> None:
        """Add or replace the (task, version) entry in memory; the first model of a task is its
        default. Files change through `add_model`, which refuses an existing version."""
        self.models = sorted([e for e in self.models
                              if not (e.task == entry.task and e.version == entry.version)]
                             + [entry], key=lambda e: (e.task, e.version))
        if make_default or entry.task not in self.defaults:
            self.defaults[entry.task] = entry.version


def index_path(model_dir: Path) -> Path:
    return Path(model_dir) / INDEX_FILE


def read_index(model_dir: Path) -> ModelIndex:
    """The index of `model_dir`; ModelIndexError (rule index_missing / index_invalid) otherwise."""
    path = index_path(model_dir)
    if not path.is_file():
        raise ModelIndexError(f"no model index at {path}: train and export a model, or point "
                          "SCEHR_MODEL_DIR / --model-dir at a folder with index.json",
                          rule="index_missing")
    try:
        return ModelIndex.model_validate_json(path.read_text())
    except (OSError, ValidationError) as e:
        raise ModelIndexError(f"{path} is not a valid model index: {e}",
                          rule="index_invalid") from e


def read_index_or_empty(model_dir: Path) -> ModelIndex:
    """The index, or an empty one when there is no file yet (export's first model)."""
    return read_index(model_dir) if index_path(model_dir).is_file() else ModelIndex()


def write_index(model_dir: Path, index: ModelIndex) -> None:
    """Write the index (entries without their unset fields) atomically: a temporary file in
    the same folder, then a rename over index.json."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    data = index.model_dump(mode="json", exclude_none=True)
    if not data.get("default_since"):
        data.pop("default_since", None)  # an index that never had one reads back identically
    fd, tmp = tempfile.mkstemp(dir=model_dir, prefix=".index.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, index_path(model_dir))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def refuse_existing(model_dir: Path, task: str, version: str, folder: Path) -> None:
    """Raise if `task` `version` is already in the index or its folder holds a model."""
    index = read_index_or_empty(model_dir)
    if index.entry(task, version) is not None:
        raise ModelIndexError(f"{task} {version} is already in {index_path(model_dir)}: versions "
                              "are immutable; export under a new version", rule="version_exists")
    if (Path(folder) / "manifest.json").exists() or (Path(folder) / "model.onnx").exists():
        raise ModelIndexError(f"{folder} already holds a model: versions are immutable; export "
                              "under a new version", rule="version_exists")


def add_model(model_dir: Path, entry: IndexEntry, *, set_default: bool) -> list[str]:
    """Register a new version; the default moves only when asked or when the task has none."""
    index = read_index_or_empty(model_dir)
    if index.entry(entry.task, entry.version) is not None:
        raise ModelIndexError(f"{entry.task} {entry.version} is already in "
                              f"{index_path(model_dir)}: versions are immutable",
                              rule="version_exists")
    old = index.defaults.get(entry.task)
    index.upsert(entry, make_default=set_default)
    changes = [f"added {entry.task} {entry.version} ({entry.path})"]
    if index.defaults.get(entry.task) != old:
        index.default_since[entry.task] = _now()
        changes.append(f"default {entry.task}: {old or '(none)'} -> {entry.version}")
    else:
        changes.append(f"default {entry.task} stays {old} (use `scehr models set-default "
                       f"{entry.task} {entry.version}` to serve the new version)")
    write_index(model_dir, index)
    return changes


def import_model(model_dir: Path, folder: Path, *, set_default: bool) -> list[str]:
    """Copy a model folder built elsewhere (a scratch or CI build) into `model_dir` as
    `<task>/<version>/` and register it; returns what changed.

    The folder must carry a valid manifest whose ONNX sha256 matches its graph, so what is
    registered is exactly what was built; an existing version is refused (versions are
    immutable), and the copy lands under a temporary name first so a failure leaves nothing
    half-copied behind.
    """
    from scehr.schemas.manifest import ContractError, load_manifest, sha256_file

    folder = Path(folder)
    try:
        manifest = load_manifest(folder / "manifest.json")
    except ContractError as e:
        raise ModelIndexError(str(e), rule="manifest_invalid") from e
    graph = folder / manifest.onnx.file
    if not graph.is_file() or sha256_file(graph) != manifest.onnx.sha256:
        raise ModelIndexError(f"{graph} is missing or its sha256 differs from the manifest's",
                              rule="sha256_mismatch")
    dest = Path(model_dir) / manifest.task / manifest.version
    refuse_existing(model_dir, manifest.task, manifest.version, dest)
    if dest.exists():
        raise ModelIndexError(f"{dest} exists: versions are immutable", rule="version_exists")
    staging = dest.with_name(f".{dest.name}.importing")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(folder, staging)
    staging.rename(dest)
    return [f"copied {folder} -> {dest}",
            *add_model(model_dir, entry_for(dest, model_dir, manifest), set_default=set_default)]


def set_default(model_dir: Path, task: str, version: str) -> str:
    """Make `version` the default of `task`; returns what changed."""
    index = read_index(model_dir)
    if index.entry(task, version) is None:
        known = sorted(e.version for e in index.models if e.task == task)
        raise ModelIndexError(f"no {task} {version} in {index_path(model_dir)}; versions: "
                              f"{', '.join(known) or '(none)'}", rule="model_not_found")
    old = index.defaults.get(task)
    if old == version:
        return f"default {task} is already {version} (since {index.default_since.get(task, '?')})"
    index.defaults[task] = version
    index.default_since[task] = _now()
    write_index(model_dir, index)
    return f"default {task}: {old or '(none)'} -> {version}"


def remove_model(model_dir: Path, task: str, version: str) -> tuple[str, Path]:
    """Drop a non-default version from the index; returns the message and its folder."""
    index = read_index(model_dir)
    entry = index.entry(task, version)
    if entry is None:
        raise ModelIndexError(f"no {task} {version} in {index_path(model_dir)}",
                              rule="model_not_found")
    if index.defaults.get(task) == version:
        raise ModelIndexError(f"{task} {version} is the default: set another default first "
                              f"(`scehr models set-default {task} VERSION`)",
                              rule="default_not_removable")
    index.models.remove(entry)
    write_index(model_dir, index)
    return f"removed {task} {version} from the index", Path(model_dir) / entry.path


#: The site figures an index entry of a site model shows (`scehr.schemas.site.SiteFigures`).
SITE_METRICS = ("auroc", "auprc", "ece", "coverage", "coverage_with_outcome")


def entry_for(folder: Path, root: Path, manifest: Any) -> IndexEntry:
    """The index entry of an exported model (manifest: schemas.manifest.Manifest): its test
    metrics, or for a site model the site's held-out figures, with `metrics_on` saying so
    (its parent's test metrics are not its own)."""
    from scehr.schemas.site import site_record

    site = site_record(manifest.metrics)
    extra: dict[str, Any] = {}
    if site is None:
        test_ci = manifest.metrics.get("test_ci", {})
    else:
        fig = site.figures.model_dump()
        test_ci = {k: fig[k] for k in SITE_METRICS if fig.get(k)}
        extra["metrics_on"] = (f"site held-out part of {site.provenance.data}: "
                               f"{fig['scored']} scored stays, {fig['positives']} with the "
                               "outcome")
    return IndexEntry(
        task=manifest.task, version=manifest.version, name=manifest.name,
        path=Path(folder).resolve().relative_to(Path(root).resolve()).as_posix(),
        loss=manifest.loss.name, encoder=manifest.encoder.name,
        feature_set=manifest.feature_set["name"],
        metrics={k: MetricCI(**{kk: test_ci[k].get(kk) for kk in ("value", "low", "high")})
                 for k in test_ci}, **extra)


#: Manifest keys that differ between two builds of the same model by design.
BUILD_STAMPS = ("created_at", "code_version")

#: The run folder a build trained in appears in the manifest's notes ("trained by: scehr train
#: --config <run>/config.json"); where the run folder was is a build stamp too, not the model.
_RUN_FOLDER = re.compile(r"--config \S+/config\.json")


def _without_run_folder(notes: Any) -> Any:
    return ([_RUN_FOLDER.sub("--config <run>/config.json", n) if isinstance(n, str) else n
             for n in notes] if isinstance(notes, list) else notes)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def _short(v: Any, limit: int = 80) -> str:
    text = json.dumps(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare_models(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(differences, notes) between two model folders: the ONNX file's sha256, then every
    manifest field (metrics included) by its dotted path; build stamps are notes only."""
    a, b = Path(a), Path(b)
    ma = json.loads((a / "manifest.json").read_text())
    mb = json.loads((b / "manifest.json").read_text())
    diffs: list[str] = []
    for name in sorted({ma.get("onnx", {}).get("file", "model.onnx"),
                        mb.get("onnx", {}).get("file", "model.onnx")}):
        ha, hb = (hashlib.sha256((f / name).read_bytes()).hexdigest() for f in (a, b))
        if ha != hb:
            diffs.append(f"{name}: sha256 {ha[:16]}... != {hb[:16]}...")
    fa, fb = _flatten(ma), _flatten(mb)
    notes = [f"{k}: {_short(fa.get(k))} vs {_short(fb.get(k))}" for k in BUILD_STAMPS
             if fa.get(k) != fb.get(k)]
    if fa.get("notes") != fb.get("notes") and \
            _without_run_folder(fa.get("notes")) == _without_run_folder(fb.get("notes")):
        notes.append(f"notes: trained in another run folder ({_short(fa.get('notes'), 60)} vs "
                     f"{_short(fb.get('notes'), 60)})")
        fb["notes"] = fa.get("notes")
    for k in sorted(set(fa) | set(fb)):
        if k in BUILD_STAMPS or fa.get(k) == fb.get(k):
            continue
        diffs.append(f"manifest {k}: {_short(fa.get(k, '(absent)'))} != "
                     f"{_short(fb.get(k, '(absent)'))}")
    return diffs, notes
