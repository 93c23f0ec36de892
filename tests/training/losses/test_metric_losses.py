"""Margin contrastive, triplet and NT-Xent against loops and pytorch-metric-learning."""

import itertools
import math

import pytest
import torch
from pytorch_metric_learning.losses import NTXentLoss, TripletMarginLoss

from scehr.training.losses import MarginContrastiveLoss, NTXent, TripletLoss


def _z(b: int = 8, d: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rows(z: torch.Tensor, normalize: bool) -> list[list[float]]:
    rows = [[float(v) for v in r] for r in z]
    if normalize:
        rows = [[v / math.sqrt(sum(w * w for w in r)) for v in r] for r in rows]
    return rows


def _dist(a: list[float], b: list[float]) -> float:
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


def ref_margin(z: torch.Tensor, y: list[int], m: float, normalize: bool = False) -> float:
    r, n = _rows(z, normalize), len(y)
    terms = []
    for i, j in itertools.permutations(range(n), 2):
        d = _dist(r[i], r[j])
        terms.append(0.5 * d * d if y[i] == y[j] else 0.5 * max(0.0, m - d) ** 2)
    return sum(terms) / len(terms)


def ref_triplet(z: torch.Tensor, y: list[int], m: float, mining: str) -> float:
    r, n = _rows(z, True), len(y)
    if mining == "all":
        losses = [
            _dist(r[a], r[p]) - _dist(r[a], r[q]) + m
            for a, p, q in itertools.product(range(n), repeat=3)
            if a != p and y[a] == y[p] and y[q] != y[a]
        ]
        active = [v for v in losses if v > 0]
        return sum(active) / len(active) if active else 0.0
    per_anchor = []
    for a in range(n):
        pos = [_dist(r[a], r[p]) for p in range(n) if p != a and y[p] == y[a]]
        neg = [_dist(r[a], r[q]) for q in range(n) if y[q] != y[a]]
        if pos and neg:
            per_anchor.append(max(0.0, max(pos) - min(neg) + m))
    return sum(per_anchor) / len(per_anchor)


def ref_ntxent(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> float:
    r = _rows(torch.cat((z1, z2)), True)
    n, b = len(r), len(z1)
    total = 0.0
    for i in range(n):

        def e(k: int, i: int = i) -> float:
            return math.exp(sum(x * y for x, y in zip(r[i], r[k], strict=True)) / tau)

        partner = (i + b) % n
        total += -math.log(e(partner) / sum(e(k) for k in range(n) if k != i))
    return total / n


Y = [0, 1, 1, 0, 0, 1, 0, 0]


@pytest.mark.parametrize(("margin", "normalize"), [(1.0, False), (0.5, True), (4.0, False)])
def test_margin_contrastive_matches_loops(margin: float, normalize: bool) -> None:
    z = _z()
    got = MarginContrastiveLoss(margin, normalize)(z, torch.tensor(Y, dtype=torch.float64))
    assert got.item() == pytest.approx(ref_margin(z, Y, margin, normalize), rel=1e-10)


@pytest.mark.parametrize("mining", ["all", "hard"])
@pytest.mark.parametrize("margin", [0.2, 1.0])
def test_triplet_matches_loops(mining: str, margin: float) -> None:
    z = _z(seed=1)
    got = TripletLoss(margin, mining)(z, torch.tensor(Y, dtype=torch.float64))
    assert got.item() == pytest.approx(ref_triplet(z, Y, margin, mining), rel=1e-10)


@pytest.mark.parametrize("margin", [0.2, 1.0])
def test_triplet_batch_all_matches_pml(margin: float) -> None:
    z, y = _z(seed=2), torch.tensor(Y)
    pml = TripletMarginLoss(margin=margin)(z, y)  # L2-normalised, active-triplet mean
    assert TripletLoss(margin, "all")(z, y.double()).item() == pytest.approx(pml.item(), rel=1e-9)


def test_ntxent_matches_loops_and_pml() -> None:
    z1, z2 = _z(6, seed=3), _z(6, seed=4)
    got = NTXent(0.1)(z1, z2).item()
    assert got == pytest.approx(ref_ntxent(z1, z2, 0.1), rel=1e-10)
    ids = torch.arange(6).repeat(2)
    assert got == pytest.approx(NTXentLoss(0.1)(torch.cat((z1, z2)), ids).item(), rel=1e-9)


@pytest.mark.parametrize(
    "loss", [MarginContrastiveLoss(), TripletLoss(mining="all"), TripletLoss(mining="hard")]
)
def test_multilabel_is_mean_over_informative_columns(loss) -> None:
    z = _z(seed=5)
    y = torch.tensor([Y, [1] * 8, [1, 0, 1, 1, 0, 1, 0, 1]], dtype=torch.float64).T
    expected = (loss(z, y[:, 0]) + loss(z, y[:, 2])) / 2
    assert loss(z, y).item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize(
    "loss", [MarginContrastiveLoss(), TripletLoss(mining="all"), TripletLoss(mining="hard")]
)
def test_degenerate_batches_give_zero_and_finite_gradients(loss) -> None:
    for y in (torch.tensor([1.0]), torch.zeros(5)):
        z = torch.randn(len(y), 3, requires_grad=True)
        out = loss(z, y)
        out.backward()
        assert out.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))
    z = torch.zeros(4, 3, requires_grad=True)  # coincident points: distance 0
    out = loss(z, torch.tensor([0, 1, 0, 1.0]))
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(z.grad).all()


def test_gradcheck_margin_and_ntxent() -> None:
    z = _z(5, 3, seed=6).requires_grad_()
    y = torch.tensor([0, 1, 1, 0, 1.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: MarginContrastiveLoss(2.0)(t, y), (z,))
    assert torch.autograd.gradcheck(lambda t: NTXent(0.5)(t[:2], t[2:4]), (z,))
