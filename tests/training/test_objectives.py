"""Every regularizer of the registry trains for one epoch from `scehr train --config ...`.

Tiny synthetic data and a tiny LSTM keep each run to seconds; the check is that the term is
built from the TOML config, enters the objective, and is logged per epoch under its name.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from scehr import cli as scehr_cli
from scehr.training.data.synthetic import write_synthetic
from scehr.training.losses import REGULARIZERS, build_loss, build_regularizer
from tests.training.tiny_run import tiny_config

#: Small but non-default parameters per regularizer, to check they reach the loss.
PARAMS: dict[str, str] = {
    "acl": "eta = 0.5",
    "afcl": "eta = 0.5\ngamma = 2.0",
    "triplet": 'margin = 0.3\nmining = "hard"',
    "margin": "margin = 0.5",
    "ntxent": "noise = 0.2",
    "supcon_krandom": "k = 2",
    "supcon_knn_feature": "k = 2",
    "supcon_knn_attribute": "k = 2",
    "debiased_supcon": "queue_size = 64\nthreshold = 0.8",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), "mortality", n_train=60,
                           n_test=20, prevalence=0.3, seed=0)


def test_every_registered_regularizer_except_scr_is_exercised() -> None:
    assert set(PARAMS) == set(REGULARIZERS) - {"scr"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_regularizer_trains_one_epoch_from_a_config(name: str, data_dir: Path,
                                                    tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(tiny_config(f"""loss = "cbce"
lam = 0.0
[regularizers.{name}]
weight = 0.1
{PARAMS[name]}
"""))
    out = tmp_path / "run"
    code = scehr_cli.main(["train", "--config", str(config), "--data", str(data_dir),
                           "--out", str(out)])
    assert code == 0
    with open(out / "epochs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and math.isfinite(float(rows[0][f"train_{name}"]))
    assert {"train_loss", "train_cce", "train_scr"} <= set(rows[0])
    saved = json.loads((out / "config.json").read_text())
    assert saved["regularizers"][name]["weight"] == 0.1


def test_the_objective_adds_weighted_parts_and_names_them() -> None:
    torch.manual_seed(0)
    z, logits = torch.randn(12, 5), torch.randn(12, 1, 2)
    y = torch.tensor([0.0, 1.0] * 6)[:, None]
    plain, _ = build_loss("cbce", lam=0.01)(z, logits, y)
    crit = build_loss("cbce", lam=0.01, regularizers={"triplet": {"weight": 0.5},
                                                      "margin": {"weight": 2.0}})
    total, parts = crit(z, logits, y)
    assert list(parts) == ["cce", "scr", "triplet", "margin"]
    want = plain + 0.5 * parts["triplet"] + 2.0 * parts["margin"]
    torch.testing.assert_close(total, want)


def test_wrong_names_and_parameters_say_what_is_valid() -> None:
    with pytest.raises(ValueError, match="unknown regularizer 'supcon'; valid names: scr, acl"):
        build_regularizer("supcon")
    with pytest.raises(ValueError, match="'triplet' has no parameter 'k'; its parameters: margin"):
        build_regularizer("triplet", k=3)
    with pytest.raises(ValueError, match="weighted by lam"):
        build_loss("cbce", regularizers={"scr": {"weight": 1.0}})
