"""Training batches: plain shuffles for fixed windows, length buckets for whole stays."""

from __future__ import annotations

import torch

from scehr.training.config import TrainConfig
from scehr.training.fit import TensorSplit, make_batches


def _split(lengths: list[int]) -> TensorSplit:
    n, t = len(lengths), max(lengths)
    return TensorSplit(torch.zeros(n, t, 1), torch.tensor(lengths), torch.zeros(n, 0),
                       torch.zeros(n, 1), [str(i) for i in range(n)])


def _padded_steps(split: TensorSplit, batches: list[torch.Tensor]) -> int:
    return sum(int(split.lengths[b].max()) * len(b) for b in batches)


def test_without_buckets_an_epoch_is_the_permutation_cut_in_batches() -> None:
    split = _split([5] * 50)
    batches = make_batches(split, 16, torch.Generator().manual_seed(3), buckets=False)
    want = torch.randperm(50, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.cat(batches), want) and [len(b) for b in batches] == [16, 16, 16, 2]


def test_buckets_cover_every_stay_once_and_cut_the_padding() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 241, (3000,), generator=g).tolist()
    split = _split(lengths)
    plain = make_batches(split, 32, torch.Generator().manual_seed(1), buckets=False)
    bucketed = make_batches(split, 32, torch.Generator().manual_seed(1), buckets=True)
    assert sorted(torch.cat(bucketed).tolist()) == list(range(3000))
    assert all(len(b) <= 32 for b in bucketed)
    real = sum(lengths)
    # uniform lengths 1..240: padding to the batch maximum costs ~2x the real steps,
    # buckets of similar stays only a few percent
    assert _padded_steps(split, plain) > 1.8 * real
    assert _padded_steps(split, bucketed) < 1.1 * real
    again = make_batches(split, 32, torch.Generator().manual_seed(1), buckets=True)
    assert all(torch.equal(a, b) for a, b in zip(bucketed, again, strict=True))


def test_buckets_default_on_for_whole_stay_tasks_only() -> None:
    assert TrainConfig(task="phenotypes").buckets
    assert not TrainConfig(task="mortality").buckets
    assert not TrainConfig(task="phenotypes", length_buckets=False).buckets
