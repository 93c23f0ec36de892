"""SCR against a plain-loop float64 reference and pytorch-metric-learning's SupConLoss."""

import math

import pytest
import torch
from pytorch_metric_learning.losses import SupConLoss

from scehr.training.losses import SCR


def ref_scr(z: torch.Tensor, y: torch.Tensor, tau: float = 0.1) -> float:
    """DESIGN.md §2 written out with loops."""
    zs = [[float(v) for v in row] for row in z]
    ys = y.reshape(len(zs), -1).tolist()
    norm = [math.sqrt(sum(v * v for v in r)) for r in zs]
    n = len(zs)

    def s(i: int, j: int) -> float:
        return sum(a * b for a, b in zip(zs[i], zs[j], strict=True)) / (norm[i] * norm[j])

    columns = []
    for c in range(len(ys[0])):
        col = [r[c] for r in ys]
        if len(set(col)) < 2:
            continue
        anchors = []
        for i in range(n):
            pos = [j for j in range(n) if j != i and col[j] == col[i]]
            if not pos:
                continue
            denom = sum(math.exp(s(i, k) / tau) for k in range(n) if k != i)
            anchors.append(-sum(math.log(math.exp(s(i, j) / tau) / denom) for j in pos) / len(pos))
        if anchors:
            columns.append(sum(anchors) / len(anchors))
    return sum(columns) / len(columns) if columns else 0.0


def _z(b: int, d: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize(
    "y",
    [
        torch.tensor([0, 1, 0, 1, 1, 0, 0, 1.0]),
        torch.tensor([1, 0, 0, 0, 0, 0, 0, 0.0]),  # a single positive: it has no partner
        # columns: mixed; constant (left out); a lone positive pair
        torch.tensor([[0, 1, 0, 1, 0, 1, 0, 0], [1] * 8, [1, 0, 0, 0, 1, 0, 0, 0]]).T.double(),
    ],
)
@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_matches_loop_reference(y: torch.Tensor, tau: float) -> None:
    z = _z(8)
    assert SCR(tau)(z, y).item() == pytest.approx(ref_scr(z, y, tau), rel=1e-10)


def test_matches_pml_supcon_when_every_anchor_has_a_positive() -> None:
    z = _z(12, seed=1)
    y_binary = torch.tensor([0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0.0], dtype=torch.float64)
    pml = SupConLoss(temperature=0.1)
    assert SCR(0.1)(z, y_binary).item() == pytest.approx(pml(z, y_binary).item(), rel=1e-9)


def test_gradcheck() -> None:
    z = _z(6, 3, seed=2).requires_grad_()
    y = torch.tensor([[0, 1], [1, 1], [0, 0], [1, 0], [0, 1], [1, 0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: SCR(0.1)(t, y), (z,))


@pytest.mark.parametrize(
    "y",
    [
        torch.tensor([1.0]),  # batch of one
        torch.ones(6),  # all labels equal
        torch.zeros(6, 4),  # all-zero label columns
        torch.tensor([0.0, 1.0]),  # two samples, no partner for either
    ],
)
def test_nothing_to_contrast_gives_zero_with_zero_gradient(y: torch.Tensor) -> None:
    z = torch.randn(y.shape[0], 4, requires_grad=True)
    loss = SCR()(z, y)
    loss.backward()
    assert loss.item() == 0.0
    assert z.grad is not None
    assert torch.equal(z.grad, torch.zeros_like(z))


def test_no_nan_for_degenerate_embeddings() -> None:
    y = torch.tensor([0, 1, 0, 1.0])
    for z0 in (
        torch.zeros(4, 3),
        torch.ones(4, 3),
        torch.tensor([[1.0, 0], [-1, 0], [1, 0], [-1, 0]]),
    ):
        z = z0.clone().requires_grad_()
        loss = SCR(0.01)(z, y)
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.isfinite(z.grad).all()


def test_invariant_to_positive_scaling() -> None:
    z, y = _z(10, seed=3), torch.tensor([0, 1, 1, 0, 0, 1, 0, 0, 1, 1.0])
    assert SCR()(3.7 * z, y).item() == pytest.approx(SCR()(z, y).item(), rel=1e-12)


def test_1d_and_single_column_labels_agree() -> None:
    z, y = _z(7, seed=4), torch.tensor([0, 1, 1, 0, 0, 1, 0.0])
    assert SCR()(z, y).item() == SCR()(z, y[:, None]).item()


def test_float32_stable_at_small_temperature() -> None:
    z = torch.tensor([[1.0, 0.0], [0.99, 0.01], [-1.0, 0.0], [-0.99, 0.01]]).requires_grad_()
    loss = SCR(0.01)(z, torch.tensor([0, 1, 1, 0.0]))  # positives are the far pair: huge loss
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 100
    assert torch.isfinite(z.grad).all()
