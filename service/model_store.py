"""Where a task's model lives: the index (schemas.model_index) and folder resolution.

Every folder the service loads from is confined to the model directory.
"""

from __future__ import annotations

from pathlib import Path

from scehr.schemas import model_index
from scehr.schemas.model_index import ModelIndex
from scehr.service.load_errors import ModelLoadError


def read_index(model_dir: Path) -> ModelIndex:
    """The model directory's index; a ModelLoadError (HTTP 500 on reload) when absent or bad."""
    try:
        return model_index.read_index(model_dir)
    except model_index.ModelIndexError as e:
        raise ModelLoadError(str(e), rule=e.rule, status=500) from e


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
    e = index.entry(task, version)
    if e is not None:
        folder = (root / e.path).resolve()
        if not folder.is_relative_to(root):
            raise ModelLoadError(f"index path {e.path!r} is outside the model directory",
                                 rule="path_outside_model_dir", status=422)
        return folder
    folder = (root / task / version).resolve()
    if folder.is_relative_to(root) and (folder / "manifest.json").is_file():
        return folder
    raise ModelLoadError(f"no {task} model with version {version!r} in index.json",
                         rule="model_not_found", status=404)
