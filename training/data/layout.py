"""Where things live: the shared data folder, the mimic3-benchmarks task layout, the cache.

The mimic3-benchmarks output layout is `<root>/<task dir>/{train,test}/listfile.csv` plus one
`*_timeseries.csv` per stay beside it. After the benchmark's `split_train_val` step the task
folder also holds `train_listfile.csv`, `val_listfile.csv` and `test_listfile.csv`. Our
converters write the same files, plus `demographics.csv` beside each `listfile.csv`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scehr.schemas.tasks import MORTALITY, TASK_SPECS, task_spec

#: Task name (as the model contract spells it) -> the benchmark's folder name.
TASK_DIRS: dict[str, str] = {t.name: t.data_dir for t in TASK_SPECS.values()}
SPLITS: tuple[str, ...] = ("train", "val", "test")
#: Label name of the mortality task (one column of `y`).
MORTALITY_LABEL = MORTALITY.label_names[0]
DEMOGRAPHICS_FILE = "demographics.csv"
TIMESERIES_SUFFIX = "_timeseries.csv"


def task_name(task: str) -> str:
    """Canonical task name from any accepted spelling; raises ValueError naming the choices."""
    return task_spec(task).name


def repo_root() -> Path:
    """The repository root, found from this file (training/data/layout.py)."""
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The open data folder: `$SCEHR_DATA_DIR`, else `../shared/data` beside the repository."""
    env = os.environ.get("SCEHR_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return (repo_root().parent / "shared" / "data").resolve()


def ccs_definitions_path() -> Path:
    """The benchmark's HCUP CCS 2015 phenotype definitions inside the data folder."""
    return (data_dir() / "mimic3-benchmarks-resources" / "mimic3benchmark" / "resources"
            / "hcup_ccs_2015_definitions.yaml")


def benchmark_valset_path() -> Path:
    """The benchmark's own validation split of MIMIC-III subject ids (`valset.csv`)."""
    return (data_dir() / "mimic3-benchmarks-resources" / "mimic3models" / "resources"
            / "valset.csv")


def task_dir(root: str | Path, task: str) -> Path:
    """The task folder under `root`; `root` may also be the task folder itself.

    Raises FileNotFoundError naming the path and the layout that was expected.
    """
    root = Path(root).expanduser()
    name = TASK_DIRS[task_name(task)]
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist (expected a dataset folder holding "
                                f"{name}/train/listfile.csv and {name}/test/listfile.csv)")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder (expected a dataset folder holding "
                                 f"{name}/train/listfile.csv)")
    for cand in (root / name, root):
        if any((cand / part / "listfile.csv").is_file() for part in ("train", "test")):
            return cand
    raise FileNotFoundError(
        f"no {name} data under {root}: expected {root / name}/train/listfile.csv and "
        f"{root / name}/test/listfile.csv (mimic3-benchmarks layout), or {root} to be that "
        "task folder itself"
    )


def require_source_files(src: Path, names: Sequence[str], what: str) -> None:
    """FileNotFoundError unless `src` is a folder holding every file in `names`, naming the
    files missing and those expected (`what`: the source's name, e.g. "eICU demo")."""
    if not src.is_dir():
        raise FileNotFoundError(f"{what} source folder not found: {src} (expected a folder "
                                f"holding {', '.join(names)})")
    missing = [n for n in names if not (src / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{src} lacks the {what} source files {', '.join(missing)} "
                                f"(expected {', '.join(names)})")


def available_tasks(root: str | Path) -> list[str]:
    """Tasks whose benchmark folders exist under `root` (or `root` is such a folder)."""
    out = []
    for task in TASK_DIRS:
        try:
            task_dir(root, task)
        except (FileNotFoundError, NotADirectoryError):
            continue
        out.append(task)
    return out


def cache_dir(root: Path) -> Path:
    """`$SCEHR_CACHE_DIR`, else `<root>/.scehr-cache`, else a temp folder if root is read-only."""
    env = os.environ.get("SCEHR_CACHE_DIR")
    if env:
        path = Path(env).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = root / ".scehr-cache"
    try:
        path.mkdir(exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    path = Path(tempfile.gettempdir()) / "scehr-cache"
    path.mkdir(exist_ok=True)
    return path


def subject_of(stay: str) -> str:
    """Subject id from a benchmark stay file name (`<subject_id>_episode<k>_timeseries.csv`)."""
    i = stay.find("_")
    return stay if i < 0 else stay[:i]


def split_groups(groups: np.ndarray, fraction: float, seed: int,
                 labels: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of rows whose group falls in a seeded `fraction` of the groups.

    Groups are patients, so all stays of one patient land on the same side. With `labels` (one
    binary label per row, used when each group is one row) the split is stratified so that the
    held-out part keeps the prevalence.
    """
    groups = np.asarray(groups).astype(str)
    rng = np.random.default_rng(seed)
    uniq = np.unique(groups)
    if labels is not None and len(uniq) == len(groups):
        labels = np.asarray(labels)
        held = np.zeros(len(groups), dtype=bool)
        for value in np.unique(labels):
            idx = np.flatnonzero(labels == value)
            idx = idx[np.argsort(groups[idx], kind="stable")]
            k = round(fraction * len(idx))
            held[rng.permutation(idx)[:k]] = True
        return held
    k = round(fraction * len(uniq))
    chosen = set(rng.permutation(uniq)[:k].tolist())
    return np.fromiter((g in chosen for g in groups), dtype=bool, count=len(groups))
