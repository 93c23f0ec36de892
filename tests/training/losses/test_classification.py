"""BCE, CBCE, CSCE and focal loss against plain-loop float64 references; read-outs; gradcheck."""

import math

import pytest
import torch

from scehr.training.losses import BCE, CBCE, CSCE, FocalLoss


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def ref_mean(fn, logits: torch.Tensor, y: torch.Tensor) -> float:
    """(1/C) Σ_c mean_b fn(u, v, y) with loops."""
    b, c, _ = logits.shape
    per_class = []
    for k in range(c):
        vals = [
            fn(float(logits[i, k, 0]), float(logits[i, k, 1]), float(y[i, k])) for i in range(b)
        ]
        per_class.append(sum(vals) / b)
    return sum(per_class) / c


def ref_bce(u: float, v: float, y: float) -> float:
    return -(y * math.log(sig(u)) + (1 - y) * math.log(sig(-u)))


def ref_cbce(u: float, v: float, y: float) -> float:
    return -(y * math.log(sig(u) * sig(-v)) + (1 - y) * math.log(sig(v) * sig(-u)))


def ref_csce(u: float, v: float, y: float) -> float:
    p = math.exp(u) / (math.exp(u) + math.exp(v))
    return -(y * math.log(p) + (1 - y) * math.log(1 - p))


def ref_focal(gamma: float, alpha: float | None):
    def fn(u: float, v: float, y: float) -> float:
        pt = sig(u) if y == 1 else 1 - sig(u)
        at = 1.0 if alpha is None else (alpha if y == 1 else 1 - alpha)
        return -at * (1 - pt) ** gamma * math.log(pt)

    return fn


def _inputs(b: int = 9, c: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(b, c, 2, generator=g, dtype=torch.float64)
    y = (torch.rand(b, c, generator=g) > 0.6).double()
    return logits, y


@pytest.mark.parametrize(
    ("loss", "ref"),
    [
        (BCE(), ref_bce),
        (CBCE(), ref_cbce),
        (CSCE(), ref_csce),
        (FocalLoss(2.0), ref_focal(2.0, None)),
        (FocalLoss(0.5, alpha=0.25), ref_focal(0.5, 0.25)),
    ],
)
def test_matches_loop_reference(loss: torch.nn.Module, ref) -> None:
    logits, y = _inputs()
    assert loss(logits, y).item() == pytest.approx(ref_mean(ref, logits, y), rel=1e-10)


def test_focal_gamma_zero_is_bce() -> None:
    logits, y = _inputs(seed=1)
    assert FocalLoss(0.0)(logits, y).item() == pytest.approx(BCE()(logits, y).item(), rel=1e-12)


def test_cbce_probability_is_the_papers_ratio() -> None:
    logits, _ = _inputs(50, 4, seed=2)
    u, v = logits[..., 0], logits[..., 1]
    expected = torch.sigmoid(u) / (torch.sigmoid(u) + torch.sigmoid(v))
    torch.testing.assert_close(CBCE.probability(logits), expected, rtol=1e-12, atol=1e-14)


def test_cbce_probability_finite_where_the_literal_ratio_is_0_over_0() -> None:
    logits = torch.tensor([[[-200.0, -200.0]], [[-300.0, -200.0]], [[500.0, 500.0]]])
    p = CBCE.probability(logits)
    assert torch.isfinite(p).all()
    assert p[0, 0].item() == pytest.approx(0.5)
    assert p[1, 0].item() < 1e-30
    assert p[2, 0].item() == pytest.approx(0.5)


def test_csce_probability_is_the_softmax() -> None:
    logits, _ = _inputs(20, 2, seed=3)
    torch.testing.assert_close(CSCE.probability(logits), torch.softmax(logits, -1)[..., 0])


@pytest.mark.parametrize("loss", [BCE(), FocalLoss(2.0)])
def test_sigmoid_probability(loss) -> None:
    logits, _ = _inputs(seed=4)
    torch.testing.assert_close(loss.probability(logits), torch.sigmoid(logits[..., 0]))


@pytest.mark.parametrize("loss", [CBCE(), CSCE()])
def test_gradcheck(loss) -> None:
    logits, y = _inputs(5, 2, seed=5)
    assert torch.autograd.gradcheck(lambda t: loss(t, y), (logits.requires_grad_(),))


@pytest.mark.parametrize("loss", [BCE(), CBCE(), CSCE(), FocalLoss(2.0, 0.25)])
def test_finite_for_huge_logits(loss) -> None:
    logits = torch.tensor([[[1000.0, -1000.0]], [[-1000.0, 1000.0]]], requires_grad=True)
    out = loss(logits, torch.tensor([0.0, 1.0]))  # y [B] accepted for C = 1; both badly wrong
    out.backward()
    assert torch.isfinite(out) and out.item() > 100
    assert torch.isfinite(logits.grad).all()


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="do not match"):
        CBCE()(torch.zeros(4, 2, 2), torch.zeros(4, 3))
