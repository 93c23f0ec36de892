"""ACL / AFCL against a plain-loop float64 reference; reduction to SCR; float32 stability."""

import math

import pytest
import torch

from scehr.training.losses import ACL, AFCL, SCR


def ref_afcl(z: torch.Tensor, y: torch.Tensor, eta: float, gamma: float, tau: float) -> float:
    zs = [[float(v) for v in row] for row in z]
    ys = y.reshape(len(zs), -1).tolist()
    n = len(zs)
    norm = [math.sqrt(sum(v * v for v in r)) for r in zs]

    def e(i: int, k: int) -> float:
        dot = sum(a * b for a, b in zip(zs[i], zs[k], strict=True))
        return math.exp(dot / (norm[i] * norm[k]) / tau)

    def p(i: int, j: int) -> float:
        return e(i, j) / sum(e(i, k) for k in range(n) if k != i)

    def log1m_p(i: int, j: int) -> float:
        """log(1 − p_ij) as log(Σ_{k≠i,j} e_ik / Σ_{k≠i} e_ik): no cancellation."""
        rest = sum(e(i, k) for k in range(n) if k not in (i, j))
        return math.log(rest) - math.log(sum(e(i, k) for k in range(n) if k != i))

    columns = []
    for c in range(len(ys[0])):
        col = [r[c] for r in ys]
        if len(set(col)) < 2:
            continue
        anchors = []
        for i in range(n):
            pos = [j for j in range(n) if j != i and col[j] == col[i]]
            neg = [j for j in range(n) if col[j] != col[i]]
            if not pos:
                continue
            lp = sum(-((1 - p(i, j)) ** gamma) * math.log(p(i, j)) for j in pos) / len(pos)
            ln = sum(-log1m_p(i, k) for k in neg) / len(neg) if neg else 0.0
            anchors.append(lp + eta * ln)
        if anchors:
            columns.append(sum(anchors) / len(anchors))
    return sum(columns) / len(columns) if columns else 0.0


def _z(b: int = 8, d: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


Y2 = torch.tensor(
    [[0, 1], [1, 1], [0, 0], [1, 1], [0, 1], [1, 0], [0, 1], [0, 1]], dtype=torch.float64
)


@pytest.mark.parametrize(("eta", "gamma"), [(0.0, 0.0), (1.5, 0.0), (0.0, 2.0), (3.0, 1.0)])
@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_afcl_matches_loop_reference(eta: float, gamma: float, tau: float) -> None:
    z = _z()
    got = AFCL(eta=eta, gamma=gamma, temperature=tau)(z, Y2).item()
    assert got == pytest.approx(ref_afcl(z, Y2, eta, gamma, tau), rel=1e-10)


def test_acl_is_afcl_without_focal_term_and_zero_eta_is_scr() -> None:
    z, y = _z(seed=1), Y2[:, 0]
    assert ACL(eta=2.0)(z, y).item() == pytest.approx(AFCL(eta=2.0)(z, y).item(), rel=1e-12)
    assert ACL(eta=0.0)(z, y).item() == pytest.approx(SCR()(z, y).item(), rel=1e-12)


def test_gradcheck() -> None:
    z = _z(6, 3, seed=2).requires_grad_()
    y = torch.tensor([0, 1, 1, 0, 1, 0.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: AFCL(eta=1.0, gamma=2.0)(t, y), (z,))


def test_float32_dominant_negative_stays_finite_and_accurate() -> None:
    # the anchor's negative coincides with it, its positive is opposite: p_in ≈ 1 − e^-40
    z64 = torch.tensor([[1.0, 0.0], [1.0, 1e-3], [-1.0, 0.0], [-1.0, 1e-3]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0.0])
    loss = ACL(eta=1.0, temperature=0.05)
    z32 = z64.float().requires_grad_()
    out = loss(z32, y)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(z32.grad).all()
    assert out.item() == pytest.approx(ref_afcl(z64, y, 1.0, 0.0, 0.05), rel=1e-4)
    assert out.item() > 20  # −log(1 − p_in) ≈ 40 − log 2 for the two fooled anchors


def test_nothing_to_contrast_gives_zero() -> None:
    z = torch.randn(1, 3, requires_grad=True)
    out = AFCL(eta=1.0, gamma=2.0)(z, torch.tensor([1.0]))
    out.backward()
    assert out.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))
