"""SummaryLSTM: masked per-channel statistics in the graph, exact on padded batches, trainable
and exportable end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from scehr.schemas.featureset import TASK_FEATURE_SETS
from scehr.schemas.manifest import load_manifest
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.encoders import SummaryLSTM, build_encoder
from scehr.training.export import export_run
from scehr.training.run import train_run

WIDTHS = [3, 1]  # a categorical channel of 3 one-hot columns, then a continuous channel
F, S = 3 + 1 + 2, 4


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(2)
    b, t = 3, 6
    x = torch.randn(b, t, F)
    x[..., 4:] = (torch.rand(b, t, 2) < 0.5).float()  # mask columns
    x[1, :, 5] = 0.0  # stay 1 never observes the continuous channel
    return x, torch.tensor([6, 4, 1]), torch.randn(b, S)


def _reference(x: np.ndarray, length: int) -> np.ndarray:
    """The statistics of one stay, written out with numpy loops."""
    x = x[:length]
    channel = [0, 0, 0, 1]
    last, vmin, vmax, mean = [], [], [], []
    for j, c in enumerate(channel):
        seen = x[:, 4 + c] > 0
        v = x[seen, j]
        last.append(v[-1] if seen.any() else 0.0)
        vmin.append(v.min() if seen.any() else 0.0)
        vmax.append(v.max() if seen.any() else 0.0)
        mean.append(v.mean() if seen.any() else 0.0)
    count, since = [], []
    for c in range(2):
        idx = np.flatnonzero(x[:, 4 + c] > 0)
        count.append(np.log1p(len(idx)))
        since.append((length - 1 - idx[-1]) / length if len(idx) else 1.0)
    return np.array(last + vmin + vmax + mean + count + since)


def test_summaries_match_a_reference_and_ignore_padding() -> None:
    enc = SummaryLSTM(F, S, units=4, summary_dim=5, widths=WIDTHS).eval()
    x, lengths, static = _batch()
    got = enc.summaries(x, lengths).numpy()
    for i, n in enumerate(lengths.tolist()):
        np.testing.assert_allclose(got[i], _reference(x[i].numpy(), n), atol=1e-5)
    with torch.no_grad():
        z = enc(x, lengths, static)
        alone = [enc(x[i : i + 1, :n], lengths[i : i + 1], static[i : i + 1])
                 for i, n in enumerate(lengths.tolist())]
    assert z.shape == (3, 4 + 5) and enc.out_dim == 9
    torch.testing.assert_close(z, torch.cat(alone), atol=1e-6, rtol=0)


def test_widths_default_from_the_feature_sets_and_round_trip() -> None:
    fs = TASK_FEATURE_SETS["mortality"]
    enc = build_encoder("sumlstm", fs.n_features, S, units=4, summary_dim=3)
    assert enc.widths == fs.widths.tolist() and enc.uses_static
    rebuilt = build_encoder("sumlstm", fs.n_features, S, **enc.hparams())
    assert rebuilt.hparams() == enc.hparams()
    rebuilt.load_state_dict(enc.state_dict())
    with pytest.raises(ValueError, match="widths"):
        SummaryLSTM(F, S, widths=[2, 3])
    with pytest.raises(ValueError, match="feature set"):
        SummaryLSTM(7, S)


def test_trains_one_epoch_and_exports(tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "data", "mortality", n_train=240, n_test=80,
                           prevalence=0.3, seed=3)
    cfg = TrainConfig(task="mortality", data=str(data), out=str(tmp_path / "run"),
                      encoder="sumlstm", encoder_hparams={"units": 4, "summary_dim": 4},
                      loss="cbce", lam=0.007, batch_size=32, epochs=1, seed=0, threads=1,
                      n_boot=10, tsne=False, progress=False)
    train_run(cfg)
    folder, _ = export_run(tmp_path / "run", tmp_path / "models" / "mortality" / "0.1.0")
    m = load_manifest(folder / "manifest.json")
    assert m.encoder.name == "sumlstm" and m.encoder.out_dim == 8
    assert max(m.onnx.parity_max_abs_error.values()) <= 1e-5
    assert "static" in m.onnx.inputs
