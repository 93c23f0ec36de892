"""Ensembles: members of one data split, combined into one anchor model and one ONNX graph.

The combined model's anchor logits must be the mean of the members' (so its probability is
the loss's read-out of that mean), its graph must match PyTorch for batch 1 and > 1 and any T,
and the exported folder must be served like any single model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scehr.schemas.manifest import load_manifest
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.ensemble import (
    greedy_select,
    load_members,
    mean_logit_probability,
    member_dir,
    select_and_combine,
    train_ensemble,
)
from scehr.training.export import export_run
from scehr.training.fit import criterion, load_checkpoint
from scehr.training.onnx_graph import ScoringModel, export_onnx, validate_parity
from tests.service.conftest import serve
from tests.training.test_export import torch_probability

REPO = Path(__file__).resolve().parents[2]
TINY = {"units": 4, "depth": 1, "bidirectional": False, "dropout": 0.0, "static": True}
SEEDS = [0, 1, 2]


def tiny_cfg(data: Path, out: Path, **kw: object) -> TrainConfig:
    return TrainConfig(**{
        "task": "mortality", "data": str(data), "out": str(out), "encoder": "lstm",
        "encoder_hparams": dict(TINY), "loss": "csce", "lam": 0.01, "batch_size": 32,
        "epochs": 2, "seed": 0, "threads": 1, "n_boot": 10, "tsne": False, "plots": False,
        "progress": False, **kw})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(data, ensemble run) trained by the config path: `ensemble_seeds` = SEEDS."""
    root = tmp_path_factory.mktemp("ensemble")
    data = write_synthetic(root / "data", "mortality", n_train=240, n_test=80, prevalence=0.3,
                           seed=1)
    train_ensemble(tiny_cfg(data, root / "ens", ensemble_seeds=SEEDS), echo=False)
    return data, root / "ens"


def batch(n: int, t: int, ck: dict) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n * 100 + t)
    x = torch.randn(n, t, ck["n_features"], generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    return x, lengths, torch.randn(n, ck["n_static"], generator=g)


def test_ensemble_logits_are_the_mean_of_the_members(built: tuple[Path, Path]) -> None:
    _, ens = built
    model, crit, ck = load_checkpoint(ens / "model.pt")
    assert ck["encoder"]["name"] == "ensemble" and len(ck["members"]) == len(SEEDS)
    members = [load_checkpoint(member_dir(ens, s) / "model.pt")[0] for s in SEEDS]
    x, lengths, static = batch(9, 11, ck)
    with torch.no_grad():
        z, logits = model(x, lengths, static)
        outs = [m(x, lengths, static) for m in members]
    assert z.shape[1] == sum(o[0].shape[1] for o in outs)
    torch.testing.assert_close(logits, torch.stack([o[1] for o in outs]).mean(0),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(z, torch.cat([o[0] for o in outs], dim=1))
    # distinct seeds: the members really differ, so the mean is not one member's logits
    assert not torch.allclose(outs[0][1], outs[1][1])
    p = mean_logit_probability(crit, [o[1].numpy() for o in outs])
    np.testing.assert_allclose(crit.probability(logits).numpy(), p, atol=1e-6)


def test_members_share_one_split_and_normalizer(built: tuple[Path, Path]) -> None:
    _, ens = built
    cks = [load_checkpoint(member_dir(ens, s) / "model.pt")[2] for s in SEEDS]
    assert [c["config"]["seed"] for c in cks] == SEEDS
    assert all(c["normalizer"] == cks[0]["normalizer"] for c in cks)
    preds = [np.load(member_dir(ens, s) / "predictions.npz") for s in SEEDS]
    assert all(np.array_equal(p["calib_y"], preds[0]["calib_y"]) for p in preds)


def test_ensemble_graph_matches_pytorch_for_any_batch_and_length(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    """A dynamic-T export (the fixed-T one is checked by every `export_run`, below)."""
    _, ens = built
    model, crit, ck = load_checkpoint(ens / "model.pt")
    scoring = ScoringModel(model.encoder, model.head, crit.probability).eval()
    path = tmp_path / "ensemble.onnx"
    export_onnx(scoring, path, n_features=ck["n_features"], n_static=ck["n_static"],
                seq_len=48, dynamic_length=True)
    worst = validate_parity(scoring, path, batch_sizes=(1, 7), lengths=(1, 13, 48, 70))
    assert max(worst.values()) <= 1e-5


def test_members_of_other_splits_are_refused(built: tuple[Path, Path], tmp_path: Path) -> None:
    data, ens = built
    from scehr.training.run import train_run

    other = tmp_path / "other-split"
    train_run(tiny_cfg(data, other, epochs=1, seed=5, split_seed=7), echo=False)
    with pytest.raises(ValueError, match="split_seed"):
        load_members([member_dir(ens, 0), other])
    with pytest.raises(ValueError, match="'loss'"):
        bce = tmp_path / "bce"
        train_run(tiny_cfg(data, bce, epochs=1, loss="bce", lam=0.0), echo=False)
        load_members([member_dir(ens, 0), bce])


def test_greedy_selection_keeps_informative_members_and_stops() -> None:
    rng = np.random.default_rng(0)
    n = 400
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    signal = (2 * y - 1)[:, :, None] * np.array([1.0, -1.0])  # [N, 1, 2], margin ±2

    def member(noise: float) -> np.ndarray:
        return (signal + rng.normal(0, noise, (n, 1, 2))).astype(np.float32)

    logits = {"good-a": member(1.5), "good-b": member(1.5), "noise": rng.normal(
        0, 1, (n, 1, 2)).astype(np.float32)}
    crit = criterion(TrainConfig(loss="csce"))
    path = greedy_select("mortality", y, logits, crit)
    names = [name for name, _ in path]
    assert set(names[:2]) == {"good-a", "good-b"} and "noise" not in names
    assert path[1][1] > path[0][1]  # the second member raised validation AUROC
    assert greedy_select("mortality", y, logits, crit, max_members=1)[0][0] == names[0]


def test_select_and_combine_writes_a_run_that_exports(built: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    _, ens = built
    out = tmp_path / "chosen"
    final = select_and_combine([member_dir(ens, s) for s in SEEDS], out, select="all",
                               n_boot=10, echo=False)
    assert len(final["members"]) == len(SEEDS)
    assert final["selection"]["metric"] == "auroc"
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["selection"] == final["selection"]
    with pytest.raises(ValueError, match="select must be"):
        select_and_combine([member_dir(ens, 0)], out, select="best")


@pytest.mark.anyio
async def test_exported_ensemble_is_served_like_pytorch(built: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    from scehr.service.settings import Settings

    _, ens = built
    folder = tmp_path / "models" / "mortality" / "0.1.0"
    export_run(ens, folder)
    m = load_manifest(folder / "manifest.json")
    assert m.encoder.name == "ensemble" and len(m.encoder.hparams["members"]) == len(SEEDS)
    assert m.encoder.out_dim == 4 * len(SEEDS) and np.array(m.anchors["u"]).shape == (1, 12)
    assert max(m.onnx.parity_max_abs_error.values()) <= 1e-5
    payload = json.loads((REPO / "examples" / "mortality_stay_benchmark17.json").read_text())
    expected = torch_probability(ens, payload)
    async with serve(Settings(model_dir=tmp_path / "models", device="cpu")) as client:
        r = await client.post("/predict/mortality", json=payload)
    assert r.status_code == 200, r.text
    got = np.array([c["score"] for c in r.json()["results"]])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_cli_trains_members_once_and_reuses_them(built: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    """`scehr train` with `ensemble_seeds` in its config reuses members already trained."""
    data, ens = built
    before = {s: (member_dir(ens, s) / "model.pt").stat().st_mtime_ns for s in SEEDS}
    toml = tmp_path / "ensemble.toml"
    toml.write_text(
        'task = "mortality"\nencoder = "lstm"\nloss = "csce"\nlam = 0.01\nbatch_size = 32\n'
        f"epochs = 2\nthreads = 1\nn_boot = 10\nensemble_seeds = {SEEDS}\n[encoder_hparams]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items()))
    r = subprocess.run([sys.executable, "-m", "scehr.cli", "train", "--config", str(toml),
                        "--data", str(data), "--out", str(ens), "--no-plots", "--no-tsne",
                        "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("already trained") == len(SEEDS)
    after = {s: (member_dir(ens, s) / "model.pt").stat().st_mtime_ns for s in SEEDS}
    assert after == before


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
