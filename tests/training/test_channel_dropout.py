"""Channel dropout: a dropped channel is exactly a channel the stay never recorded (the
discretizer's and normaliser's own encoding), and p = 0 changes nothing."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from scehr.schemas.featureset import FEATURE_SETS, FeatureSet
from scehr.schemas.tensorize import Normalizer, Observations, discretize
from scehr.training.channel_dropout import LABS, ChannelDropout
from scehr.training.cli import _dropout_rate
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.run import train_run


def random_obs(fs: FeatureSet, n: int, seed: int) -> Observations:
    """Every channel observed a few times in every stay, categories as indices."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n):
        end = 48.0 if fs.window_hours else float(rng.uniform(6, 30))
        for c, v in enumerate(fs.variables):
            for t in rng.uniform(0, end, size=3):
                value = (rng.integers(len(v.categories)) if v.is_categorical
                         else v.normal_float * rng.uniform(0.7, 1.3))
                rows.append((s, c, t, float(value)))
    s, c, t, v = (np.array(a) for a in zip(*rows, strict=True))
    return Observations(s, c, t, v, n)


@pytest.mark.parametrize("name", ["physionet2012-full", "benchmark76-stay"])
def test_a_dropped_channel_is_encoded_as_a_channel_the_stay_never_recorded(name: str) -> None:
    fs = FEATURE_SETS[name]
    obs = random_obs(fs, 4, seed=1)
    x, lengths = discretize(obs, fs)
    norm = Normalizer.fit(x, lengths, fs)
    drop = ChannelDropout(fs, norm, p=0.5)
    # Stay 1 loses a continuous channel, stay 2 a categorical one and another, stay 0 none.
    cat = next(i for i, v in enumerate(fs.variables) if v.is_categorical)
    dropped = np.zeros((4, fs.n_channels), dtype=bool)
    dropped[1, 0] = True
    dropped[2, [cat, 3]] = True
    got = drop.drop(torch.from_numpy(norm.transform(x, lengths)), torch.from_numpy(lengths),
                    torch.from_numpy(dropped)).numpy()
    # The oracle: the same observations without those channels, through discretize + normalise.
    keep = ~dropped[obs.stay, obs.channel]
    x_absent, lengths_absent = discretize(obs.take(keep), fs, _ends(obs, fs))
    np.testing.assert_array_equal(lengths_absent, lengths)
    want = norm.transform(x_absent, lengths)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got[1], norm.transform(x, lengths)[1])  # something did change


def _ends(obs: Observations, fs: FeatureSet) -> np.ndarray | None:
    """Each stay's window end as discretize chose it with every channel present."""
    if fs.window_hours:
        return None
    last = np.zeros(obs.n_stays)
    np.maximum.at(last, obs.stay, obs.time)
    return np.minimum(last, fs.max_hours)


def test_zero_rate_changes_nothing_and_draws_nothing() -> None:
    fs = FEATURE_SETS["physionet2012-full"]
    x, lengths = discretize(random_obs(fs, 3, seed=2), fs)
    norm = Normalizer.fit(x, lengths, fs)
    xt = torch.from_numpy(norm.transform(x, lengths))
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    assert ChannelDropout(fs, norm, 0.0)(xt, torch.from_numpy(lengths), gen) is xt
    assert torch.equal(gen.get_state(), state)


def test_the_rate_is_the_share_of_channels_dropped() -> None:
    fs = FEATURE_SETS["physionet2012-full"]
    x, lengths = discretize(random_obs(fs, 200, seed=3), fs)
    norm = Normalizer.fit(x, lengths, fs)
    xt = torch.from_numpy(norm.transform(x, lengths))
    out = ChannelDropout(fs, norm, 0.3)(xt, torch.from_numpy(lengths),
                                       torch.Generator().manual_seed(0))
    masks = out[:, :, fs.n_value_columns:]
    share = float((masks.sum(dim=1) == 0).float().mean())  # every channel observed before
    assert share == pytest.approx(0.3, abs=0.02)


def test_groups_are_also_dropped_as_a_whole() -> None:
    fs = FEATURE_SETS["physionet2012-full"]
    x, lengths = discretize(random_obs(fs, 400, seed=4), fs)
    norm = Normalizer.fit(x, lengths, fs)
    xt = torch.from_numpy(norm.transform(x, lengths))
    labs = [fs.variable_ids.index(v) for v in LABS if v in fs.variable_ids]
    share = {}
    for groups in (False, True):
        out = ChannelDropout(fs, norm, 0.3, groups=groups)(
            xt, torch.from_numpy(lengths), torch.Generator().manual_seed(0))
        absent = out[:, :, fs.n_value_columns:].sum(dim=1) == 0  # [stays, channels]
        share[groups] = float(absent[:, labs].all(dim=1).float().mean())
    assert share[False] == 0.0  # 0.3 ** 23: independent drops never remove every lab
    assert share[True] == pytest.approx(0.3, abs=0.05)


def test_out_of_range_rates_are_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="channel_dropout must be in"):
        TrainConfig(channel_dropout=1.0)
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be in \[0, 1\)"):
        _dropout_rate("1")


def test_training_with_channel_dropout_records_it_and_differs(tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "d", "mortality", n_train=80, n_test=30,
                           prevalence=0.3, seed=0)
    base = dict(task="mortality", data=str(data), encoder="lstm", loss="bce", batch_size=16,
                epochs=1, threads=1, n_boot=5, plots=False, tsne=False, progress=False,
                encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                 "dropout": 0.0})
    for name, p in (("off", 0.0), ("on", 0.5)):
        train_run(TrainConfig(out=str(tmp_path / name), channel_dropout=p,
                              **base))  # type: ignore[arg-type]
    assert (tmp_path / "on" / "config.json").read_text().count('"channel_dropout": 0.5') == 1
    loss = {n: [r["train_loss"] for r in csv.DictReader(
        (tmp_path / n / "epochs.csv").read_text().splitlines())] for n in ("off", "on")}
    assert loss["on"] != loss["off"]  # the same seed trained on different inputs
