"""`models/index.json`, the hand-over between export (writes) and the service (reads).

One module reads and writes it, so the file has one schema: a default version per task and a
list of entries, each pointing at a `<task>/<version>/` folder under the index's directory.
Unknown keys are kept (extra="allow") so an older reader still loads a newer index.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

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
    models: list[IndexEntry] = []

    def entry(self, task: str, version: str) -> IndexEntry | None:
        return next((e for e in self.models if e.task == task and e.version == version), None)

    def upsert(self, entry: IndexEntry, make_default: bool = False) -> None:
        """Add or replace the (task, version) entry; the first model of a task is its default."""
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
    """Write the index (entries without their unset fields), the way export always has."""
    index_path(model_dir).write_text(
        json.dumps(index.model_dump(mode="json", exclude_none=True), indent=2) + "\n")
