"""Training data that streams: each split is read from disk batch by batch, never whole.

For `TrainConfig.stream`, `fit.prepare` indexes each split of a benchmark-layout dataset from
its listfile (`index_split`: stay, labels, demographics, window length, a few numbers per
stay), and `stream_splits` fits the normalizer, the static imputer and the coverage on the
training split in one streaming pass and hands the training loop `StreamedSplit`s in place of
in-memory `TensorSplit`s. A batch is read with the reader and tensorizer `load_split` uses and
normalised as the in-memory path does, so its tensors are the same. Memory: the batches in
flight plus at most `cache_stays` cached stays per split. `workers` DataLoader processes read
an epoch's batches ahead, in the order the seed drew them; `shard(rank, world_size)` gives one
process of a distributed run its part of the stays.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Normalizer, Observations, StaticImputer
from scehr.training.data.layout import task_dir, task_name
from scehr.training.data.reader import (
    SplitSpec,
    label_names,
    labels,
    read_demographics,
    resolve_split,
)
from scehr.training.data.splits import StayTensors, _end_hours, tensorize_stays

#: Stays read per step of the statistics pass.
STATS_CHUNK_STAYS = 512
#: Stays read at a time into one batch: bounds the working memory of reading a batch.
READ_CHUNK_STAYS = 128


@dataclass
class StayIndex:
    """One split's stays without their time series: where each is, its labels, static values
    and window length. Everything here is O(stays); the time series stay on disk."""

    task: str
    split: str
    fs: FeatureSet
    spec: SplitSpec
    y: np.ndarray  # [N, C] float32
    static_raw: np.ndarray  # [N, len(STATIC_FIELDS)] float64, NaN = missing
    end_hours: np.ndarray  # [N] float64
    lengths: np.ndarray  # [N] int64
    label_names: tuple[str, ...]
    #: Time steps of the split as `load_split` pads it (its longest stay when indexed); kept
    #: by `subset`, as a cut of an in-memory split keeps its tensor's width.
    width: int = 1

    def __len__(self) -> int:
        return len(self.spec.table)

    @property
    def stays(self) -> np.ndarray:
        return self.spec.table["stay"].astype(str).to_numpy()

    @property
    def split_source(self) -> str:
        return self.spec.source

    def subset(self, index: np.ndarray) -> StayIndex:
        """The stays at `index` (indices or a boolean mask), in that order."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        spec = replace(self.spec, table=self.spec.table.iloc[index].reset_index(drop=True))
        return replace(self, spec=spec, y=self.y[index], static_raw=self.static_raw[index],
                       end_hours=self.end_hours[index], lengths=self.lengths[index])

    def read(self, rows: np.ndarray) -> StayTensors:
        """The stays at `rows` as un-normalised tensors (`splits.tensorize_stays`)."""
        part = self.subset(rows)
        paths = [self.spec.files_dir / s for s in part.stays]
        return tensorize_stays(self.task, self.fs, part.spec, paths)


def index_split(root: str | Path, task: str, split: str, fs: FeatureSet, *, seed: int = 0,
                val_fraction: float = 0.15) -> StayIndex:
    """The index of `split` of a benchmark-layout dataset: the split `load_split` reads (same
    listfile rules, same seeded fallback), without reading any time series."""
    task = task_name(task)
    if fs.window_hours is None and not task_spec(task).ends_at_period_length:
        raise ValueError(f"cannot stream {task} with feature set {fs.name}: a stay's window "
                         "would end at its last observation, which only reading it tells")
    spec = resolve_split(task_dir(root, task), task, split, seed=seed,
                         val_fraction=val_fraction)
    n = len(spec.table)
    none = Observations(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), n)
    end = _end_hours(task, fs, spec, none)  # from the window or the listfile's period_length
    stays = spec.table["stay"].astype(str).tolist()
    lengths = np.maximum(fs.n_bins(end), 1).astype(np.int64)
    return StayIndex(task, split, fs, spec, labels(spec.table, task),
                     read_demographics(spec.demographics, stays), end, lengths,
                     label_names(spec.table, task), int(lengths.max()) if n else 1)


@dataclass
class Moments:
    """Count, mean and sum of squared deviations per column, merged chunk by chunk (Chan,
    Golub and LeVeque's pairwise update): the mean and population std of every row added,
    as `Normalizer.fit` computes them in memory, to float64 rounding."""

    n: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, k: int) -> Moments:
        return cls(0, np.zeros(k), np.zeros(k))

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        n_b = len(rows)
        mean_b = rows.mean(axis=0)
        m2_b = ((rows - mean_b) ** 2).sum(axis=0)
        total = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / total)
        self.m2 = self.m2 + m2_b + delta**2 * (self.n * n_b / total)
        self.n = total

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.n, 1))


@dataclass
class TrainStatistics:
    """What is fitted on the training split's time series, from one streaming pass."""

    normalizer: Normalizer
    coverage: np.ndarray  # [channels] share of stays with the channel observed


def fit_statistics(index: StayIndex, *, from_masks: bool,
                   chunk_stays: int = STATS_CHUNK_STAYS) -> TrainStatistics:
    """The normalizer and channel coverage of `index`'s stays, read `chunk_stays` at a time.

    Coverage is counted as the in-memory path counts it: over the tensor's masks for a split
    cut by `fit.hold_out` (`SplitArrays.subset`, `from_masks`), else over the observations in
    each stay's window (`load_split`)."""
    fs = index.fs
    cols = fs.continuous_columns
    moments = Moments.empty(len(cols))
    seen = np.zeros(fs.n_channels, dtype=np.int64)
    for k in range(0, len(index), chunk_stays):
        t = index.read(np.arange(k, min(k + chunk_stays, len(index))))
        valid = np.arange(t.x.shape[1])[None, :] < t.lengths[:, None]
        moments.add(t.x[valid][:, cols].astype(np.float64))
        if from_masks:
            seen += t.x[..., fs.n_value_columns:].max(axis=1).sum(axis=0).astype(np.int64)
        else:
            obs = t.obs.take(t.in_window)
            hit = np.zeros((obs.n_stays, fs.n_channels), dtype=bool)
            hit[obs.stay, obs.channel] = True
            seen += hit.sum(axis=0)
    n = max(len(index), 1)
    # masks: the float32 mean `SplitArrays.subset` takes; observations: a float64 mean
    cov = ((seen.astype(np.float32) / np.float32(n)).astype(np.float64) if from_masks
           else seen / n)
    return TrainStatistics(Normalizer.of(cols, moments.mean, moments.std), cov)


def read_normalised(index: StayIndex, norm: Normalizer, rows: np.ndarray,
                    chunk_stays: int = READ_CHUNK_STAYS) -> Tensor:
    """[len(rows), longest of them, F] normalised stays, zero after each one's length.

    Read `chunk_stays` at a time: the working memory of reading (text, parsed cells,
    observations) is that of a chunk, whatever the batch (prediction asks for 1,024 stays)."""
    rows = np.asarray(rows, dtype=np.int64)
    longest = int(index.lengths[rows].max()) if len(rows) else 1
    out = torch.zeros((len(rows), longest, index.fs.n_features), dtype=torch.float32)
    for k in range(0, len(rows), chunk_stays):
        t = index.read(rows[k : k + chunk_stays])
        x = norm.transform(t.x, t.lengths)
        out[k : k + len(x), : x.shape[1]] = torch.from_numpy(x)
    return out


class StayCache:
    """At most `capacity` stays' tensors, the least recently used dropped first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[int, Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: int) -> Tensor | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: int, value: Tensor) -> None:
        if self.capacity <= 0:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


class _BatchReader(Dataset[np.ndarray]):
    """What a loader worker runs: a batch of row indices -> its normalised array. It holds
    no cache, so the memory of a worker is the batches it has read ahead. Arrays, not tensors,
    travel both ways: pickled through the pipe rather than moved to shared memory, which torch
    would still be tracking when the interpreter exits."""

    def __init__(self, index: StayIndex, norm: Normalizer) -> None:
        self.index, self.norm = index, norm

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        return read_normalised(self.index, self.norm, rows).numpy()


def _as_read(batch: np.ndarray) -> np.ndarray:
    """The loader's collate step: the batch as the worker read it (no conversion)."""
    return batch


class StreamedSplit:
    """A split the training loop reads like `fit.TensorSplit` (lengths, static, y and stays
    in memory; `batch(idx)` gives the same tensors), whose time series are read on demand."""

    def __init__(self, index: StayIndex, norm: Normalizer, imp: StaticImputer, *,
                 workers: int = 0, cache_stays: int = 0) -> None:
        self.index, self.norm, self.imp = index, norm, imp
        self.workers = workers
        self.lengths = torch.from_numpy(index.lengths.astype(np.int64))
        self.static = torch.from_numpy(imp.transform(index.static_raw))
        self.y = torch.from_numpy(index.y.astype(np.float32))
        self.stays = index.stays.tolist()
        self.cache = StayCache(cache_stays)
        self._plan: deque[Tensor] = deque()
        self._ahead: Iterator[Tensor] | None = None

    def __len__(self) -> int:
        return len(self.index)

    @property
    def n_features(self) -> int:
        return self.index.fs.n_features

    @property
    def width(self) -> int:
        """Time steps of the split's in-memory tensor (`fit.TensorSplit.width`)."""
        return self.index.width

    def subset(self, idx: Tensor | np.ndarray) -> StreamedSplit:
        rows = idx.numpy() if isinstance(idx, Tensor) else np.asarray(idx)
        return StreamedSplit(self.index.subset(rows), self.norm, self.imp,
                             workers=self.workers, cache_stays=self.cache.capacity)

    def shard(self, rank: int, world_size: int) -> StreamedSplit:
        """Rank `rank`'s part of the stays (every `world_size`-th, from `rank`): the parts of
        the ranks are disjoint and together hold every stay once."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), not {rank}")
        return self.subset(np.arange(rank, len(self), world_size))

    def prefetch(self, batches: list[Tensor]) -> None:
        """Start `workers` loader processes reading `batches` in this order (no-op without
        workers); `batch` then takes each from them when asked for it in the same order."""
        self._plan, self._ahead = deque(), None
        if self.workers <= 0 or not batches:
            return
        self._plan = deque(batches)
        # its own generator: the loader's worker seed must not draw from the global RNG, which
        # the training step's dropout draws from (workers or not, the same run)
        rows = [b.numpy() for b in batches]
        self._ahead = iter(DataLoader(_BatchReader(self.index, self.norm), sampler=rows,
                                      batch_size=None, num_workers=self.workers,
                                      collate_fn=_as_read,
                                      generator=torch.Generator().manual_seed(0)))

    def batch(self, idx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(x, lengths, static, y) of the stays at `idx`, x trimmed to the longest of them."""
        x = self._planned(idx)
        if x is None:
            x = self._read(idx)
        return x, self.lengths[idx], self.static[idx], self.y[idx]

    def _planned(self, idx: Tensor) -> Tensor | None:
        if not self._plan or self._ahead is None:
            return None
        if not torch.equal(self._plan[0], idx):  # asked out of plan: read it here instead
            self._plan, self._ahead = deque(), None
            return None
        self._plan.popleft()
        x = torch.from_numpy(next(self._ahead))
        if not self._plan:
            self._ahead = None
        return x

    def _read(self, idx: Tensor) -> Tensor:
        rows = idx.tolist()
        got = {r: t for r in rows if (t := self.cache.get(r)) is not None}
        missing = sorted(set(rows) - set(got))
        if missing:
            fresh = read_normalised(self.index, self.norm, np.asarray(missing))
            for k, r in enumerate(missing):
                got[r] = fresh[k, : int(self.lengths[r])].clone()  # not a view of the batch
                self.cache.put(r, got[r])
        t = int(self.lengths[idx].max()) if len(rows) else 1
        x = torch.zeros((len(rows), t, self.n_features), dtype=torch.float32)
        for i, r in enumerate(rows):
            x[i, : len(got[r])] = got[r]
        return x


@dataclass
class StreamedData:
    """The splits of a streamed run and what was fitted on its training split."""

    splits: dict[str, StreamedSplit]
    normalizer: Normalizer
    static_imputer: StaticImputer
    coverage: dict[str, float]  # variable id -> share of training stays observing it


def stream_splits(raw: dict[str, StayIndex], workers: int, cache_stays: int, *,
                  from_masks: bool) -> StreamedData:
    """`fit.prepare`'s second half for a streamed run: the statistics of `raw["train"]` (the
    stays kept after the hold-outs) in one streaming pass, and every split streamed."""
    train = raw["train"]
    stats = fit_statistics(train, from_masks=from_masks)
    imp = StaticImputer.fit(train.static_raw)
    splits = {s: StreamedSplit(index, stats.normalizer, imp, workers=workers,
                               cache_stays=cache_stays) for s, index in raw.items()}
    cov = {v.id: float(c) for v, c in zip(train.fs.variables, stats.coverage, strict=True)}
    return StreamedData(splits, stats.normalizer, imp, cov)
