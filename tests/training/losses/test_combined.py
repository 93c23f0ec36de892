"""CombinedLoss / build_loss, and a tiny end-to-end sanity check of CBCE + SCR training."""

import pytest
import torch
from sklearn.metrics import roc_auc_score

from scehr.training.heads import AnchorHead
from scehr.training.losses import CBCE, CCE_LOSSES, CSCE, SCR, CombinedLoss, FocalLoss, build_loss


def test_registry_names() -> None:
    assert set(CCE_LOSSES) == {"bce", "cbce", "csce", "focal"}


def test_total_is_cce_plus_lambda_scr() -> None:
    g = torch.Generator().manual_seed(0)
    z, logits = torch.randn(10, 6, generator=g), torch.randn(10, 2, 2, generator=g)
    y = (torch.rand(10, 2, generator=g) > 0.5).float()
    loss = build_loss("cbce", lam=0.007, temperature=0.2)
    total, parts = loss(z, logits, y)
    assert set(parts) == {"cce", "scr"}
    torch.testing.assert_close(parts["cce"], CBCE()(logits, y))
    torch.testing.assert_close(parts["scr"], SCR(0.2)(z, y))
    torch.testing.assert_close(total, parts["cce"] + 0.007 * parts["scr"])


def test_binary_targets_as_vector() -> None:
    z, logits, y = torch.randn(6, 3), torch.randn(6, 1, 2), torch.tensor([0, 1, 0, 1, 1, 0.0])
    total, _ = build_loss("csce", lam=0.01)(z, logits, y)
    assert torch.isfinite(total)


def test_probability_delegates_and_kwargs_reach_the_cce() -> None:
    logits = torch.randn(4, 2, 2)
    torch.testing.assert_close(build_loss("csce").probability(logits), CSCE.probability(logits))
    focal = build_loss("focal", gamma=3.0, alpha=0.4)
    assert isinstance(focal.cce, FocalLoss)
    assert (focal.cce.gamma, focal.cce.alpha) == (3.0, 0.4)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="bce, cbce, csce, focal"):
        build_loss("hinge")
    with pytest.raises(ValueError):
        CombinedLoss("cbce", lam=-1.0)


@pytest.fixture
def one_thread():
    """Tiny tensors: a second intra-op thread only adds contention on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_cbce_plus_scr_learns_a_separable_problem() -> None:
    torch.manual_seed(0)
    n, f = 400, 6
    y = (torch.rand(n) < 0.3).float()
    x = torch.randn(n, f) + 1.5 * y[:, None] * torch.tensor([1.0, -1.0, 0.5, 0, 0, 0])
    encoder = torch.nn.Sequential(torch.nn.Linear(f, 16), torch.nn.Tanh())
    head = AnchorHead(16, 1)
    loss_fn = build_loss("cbce", lam=0.05)
    opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=0.03)
    train, test = slice(0, 300), slice(300, n)
    for _ in range(60):
        z = encoder(x[train])
        total, _ = loss_fn(z, head(z), y[train])
        opt.zero_grad()
        total.backward()
        opt.step()
    with torch.no_grad():
        p = loss_fn.probability(head(encoder(x[test])))[:, 0]
    assert roc_auc_score(y[test].numpy(), p.numpy()) > 0.9
