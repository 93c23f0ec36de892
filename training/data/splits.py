"""One split of a benchmark-layout dataset as in-memory arrays, cached as `.npz`.

Parsing thousands of CSVs each run would dominate training time, so the tensors of a split are
built once (tqdm progress) and saved under `<root>/.scehr-cache/` (or `$SCEHR_CACHE_DIR`), keyed
by the listfile bytes, every input file's size and mtime, the feature set and `CACHE_VERSION`.
Any change to those gives a new key; stale entries of the same split are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from scehr.schemas.featureset import TASK_FEATURE_SETS, FeatureSet
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Observations, coverage, discretize
from scehr.training.data.layout import cache_dir, task_dir, task_name
from scehr.training.data.reader import (
    ReadReport,
    SplitSpec,
    label_names,
    labels,
    read_demographics,
    read_timeseries,
    resolve_split,
)
from scehr.training.data.writer import _disable

#: Bump when anything that changes the cached arrays changes (reader, cleaning, layout).
CACHE_VERSION = "3"
#: Stays discretized per chunk: bounds the float64 working memory of `discretize`.
CHUNK_STAYS = 1024


@dataclass
class SplitArrays:
    """One split, ready for a model: un-normalised tensors, labels, static values, provenance."""

    task: str
    split: str
    x: np.ndarray  # [N, T, F] float32, values + masks (schemas.tensorize.discretize)
    lengths: np.ndarray  # [N] int64 valid time steps per stay
    y: np.ndarray  # [N, C] float32 (C = 1 mortality, 25 phenotypes)
    static_raw: np.ndarray  # [N, len(STATIC_FIELDS)] float64, NaN = missing
    stays: np.ndarray  # [N] str, the listfile's `stay` (timeseries file name)
    label_names: tuple[str, ...]
    coverage: np.ndarray  # [C_channels] share of stays with the channel observed in the window
    dropped: np.ndarray  # [C_channels] values dropped (implausible, outlier bounds, or not a
    #                      number/category)
    clipped: np.ndarray  # [C_channels] values clipped to the valid bounds
    end_hours: np.ndarray  # [N] float64 window end per stay (48 h, or period_length capped)
    feature_set: FeatureSet
    split_source: str = ""
    cache_path: Path | None = None
    from_cache: bool = False
    read_report: dict[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def prevalence(self) -> np.ndarray:
        """Positive share per label."""
        return self.y.mean(axis=0) if len(self) else np.zeros(self.y.shape[1])

    def subset(self, index: np.ndarray) -> SplitArrays:
        """The stays at `index` (indices or a boolean mask), e.g. to down-sample or hold out.

        Coverage is recomputed from the masks of the kept stays; `dropped`/`clipped` stay the
        counts of the whole split as read (they describe the source files).
        """
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        x = self.x[index]
        t = int(self.lengths[index].max()) if len(index) else 1
        x = x[:, :t]
        masks = x[..., self.feature_set.n_value_columns:]
        cov = masks.max(axis=1).mean(axis=0) if len(index) else np.zeros(masks.shape[-1])
        return replace(self, x=x, lengths=self.lengths[index], y=self.y[index],
                       static_raw=self.static_raw[index], stays=self.stays[index],
                       end_hours=self.end_hours[index], coverage=cov.astype(np.float64),
                       cache_path=None, from_cache=False)


def concat_splits(parts: list[SplitArrays], names: list[str]) -> SplitArrays:
    """One split made of several datasets' (same task and feature set): stays padded to the
    longest, each stay name prefixed by its dataset's name (`names`) so names stay unique."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for a in parts[1:]:
        if a.feature_set.sha256 != first.feature_set.sha256 or a.task != first.task:
            raise ValueError(f"cannot train on {first.split_source} and {a.split_source} "
                             "together: they differ in task or feature set")
    t = max(a.x.shape[1] for a in parts)
    x = np.concatenate([np.pad(a.x, ((0, 0), (0, t - a.x.shape[1]), (0, 0))) for a in parts])
    n = np.array([len(a) for a in parts], dtype=np.float64)
    cov = (np.stack([a.coverage for a in parts]) * n[:, None]).sum(axis=0) / max(n.sum(), 1)
    return replace(
        first, x=x, lengths=np.concatenate([a.lengths for a in parts]),
        y=np.concatenate([a.y for a in parts]),
        static_raw=np.concatenate([a.static_raw for a in parts]),
        stays=np.concatenate([np.char.add(f"{name}/", a.stays.astype(str))
                              for a, name in zip(parts, names, strict=True)]),
        end_hours=np.concatenate([a.end_hours for a in parts]), coverage=cov,
        dropped=sum(a.dropped for a in parts), clipped=sum(a.clipped for a in parts),
        split_source=" + ".join(a.split_source for a in parts), cache_path=None,
        from_cache=False, read_report={})


def load_split(root: str | Path, task: str, split: str = "train",
               feature_set: FeatureSet | None = None, *, cache: bool = True,
               progress: bool | None = None, seed: int = 0,
               val_fraction: float = 0.15) -> SplitArrays:
    """Load `split` ("train", "val" or "test") of `task` ("mortality" or "phenotypes").

    `root` is a benchmark-layout dataset folder (holding `in-hospital-mortality/` and/or
    `phenotyping/`) or a task folder itself. `feature_set` defaults to the task's benchmark set
    (48 h for mortality; whole stay capped at 240 h for phenotypes). `seed`/`val_fraction` only
    matter when the data carries no validation split of its own.
    """
    task = task_name(task)
    fs = feature_set or TASK_FEATURE_SETS[task]
    tdir = task_dir(root, task)
    spec = resolve_split(tdir, task, split, seed=seed, val_fraction=val_fraction)
    stays = spec.table["stay"].astype(str).tolist()
    paths = [spec.files_dir / s for s in stays]
    key = _cache_key(task, split, fs, spec, paths)
    path = cache_dir(Path(root).expanduser()) / f"{task}-{split}-{key[:20]}.npz" if cache else None
    if path is not None and path.is_file():
        try:
            return _load(path, fs)
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)
    arrays = _build(task, split, fs, spec, paths, progress)
    if path is not None:
        _save(path, arrays, tdir)
        arrays.cache_path = path
        for old in path.parent.glob(f"{task}-{split}-*.npz"):
            # another process's temporary file (`_save`) is half-written: never read or delete it
            if old != path and ".tmp" not in old.name and _same_source(old, tdir):
                old.unlink(missing_ok=True)
    return arrays


def _end_hours(task: str, fs: FeatureSet, spec: SplitSpec, obs: Observations) -> np.ndarray:
    n = obs.n_stays
    if fs.window_hours is not None:
        return np.full(n, fs.window_hours)
    if task_spec(task).ends_at_period_length:
        period = spec.table["period_length"].to_numpy(dtype=np.float64)
        return np.minimum(period, fs.max_hours)
    last = np.zeros(n)
    np.maximum.at(last, obs.stay, obs.time)
    return np.minimum(last, fs.max_hours)


@dataclass
class StayTensors:
    """The stays of a listfile table as un-normalised tensors, with what reading them found."""

    x: np.ndarray  # [N, T, F] float32
    lengths: np.ndarray  # [N] int64
    end_hours: np.ndarray  # [N] float64
    obs: Observations
    report: ReadReport

    @property
    def in_window(self) -> np.ndarray:
        """[n obs] whether each observation falls in its stay's window (coverage counts it)."""
        if not self.obs.n_stays:
            return np.zeros(0, dtype=bool)
        return self.obs.time <= self.end_hours[self.obs.stay] + 1e-6


def tensorize_stays(task: str, fs: FeatureSet, spec: SplitSpec, paths: list[Path],
                    progress: bool | None = False, desc: str = "") -> StayTensors:
    """Read and tensorize the stays of `spec.table` (stay i = paths[i]): the one reading path
    of a whole split (`load_split`) and of a batch of streamed stays (`data.streaming`)."""
    obs, report = read_timeseries(paths, fs, progress=progress, desc=f"{desc} read")
    end = _end_hours(task, fs, spec, obs)
    n = obs.n_stays
    lengths = np.maximum(fs.n_bins(end), 1) if n else np.zeros(0, dtype=np.int64)
    n_t = int(lengths.max()) if n else 1
    x = np.zeros((n, n_t, fs.n_features), dtype=np.float32)
    bounds = np.searchsorted(obs.stay, np.arange(0, n + CHUNK_STAYS, CHUNK_STAYS))
    for k in tqdm(range(0, n, CHUNK_STAYS), desc=f"{desc} tensorize", unit="chunk",
                  disable=_disable(progress), leave=False):
        b = min(k + CHUNK_STAYS, n)
        lo, hi = bounds[k // CHUNK_STAYS], bounds[k // CHUNK_STAYS + 1]
        part = Observations(obs.stay[lo:hi] - k, obs.channel[lo:hi], obs.time[lo:hi],
                            obs.value[lo:hi], b - k)
        xs, ls = discretize(part, fs, end[k:b])
        x[k:b, : xs.shape[1]] = xs
        lengths[k:b] = ls
    return StayTensors(x, lengths.astype(np.int64), end, obs, report)


def _build(task: str, split: str, fs: FeatureSet, spec: SplitSpec, paths: list[Path],
           progress: bool | None) -> SplitArrays:
    t = tensorize_stays(task, fs, spec, paths, progress, f"{task}/{split}")
    obs, report, x, lengths, end = t.obs, t.report, t.x, t.lengths, t.end_hours
    in_window = t.in_window
    stays = np.array([p.name for p in paths], dtype=str)
    return SplitArrays(
        task=task, split=split, x=x, lengths=lengths.astype(np.int64),
        y=labels(spec.table, task), static_raw=read_demographics(spec.demographics, stays),
        stays=stays, label_names=label_names(spec.table, task),
        coverage=coverage(obs.take(in_window), fs),
        dropped=report.dropped + report.invalid + _zeros_if_none(report.implausible),
        clipped=report.clipped, end_hours=end,
        feature_set=fs, split_source=spec.source, read_report=report.as_dict(fs),
    )


def _zeros_if_none(a: np.ndarray | None) -> np.ndarray | int:
    return 0 if a is None else a


def _cache_key(task: str, split: str, fs: FeatureSet, spec: SplitSpec,
               paths: list[Path]) -> str:
    h = hashlib.sha256()
    meta = {"version": CACHE_VERSION, "task": task, "split": split, "fs": fs.to_dict(),
            "source": spec.source}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for p in spec.inputs:
        h.update(p.read_bytes())
    h.update(spec.table.to_csv(index=False).encode())
    for p in [*paths, spec.demographics]:
        try:
            st = os.stat(p)
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except FileNotFoundError:
            h.update(f"{p.name}\0-\n".encode())
    return h.hexdigest()


def _save(path: Path, a: SplitArrays, tdir: Path) -> None:
    meta = {"task": a.task, "split": a.split, "label_names": list(a.label_names),
            "feature_set": a.feature_set.to_dict(), "split_source": a.split_source,
            "read_report": a.read_report, "task_dir": str(tdir.resolve())}
    tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
    with open(tmp, "wb") as f:
        np.savez(f, x=a.x, lengths=a.lengths, y=a.y, static_raw=a.static_raw, stays=a.stays,
                 coverage=a.coverage, dropped=a.dropped, clipped=a.clipped,
                 end_hours=a.end_hours, meta=np.array(json.dumps(meta)))
    os.replace(tmp, path)


def _load(path: Path, fs: FeatureSet) -> SplitArrays:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        return SplitArrays(
            task=meta["task"], split=meta["split"], x=z["x"], lengths=z["lengths"], y=z["y"],
            static_raw=z["static_raw"], stays=z["stays"],
            label_names=tuple(meta["label_names"]), coverage=z["coverage"],
            dropped=z["dropped"], clipped=z["clipped"], end_hours=z["end_hours"],
            feature_set=fs, split_source=meta["split_source"], cache_path=path,
            from_cache=True, read_report=meta["read_report"],
        )


def _same_source(path: Path, tdir: Path) -> bool:
    """Whether a cache file was built from `tdir` (a shared SCEHR_CACHE_DIR holds many)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return json.loads(str(z["meta"])).get("task_dir") == str(tdir.resolve())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return False
