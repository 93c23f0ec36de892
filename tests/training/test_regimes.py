"""Every training regime trains one epoch from a config on synthetic data (CI), and the
pieces they rest on do what they claim."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from scehr import cli as scehr_cli
from scehr.training.data.synthetic import write_synthetic
from scehr.training.regimes import labelled_rows, segment_views
from tests.training.tiny_run import tiny_config

#: regime/method -> the config lines that select it.
REGIMES = {
    "two_stage_acl_anchor": 'loss = "cbce"\nregime = "two_stage"\n[pretrain]\n'
                            'objective = "acl"\nepochs = 1\neta = 0.5',
    "two_stage_afcl_linear": 'loss = "bce"\nregime = "two_stage"\n[pretrain]\n'
                             'objective = "afcl"\nepochs = 1\neta = 0.5\ngamma = 2.0',
    "two_stage_supcon": 'loss = "cbce"\nregime = "two_stage"\n[pretrain]\n'
                        'objective = "supcon"\nepochs = 1',
    "ssl_label_fraction": 'loss = "cbce"\nregime = "ssl"\nlabel_fraction = 0.1\n[pretrain]\n'
                          'objective = "ntxent_segments"\nepochs = 1\ntemperature = 0.2',
    "focal_krandom": 'loss = "focal"\nloss_params = {gamma = 2.0}\n'
                     '[regularizers.supcon_krandom]\nweight = 0.1\nk = 2',
    "bce_debiased": 'loss = "bce"\n[regularizers.debiased_supcon]\nweight = 0.1\n'
                    'queue_size = 64',
    "csce_scr": 'loss = "csce"\nlam = 0.007',
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=60,
                           n_test=20, prevalence=0.3, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGIMES))
def test_regime_trains_one_epoch_from_a_config(name: str, data_dir: Path,
                                               tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(tiny_config(REGIMES[name]))
    out = tmp_path / "run"
    assert scehr_cli.main(["train", "--config", str(config), "--data", str(data_dir),
                           "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs_run"] == 1
    extra = metrics["test_ci_binary"]
    assert 0 <= extra["balanced_accuracy"]["value"] <= 1 and "value" in extra["min_se_ppv"]
    saved = json.loads((out / "config.json").read_text())
    if saved["regime"] != "joint":
        with open(out / "pretrain.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 1 and np.isfinite(float(rows[0]["train_loss"]))
        assert metrics["pretrain_epochs"] == 1


def test_two_stage_freezes_the_encoder_and_ssl_fine_tunes_it(data_dir: Path,
                                                             tmp_path: Path) -> None:
    from scehr.training.config import load_config
    from scehr.training.fit import fit, prepare

    for regime, objective in (("two_stage", "supcon"), ("ssl", "ntxent_segments")):
        cfg = load_config(None, data=str(data_dir), epochs=1, batch_size=16, threads=1,
                          progress=False, regime=regime,
                          pretrain={"objective": objective, "epochs": 1},
                          encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                           "dropout": 0.0})
        res = fit(cfg, prepare(cfg), echo=False)
        frozen = all(not p.requires_grad for p in res.model.encoder.parameters())
        assert frozen == (regime == "two_stage")


def test_segment_views_do_not_overlap_and_cover_the_stay() -> None:
    torch.manual_seed(0)
    lengths = torch.tensor([1, 2, 5, 48, 30])
    x = torch.arange(5 * 48, dtype=torch.float32).reshape(5, 48, 1)
    x1, l1, x2, l2 = segment_views(x, lengths)
    for i, n in enumerate(lengths.tolist()):
        a = x1[i, : l1[i], 0].tolist()
        b = x2[i, : l2[i], 0].tolist()
        if n >= 2:
            assert a + b == x[i, :n, 0].tolist()  # consecutive, disjoint, whole stay
            assert 0.25 * n - 1 <= len(a) <= 0.75 * n + 1
        else:
            assert a == b == [x[i, 0, 0].item()]


def test_label_fraction_keeps_that_share_per_class() -> None:
    y = np.zeros((1000, 1))
    y[:100] = 1
    rows = labelled_rows(y, 0.05, seed=0)
    assert len(rows) == 50 and int(y[rows].sum()) == 5
    assert len(labelled_rows(y, 0.001, seed=0)) == 2  # at least one stay per class
    assert len(labelled_rows(y, None, seed=0)) == 1000


def test_regime_errors_name_the_field() -> None:
    from scehr.training.config import TrainConfig

    with pytest.raises(ValueError, match="regime must be one of joint, two_stage, ssl"):
        TrainConfig(regime="three_stage")
    with pytest.raises(ValueError, match=r"pretrain\.objective of regime 'ssl' must be one of"):
        TrainConfig(regime="ssl", pretrain={"objective": "afcl"})
    with pytest.raises(ValueError, match="lam must be 0"):
        TrainConfig(regime="two_stage", lam=0.01, pretrain={"objective": "afcl"})
    with pytest.raises(ValueError, match="label_fraction must be in"):
        TrainConfig(label_fraction=0.0)
    with pytest.raises(ValueError, match=r"pretrain\.projection must be one of mlp, none"):
        TrainConfig(regime="ssl", pretrain={"objective": "ntxent_segments", "projection": "x"})


@pytest.mark.parametrize("projection", ["mlp", "none"])
def test_pretraining_trains_its_projection_and_the_model_drops_it(
        projection: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrastive loss sees g(z) (the default) or z; g is trained in pre-training only and
    is not part of the trained model (nor of what is exported)."""
    import copy

    import scehr.training.fit as fit_module
    from scehr.training.config import TrainConfig, load_config

    assert TrainConfig(regime="two_stage", pretrain={"objective": "afcl"}).pretrain[
        "projection"] == "mlp"  # explicit in config.json, so older runs read as different
    made: list[tuple[torch.nn.Module, torch.nn.Module]] = []  # (g, a copy of g at the start)
    real = fit_module.projection_head

    def spy(pretrain: dict, dim: int) -> torch.nn.Module | None:
        g = real(pretrain, dim)
        if g is not None:
            made.append((g, copy.deepcopy(g)))
        return g

    monkeypatch.setattr(fit_module, "projection_head", spy)
    cfg = load_config(None, data=str(data_dir), epochs=1, batch_size=16, threads=1,
                      progress=False, regime="two_stage",
                      pretrain={"objective": "supcon", "epochs": 2, "projection": projection},
                      encoder_hparams={"units": 4, "depth": 1, "bidirectional": False,
                                       "dropout": 0.0})
    res = fit_module.fit(cfg, fit_module.prepare(cfg), echo=False)
    assert res.model.projection is None
    assert not any(k.startswith("projection") for k in res.model.state_dict())
    assert len(made) == (projection == "mlp")
    for trained, start in made:  # g's weights moved during pre-training
        assert not torch.equal(trained[0].weight, start[0].weight)
