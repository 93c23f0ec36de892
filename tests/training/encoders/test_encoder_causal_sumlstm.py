"""CausalSummaryLSTM: z at every hour from that hour's past only, equal to SummaryLSTM run on
the stay cut at that hour, and the same in the exported landmark graph (ONNX Runtime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from scehr.schemas.contract import (
    ANCHOR_LOGITS_BY_HOUR,
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    OUTPUT_PROBABILITY,
    PROBABILITY_BY_HOUR,
)
from scehr.training.encoders import CausalSummaryLSTM, SummaryLSTM
from scehr.training.heads import AnchorHead
from scehr.training.onnx_graph import LandmarkScoringModel, export_onnx, validate_parity

WIDTHS = [3, 1, 1]  # a categorical channel of 3 one-hot columns, then two continuous channels
F, S, T, C = 3 + 1 + 1 + 3, 2, 48, 1
HP = {"units": 5, "summary_dim": 4, "widths": WIDTHS}


def _stays(b: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, T, F, generator=g)
    x[..., 5:] = (torch.rand(b, T, 3, generator=g) < 0.3).float()  # mask columns
    x[1, :20, 6] = 0.0  # stay 1 observes channel 1 only from step 20
    lengths = torch.tensor([T, 30, 1, 17][:b])
    return x, lengths, torch.randn(b, S, generator=g)


def _readout(a: torch.Tensor) -> torch.Tensor:
    return torch.softmax(a, dim=-1)[..., 0]


def _model(seed: int = 0) -> LandmarkScoringModel:
    torch.manual_seed(seed)
    enc = CausalSummaryLSTM(F, S, **HP)
    return LandmarkScoringModel(enc, AnchorHead(enc.out_dim, C), _readout).eval()


def test_step_t_equals_sumlstm_on_the_stay_cut_at_t_plus_1_hours() -> None:
    """The same weights in the (independent, whole-window) SummaryLSTM, run once per cut."""
    causal = CausalSummaryLSTM(F, S, **HP).eval()
    plain = SummaryLSTM(F, S, **HP).eval()
    plain.load_state_dict(causal.state_dict())
    x, lengths, static = _stays()
    with torch.no_grad():
        steps = causal.steps(x, lengths, static)
        for t in range(T):
            cut = torch.minimum(lengths, torch.tensor(t + 1))
            keep = lengths > t  # steps at or beyond a stay's length are undefined
            torch.testing.assert_close(steps[keep, t], plain(x, cut, static)[keep],
                                       atol=1e-5, rtol=0)
        torch.testing.assert_close(causal(x, lengths, static), plain(x, lengths, static),
                                   atol=1e-5, rtol=0)


def test_later_values_never_change_earlier_hours() -> None:
    model = _model()
    x, _, static = _stays()
    h = 12
    changed = x.clone()
    changed[:, h:, :5] += 3.0 * torch.randn(4, T - h, 5)
    changed[:, h:, 5:] = 1.0 - changed[:, h:, 5:]  # other observation pattern too
    full = torch.full((4,), T)
    with torch.no_grad():
        before, after = model(x, full, static), model(changed, full, static)
    torch.testing.assert_close(before[3][:, :h], after[3][:, :h], atol=0, rtol=0)
    torch.testing.assert_close(before[4][:, :h], after[4][:, :h], atol=0, rtol=0)
    assert not torch.allclose(before[4][:, h:], after[4][:, h:])  # the change does matter


def test_bidirectional_is_refused() -> None:
    with pytest.raises(ValueError, match="bidirectional must be false"):
        CausalSummaryLSTM(F, S, **HP, bidirectional=True)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[LandmarkScoringModel, Path]:
    model = _model(seed=3)
    path = tmp_path_factory.mktemp("landmark") / "model.onnx"
    export_onnx(model, path, n_features=F, n_static=S, seq_len=T, dynamic_length=False)
    return model, path


def test_landmark_graph_matches_torch_for_batch_1_and_more(
        graph: tuple[LandmarkScoringModel, Path]) -> None:
    model, path = graph
    errors = validate_parity(model, path, batch_sizes=(1, 7, 64))
    assert set(errors) == set(LandmarkScoringModel.output_names)
    assert max(errors.values()) <= 1e-5
    outs = {o.name: o for o in ort.InferenceSession(str(path)).get_outputs()}
    assert outs[ANCHOR_LOGITS_BY_HOUR.name].shape[2:] == [C, 2]
    assert outs[PROBABILITY_BY_HOUR.name].shape[2:] == [C]


def test_the_graph_is_causal_and_step_t_is_the_stay_cut_at_t_plus_1_hours(
        graph: tuple[LandmarkScoringModel, Path]) -> None:
    _, path = graph
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x, _, static = (a.numpy() for a in _stays(seed=5))
    b = x.shape[0]

    def run(xx: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
        names = [OUTPUT_PROBABILITY, PROBABILITY_BY_HOUR.name]
        got = session.run(names, {INPUT_X: xx, INPUT_LENGTHS: lengths.astype(np.int64),
                                  INPUT_STATIC: static})
        return dict(zip(names, got, strict=True))

    full = run(x, np.full(b, T))
    by_hour = full[PROBABILITY_BY_HOUR.name]
    for t in (0, 5, 11, 23, 35, 47):
        cut = run(x, np.full(b, t + 1))[OUTPUT_PROBABILITY]
        np.testing.assert_allclose(by_hour[:, t], cut, atol=1e-6, rtol=0)
    h = 24
    changed = x.copy()
    changed[:, h:, :5] *= -2.0
    changed[:, h:, 5:] = 1.0
    later = run(changed, np.full(b, T))[PROBABILITY_BY_HOUR.name]
    np.testing.assert_array_equal(later[:, :h], by_hour[:, :h])
    assert np.abs(later[:, h:] - by_hour[:, h:]).max() > 1e-4
