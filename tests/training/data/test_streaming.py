"""Streamed training data (training/data/streaming.py): the same tensors, labels and fitted
statistics as the in-memory path, a cache that never outgrows its setting, loader workers that
read the same epoch, shards that partition the stays, and a streamed run that trains to the
same weights. Synthetic data; the demo test needs ../shared/data (skipped without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from scehr import cli as scehr_cli
from scehr.schemas.tensorize import Normalizer
from scehr.training.config import TrainConfig, load_config
from scehr.training.data.streaming import (
    StreamedSplit,
    fit_statistics,
    index_split,
    read_normalised,
)
from scehr.training.data.synthetic import write_synthetic
from scehr.training.fit import Prepared, fit, prepare
from scehr.training.landmark import predict_hours
from scehr.training.losses import REGULARIZERS
from tests.conftest import REPO, SHARED_DATA, needs_shared_data

SPLITS = ("train", "val", "test", "calib")


@pytest.fixture(scope="module", params=["mortality", "phenotypes"])
def dataset(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    task = request.param
    root = write_synthetic(tmp_path_factory.mktemp(f"stream-{task}"), task, n_train=160,
                           n_test=40, prevalence=0.3, seed=3)
    return task, root


def both(task: str, root: Path, **kw: object) -> tuple[Prepared, Prepared]:
    base = dict(task=task, data=str(root), progress=False, **kw)
    return prepare(TrainConfig(**base)), prepare(TrainConfig(**base, stream=True,
                                                             cache_stays=16))


def assert_same_batches(a: object, b: StreamedSplit, batches: list[torch.Tensor]) -> None:
    for idx in batches:
        for p, q in zip(a.batch(idx), b.batch(idx), strict=True):  # type: ignore[attr-defined]
            assert p.shape == q.shape
            assert torch.equal(p, q)


@pytest.mark.parametrize("calibration", [0.1, 0.0])
def test_streamed_splits_equal_the_in_memory_ones(dataset: tuple[str, Path],
                                                  calibration: float) -> None:
    task, root = dataset
    mem, streamed = both(task, root, calibration_fraction=calibration)
    assert mem.normalizer.to_dict() == streamed.normalizer.to_dict()
    assert mem.static_imputer.to_dict() == streamed.static_imputer.to_dict()
    assert mem.coverage == streamed.coverage
    assert mem.label_names == streamed.label_names
    for s in SPLITS:
        a, b = getattr(mem, s), getattr(streamed, s)
        if a is None:
            assert b is None and calibration == 0
            continue
        assert isinstance(b, StreamedSplit)
        assert a.stays == b.stays
        assert torch.equal(a.y, b.y) and torch.equal(a.lengths, b.lengths)
        gen = torch.Generator().manual_seed(1)
        assert_same_batches(a, b, list(torch.randperm(len(a), generator=gen).split(13)))
        assert np.array_equal(mem.raw[s].static_raw, streamed.raw[s].static_raw,
                              equal_nan=True)


def test_statistics_in_small_chunks_equal_the_in_memory_fit(dataset: tuple[str, Path]) -> None:
    task, root = dataset
    cfg = TrainConfig(task=task, data=str(root), progress=False)
    fs = cfg.features()
    index = index_split(root, task, "train", fs)
    stats = fit_statistics(index, from_masks=False, chunk_stays=7)  # 23 chunks merged
    mem = prepare(TrainConfig(task=task, data=str(root), progress=False,
                              calibration_fraction=0.0))
    t = index.read(np.arange(len(index)))
    ref = Normalizer.fit(t.x, t.lengths, fs)
    np.testing.assert_allclose(stats.normalizer.means, ref.means, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.normalizer.stds, ref.stds, rtol=1e-12)
    assert np.array_equal(stats.normalizer.columns, ref.columns)
    assert [mem.coverage[v.id] for v in fs.variables] == stats.coverage.tolist()


def test_a_batch_read_in_chunks_is_the_batch_read_at_once(dataset: tuple[str, Path]) -> None:
    task, root = dataset
    mem, streamed = both(task, root)
    rows = torch.randperm(len(mem.train), generator=torch.Generator().manual_seed(5))[:61]
    x = mem.train.batch(rows)[0]
    for chunk in (1, 7, 61):
        got = read_normalised(streamed.train.index, streamed.normalizer, rows.numpy(), chunk)
        assert torch.equal(got, x)


def test_the_cache_never_holds_more_stays_than_its_setting(dataset: tuple[str, Path]) -> None:
    task, root = dataset
    _, streamed = both(task, root)
    train = streamed.train
    assert train.cache.capacity == 16
    seen: set[int] = set()
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):  # two epochs: the second reads stays the cache dropped
        for idx in torch.randperm(len(train), generator=gen).split(10):
            train.batch(idx)
            seen.update(idx.tolist())
            assert len(train.cache) == min(16, len(seen))
    empty = StreamedSplit(train.index, train.norm, train.imp, cache_stays=0)
    empty.batch(torch.arange(10))
    assert len(empty.cache) == 0


def test_workers_read_the_epoch_in_its_order(dataset: tuple[str, Path]) -> None:
    task, root = dataset
    mem, streamed = both(task, root)
    pooled = StreamedSplit(streamed.train.index, streamed.normalizer, streamed.static_imputer,
                           workers=2, cache_stays=16)
    batches = list(torch.randperm(len(pooled), generator=torch.Generator().manual_seed(4))
                   .split(32))
    pooled.prefetch(batches)
    assert_same_batches(mem.train, pooled, batches)
    assert not pooled._plan  # every batch came from the workers ...
    assert len(pooled.cache) == 0  # ... none was read (and cached) by this process
    assert sorted(torch.cat(batches).tolist()) == list(range(len(pooled)))


def test_shards_partition_the_stays(dataset: tuple[str, Path]) -> None:
    task, root = dataset
    mem, streamed = both(task, root)
    train, world = streamed.train, 3
    shards = [train.shard(rank, world) for rank in range(world)]
    names = [set(s.stays) for s in shards]
    assert sum(len(s) for s in names) == len(train)
    assert set().union(*names) == set(train.stays)
    assert all(not (names[i] & names[j]) for i in range(world) for j in range(i + 1, world))
    for rank, shard in enumerate(shards):
        rows = torch.arange(rank, len(train), world)
        assert shard.stays == [train.stays[i] for i in rows.tolist()]
        assert_same_batches(mem.train.subset(rows), shard, [torch.arange(len(shard))])
    with pytest.raises(ValueError, match="rank must be in"):
        train.shard(3, 3)


def test_a_streamed_run_trains_to_the_same_weights(tmp_path: Path,
                                                   dataset: tuple[str, Path]) -> None:
    """Loader workers must not draw from the training RNG (dropout): same weights with them."""
    task, root = dataset
    kw = dict(task=task, data=str(root), encoder="lstm", progress=False, batch_size=32,
              epochs=2, seed=0, threads=1,
              encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                               "dropout": 0.3, "static": True})
    weights = []
    for extra in ({}, {"stream": True, "workers": 2, "cache_stays": 8}):
        cfg = TrainConfig(**kw, **extra)
        res = fit(cfg, prepare(cfg), echo=False)
        weights.append(res.model.state_dict())
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


def test_the_mortality_recipe_with_whole_split_regularizers_streams_to_the_same_weights(
        tmp_path: Path) -> None:
    """The shipped mortality recipe (CSCE + λ·SCR, its encoder and features) with the
    regularizers that need the whole training split: attribute-kNN positives and the debiased
    prior (every stay's summary, read in one streaming pass), feature-kNN positives (every
    epoch's embeddings). Streamed, with a loader worker, it trains to the in-memory weights."""
    root = write_synthetic(tmp_path / "data", "mortality", n_train=160, n_test=40,
                           prevalence=0.3, seed=3)
    regularizers = {"supcon_knn_attribute": {"weight": 0.01, "k": 3},
                    "supcon_knn_feature": {"weight": 0.01, "k": 3},
                    "debiased_supcon": {"weight": 0.01, "queue_size": 64}}
    weights = []
    for extra in ({}, {"stream": True, "workers": 1, "cache_stays": 8}):
        cfg = load_config(REPO / "configs" / "default_mortality_full.toml",
                          regularizers=regularizers, data=str(root), epochs=2, progress=False,
                          **extra)
        assert cfg.loss == "csce" and cfg.lam > 0
        res = fit(cfg, prepare(cfg), echo=False)
        weights.append(res.model.state_dict())
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


@pytest.mark.parametrize("name", [n for n in REGULARIZERS if n != "scr"])  # SCR: by `lam`
def test_every_regularizer_streams_to_the_same_weights(tmp_path: Path, name: str) -> None:
    root = write_synthetic(tmp_path / "data", "phenotypes", n_train=120, n_test=30,
                           prevalence=0.3, seed=3)
    kw = dict(task="phenotypes", data=str(root), encoder="lstm", progress=False, batch_size=32,
              epochs=1, seed=0, threads=1, regularizers={name: {"weight": 0.05}},
              encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                               "dropout": 0.3, "static": True})
    weights = []
    for extra in ({}, {"stream": True, "cache_stays": 8}):
        cfg = TrainConfig(**kw, **extra)
        weights.append(fit(cfg, prepare(cfg), echo=False).model.state_dict())
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key


def test_a_streamed_landmark_run_trains_and_predicts_every_hour_the_same(tmp_path: Path) -> None:
    """A landmark task reads every hour's outputs of a split at the width of its in-memory
    tensor; streamed, the split has that width too (it had none: the run stopped)."""
    root = write_synthetic(tmp_path / "data", "mortality", n_train=160, n_test=40,
                           prevalence=0.3, seed=3)
    kw = dict(task="mortality-landmark", data=str(root), encoder="causal_sumlstm",
              encoder_hparams={"units": 4, "summary_dim": 4}, loss="csce", lam=0.007,
              batch_size=32, epochs=1, seed=0, threads=1, progress=False,
              landmark={"hours_per_batch": 4})
    runs = []
    for extra in ({}, {"stream": True, "cache_stays": 8}):
        cfg = TrainConfig(**kw, **extra)
        data = prepare(cfg)
        res = fit(cfg, data, echo=False)
        runs.append((res.model, res, data))
    (m0, r0, d0), (m1, r1, d1) = runs
    assert d0.train.width == d1.train.width and d0.val.width == d1.val.width
    for name, value in m0.state_dict().items():
        assert torch.equal(value, m1.state_dict()[name]), name
    a, b = (predict_hours(m, r.criterion, d.val) for m, r, d in ((m0, r0, d0), (m1, r1, d1)))
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def test_stream_settings_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="workers and cache_stays must be >= 0"):
        TrainConfig(stream=True, workers=-1)
    with pytest.raises(ValueError, match="extra_data must be empty with stream"):
        TrainConfig(stream=True, extra_data=["elsewhere"])
    for option in ("--workers", "--cache-stays"):
        with pytest.raises(SystemExit) as e:
            scehr_cli.main(["train", "--stream", option, "-1"])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert f"{option}: -1 must be >= 0" in err[-1]


@needs_shared_data
def test_the_extracted_demo_streams_as_it_loads(tmp_path: Path) -> None:
    """Real files (blank cells, categories, stays of every length) through both paths."""
    from scehr.training.data.mimic3.pipeline import extract

    extract(SHARED_DATA / "mimic3-demo", tmp_path / "demo", progress=lambda _s: None)
    for task in ("mortality", "phenotypes"):
        mem, streamed = both(task, tmp_path / "demo")
        assert mem.normalizer.to_dict() == streamed.normalizer.to_dict()
        assert mem.coverage == streamed.coverage
        for s in SPLITS:
            a, b = getattr(mem, s), getattr(streamed, s)
            assert a.stays == b.stays
            assert_same_batches(a, b, list(torch.arange(len(a)).split(8)))
