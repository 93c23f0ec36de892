"""Every plot writes a non-empty PNG."""

import numpy as np

from scehr.training.plots import (
    plot_embedding_tsne,
    plot_learning_curves,
    plot_pr_curves,
    plot_reliability,
    plot_roc_curves,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _ok(path):
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 1000


def _data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return y, np.clip(0.4 * y + 0.6 * rng.random(n), 0, 1), rng.random(n)


def test_curve_plots(tmp_path):
    y, good, rand = _data()
    models = {"scehr": (y, good), "random": (y, rand)}
    cis = {"scehr": {"value": 0.9, "low": 0.85, "high": 0.94}}
    _ok(plot_roc_curves(tmp_path / "roc.png", models, cis))
    _ok(plot_pr_curves(tmp_path / "sub" / "pr.png", models))
    _ok(plot_reliability(tmp_path / "rel.png", models))
    Y = np.stack([y, 1 - y], axis=1)
    _ok(plot_roc_curves(tmp_path / "roc_micro.png", {"micro": (Y, np.stack([good, rand], 1))}))


def test_learning_curves_list_and_csv(tmp_path):
    hist = [{"epoch": e, "train_loss": 1 / e, "val_loss": 1 / e + 0.1, "val_auroc": 0.7 + 0.01 * e}
            for e in range(1, 6)]
    _ok(plot_learning_curves(tmp_path / "lc.png", hist))
    csv_path = tmp_path / "history.csv"
    csv_path.write_text("epoch,train_loss,val_auroc\n1,0.9,0.70\n2,0.7,0.75\n3,0.6,\n")
    _ok(plot_learning_curves(tmp_path / "lc_csv.png", csv_path, best_epoch=2))


def test_tsne_with_anchors(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 80)
    Z = rng.normal(size=(80, 6)) + 2 * y[:, None]
    anchors = {"u": np.ones(6), "v": -np.ones(6)}
    _ok(plot_embedding_tsne(tmp_path / "tsne.png", Z, y, anchors, max_points=60,
                                  max_iter=250))
