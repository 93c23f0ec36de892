"""k-positive selectors, SupConWithPositives, the memory queue and false-negative debiasing."""

import math

import pytest
import torch

from scehr.training.losses import (
    SCR,
    AttributeKNNPositives,
    DebiasedSupCon,
    FeatureKNNPositives,
    KRandomPositives,
    MemoryQueue,
    SupConWithPositives,
)


def ref_supcon(q, keys, pos, cand, tau: float = 0.1) -> float:
    """Loops: anchors = rows of q; pos/cand are predicates on (i, j) over the key rows."""

    def cos(a, b) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True)) / (
            math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(x * x for x in b))
        )

    q, keys = q.tolist(), keys.tolist()
    losses = []
    for i in range(len(q)):
        ps = [j for j in range(len(keys)) if pos(i, j) and cand(i, j)]
        if not ps:
            continue
        denom = sum(math.exp(cos(q[i], keys[k]) / tau) for k in range(len(keys)) if cand(i, k))
        losses.append(
            -sum(math.log(math.exp(cos(q[i], keys[j]) / tau) / denom) for j in ps) / len(ps)
        )
    return sum(losses) / len(losses) if losses else 0.0


Y = torch.tensor([0, 1, 0, 0, 1, 0, 1, 0, 0, 0])


def _z(b: int = 10, d: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("k", [1, 2, 20])
def test_k_random_positives(k: int) -> None:
    mask = KRandomPositives(k, generator=torch.Generator().manual_seed(0)).mask(Y)
    same = Y[:, None] == Y[None, :]
    assert not mask.diagonal().any()
    assert not (mask & ~same).any()
    expected = torch.clamp(same.sum(1) - 1, max=k)
    assert torch.equal(mask.sum(1), expected)


def test_feature_knn_picks_nearest_same_label_and_needs_refresh() -> None:
    selector = FeatureKNNPositives(k=1)
    with pytest.raises(RuntimeError):
        selector.mask(Y[:3], torch.arange(3))
    angles = torch.tensor([0.0, 0.1, 0.3, 1.0, 1.05, 3.0])
    emb = torch.stack((angles.cos(), angles.sin()), 1) * torch.arange(1, 7)[:, None]  # scale-free
    labels = torch.tensor([0, 1, 0, 0, 1, 0])
    selector.refresh(emb, labels)
    index = torch.tensor([0, 2, 3, 5, 1, 4])
    mask = selector.mask(labels[index], index)
    # batch positions: 0->row0, 1->row2, 2->row3, 3->row5, 4->row1, 5->row4
    expected_partner = {0: 1, 1: 0, 2: 1, 3: 2, 4: 5, 5: 4}
    for i, j in expected_partner.items():
        assert mask[i].nonzero().flatten().tolist() == [j]
    assert selector.neighbours(torch.tensor([0, 3])).flatten().tolist() == [2, 2]


def test_attribute_knn_standardises_features_once() -> None:
    # column 1 has a huge scale; after standardising, column 0 decides the neighbours
    x = torch.tensor([[0.0, 0], [0.1, 1000], [5.0, 10], [5.1, 990], [float("nan"), 500]])
    labels = torch.zeros(5)
    selector = AttributeKNNPositives(k=1)
    selector.fit(x, labels)
    assert torch.isfinite(selector.bank).all()
    nb = selector.neighbours(torch.arange(4)).flatten().tolist()
    assert nb[0] in (1, 4) and nb[2] in (3, 4)
    raw_nearest_of_0 = torch.cdist(x[:1, 1:], x[1:4, 1:]).argmin().item() + 1
    assert raw_nearest_of_0 == 2  # unscaled, column 1 would pair 0 with 2
    mask = selector.mask(labels, torch.arange(5))
    assert mask.sum(1).tolist() == [1] * 5


def test_supcon_with_full_positive_mask_equals_scr() -> None:
    z = _z()
    pos = Y[:, None] == Y[None, :]
    assert SupConWithPositives()(z, pos).item() == pytest.approx(SCR()(z, Y.double()).item())


def test_supcon_with_sparse_positives_and_candidates_matches_loops() -> None:
    z = _z(seed=1)
    pos = KRandomPositives(1, generator=torch.Generator().manual_seed(1)).mask(Y)
    cand = torch.rand(10, 10, generator=torch.Generator().manual_seed(2)) > 0.3
    got = SupConWithPositives(0.2)(z, pos, cand).item()
    want = ref_supcon(
        z, z, lambda i, j: bool(pos[i, j]), lambda i, j: i != j and bool(cand[i, j]), tau=0.2
    )
    assert got == pytest.approx(want, rel=1e-10)


def test_supcon_with_positives_empty_mask_is_zero() -> None:
    z = torch.randn(4, 3, requires_grad=True)
    out = SupConWithPositives()(z, torch.zeros(4, 4, dtype=torch.bool))
    out.backward()
    assert out.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))


def test_memory_queue_is_a_ring_buffer() -> None:
    queue = MemoryQueue(size=5, dim=2, n_labels=1, prior_dim=1)
    assert len(queue) == 0
    queue.enqueue(torch.full((3, 2), 1.0), torch.ones(3), torch.ones(3, 1))
    queue.enqueue(torch.full((4, 2), 2.0), torch.zeros(4), torch.zeros(4, 1))
    z, y, prior = queue.contents()
    assert len(queue) == 5 and z.shape == (5, 2) and prior.shape == (5, 1)
    assert z[:, 0].tolist() == [2.0, 2.0, 1.0, 2.0, 2.0]  # rows 0-1 overwritten by the wrap
    assert y.flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    queue.enqueue(torch.full((7, 2), 3.0), torch.ones(7))  # larger than the queue
    assert queue.contents()[0][:, 0].tolist() == [3.0] * 5


def test_debiased_without_queue_or_prior_is_scr() -> None:
    z = _z(seed=3)
    assert DebiasedSupCon()(z, Y).item() == pytest.approx(SCR()(z, Y.double()).item(), rel=1e-10)


@pytest.mark.parametrize("mode", ["drop", "attract"])
def test_debiased_with_queue_matches_loops(mode: str) -> None:
    g = torch.Generator().manual_seed(4)
    z, prior = _z(6, seed=4), torch.randn(6, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 0, 0, 0])  # a single positive: no partner in the batch
    q_z, q_prior = _z(4, seed=5), torch.randn(4, 3, generator=g, dtype=torch.float64)
    q_prior[1] = prior[2] * 2  # a queued negative that looks exactly like batch row 2
    q_y = torch.tensor([1, 1, 0, 0])
    queue = MemoryQueue(8, 4, 1, 3).double()
    queue.enqueue(q_z, q_y, q_prior)
    loss = DebiasedSupCon(temperature=0.1, threshold=0.95, mode=mode, queue=queue)
    got = loss(z, y, prior).item()

    keys, key_y, key_p = torch.cat((z, q_z)), torch.cat((y, q_y)), torch.cat((prior, q_prior))
    sim = torch.nn.functional.cosine_similarity(prior[:, None], key_p[None], dim=-1)

    def fneg(i: int, j: int) -> bool:
        return bool(y[i] != key_y[j] and sim[i, j] > 0.95)

    def pos(i: int, j: int) -> bool:
        return bool(y[i] == key_y[j]) or (mode == "attract" and fneg(i, j))

    def cand(i: int, j: int) -> bool:
        return i != j and not (mode == "drop" and fneg(i, j))

    assert got == pytest.approx(ref_supcon(z, keys, pos, cand), rel=1e-10)
    assert fneg(2, 7)  # the planted false negative was seen
    assert len(queue) == 8  # the batch was enqueued after the loss


def test_rare_positive_meets_partners_through_the_queue() -> None:
    queue = MemoryQueue(16, 4)
    loss = DebiasedSupCon(queue=queue)
    y = torch.tensor([0, 0, 0, 1])
    loss(torch.randn(4, 4), y)  # empty queue: the lone positive has no partner
    z = torch.randn(4, 4, dtype=torch.float64)
    with_queue = loss(z, y).item()  # the queue now holds the earlier positive
    keys = torch.cat((z, queue.contents()[0][:4].double()))
    key_y = torch.cat((y, y))
    want = ref_supcon(z, keys, lambda i, j: bool(y[i] == key_y[j]), lambda i, j: i != j)
    assert with_queue == pytest.approx(want, rel=1e-6)
    assert want != pytest.approx(SCR()(z, y.double()).item())  # SCR drops anchor 3
