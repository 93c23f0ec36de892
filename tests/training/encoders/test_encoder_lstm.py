"""BenchmarkLSTM: the paper's mimic3-benchmarks LSTM, exact on padded variable-length batches."""

from __future__ import annotations

import pytest
import torch

from scehr.training.encoders import BenchmarkLSTM, build_encoder

F = 6


def _ragged(b: int = 5, t: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(b, t, F), torch.tensor([t, 1, 7, 3, t - 1][:b])


@pytest.mark.parametrize(
    "hp",
    [
        {"units": 8, "depth": 2, "bidirectional": True},
        {"units": 6, "depth": 3, "bidirectional": True},
        {"units": 5, "depth": 2, "bidirectional": False},
        {"units": 5, "depth": 1},
    ],
)
def test_padding_invariance(hp: dict) -> None:
    """A stay's z in a padded batch equals its z computed alone (no padding at all)."""
    torch.manual_seed(0)
    enc = BenchmarkLSTM(F, **hp).eval()
    x, lengths = _ragged()
    with torch.no_grad():
        z = enc(x, lengths)
        alone = torch.cat([enc(x[i : i + 1, : lengths[i]], lengths[i : i + 1]) for i in range(5)])
    assert z.shape == (5, hp["units"])
    torch.testing.assert_close(z, alone, atol=1e-6, rtol=0)


def test_padding_values_never_matter() -> None:
    torch.manual_seed(0)
    enc = BenchmarkLSTM(F, units=8, depth=2).eval()
    x, lengths = _ragged()
    noisy = x.clone()
    for i, n in enumerate(lengths.tolist()):
        noisy[i, n:] = 100.0
    with torch.no_grad():
        torch.testing.assert_close(enc(x, lengths), enc(noisy, lengths), atol=1e-6, rtol=0)


def test_bidirectional_layer_matches_torch_bilstm_per_stay() -> None:
    """Oracle: nn.LSTM(bidirectional=True) on each unpadded stay, same weights."""
    torch.manual_seed(0)
    layer = BenchmarkLSTM(F, units=8, depth=2).eval().inner[0]
    ref = torch.nn.LSTM(F, 4, batch_first=True, bidirectional=True).eval()
    for suffix, lstm in (("", layer.fwd), ("_reverse", layer.bwd)):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(ref, f"{name}_l0{suffix}").data.copy_(getattr(lstm, f"{name}_l0"))
    x, lengths = _ragged()
    with torch.no_grad():
        out = layer(x, lengths)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(out[i, :n], ref(x[i : i + 1, :n])[0][0], atol=1e-6, rtol=0)


def test_presets_match_the_paper() -> None:
    mort = BenchmarkLSTM.for_task("mortality", 76)
    assert (mort.inner[0].fwd.hidden_size, mort.inner[0].bwd.hidden_size) == (8, 8)
    assert mort.final.hidden_size == 16 and mort.out_dim == 16 and mort.dropout == 0.3
    pheno = BenchmarkLSTM.for_task("phenotypes", 76)
    assert len(pheno.inner) == 0 and pheno.final.hidden_size == 256 and pheno.out_dim == 256
    assert not mort.uses_static and not pheno.uses_static
    # Keras initialisation: forget-gate bias 1 (gate order i, f, g, o), orthogonal recurrent
    final = mort.final
    assert torch.equal(final.bias_ih_l0[16:32], torch.ones(16))
    assert final.bias_ih_l0[:16].abs().sum() == 0 and final.bias_hh_l0.abs().sum() == 0
    w = final.weight_hh_l0.detach()
    torch.testing.assert_close(w.T @ w, torch.eye(16), atol=1e-5, rtol=0)


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    enc = BenchmarkLSTM(F, units=8, depth=2, dropout=0.5)
    x, lengths = _ragged()
    enc.eval()
    with torch.no_grad():
        torch.testing.assert_close(enc(x, lengths), enc(x, lengths), atol=0, rtol=0)
    enc.train()
    with torch.no_grad():
        assert not torch.equal(enc(x, lengths), enc(x, lengths))


def test_hparams_round_trip_and_gradients() -> None:
    enc = BenchmarkLSTM(F, units=8, depth=2, dropout=0.1)
    rebuilt = build_encoder("lstm", F, 0, **enc.hparams())
    assert rebuilt.hparams() == enc.hparams()
    assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in enc.parameters()]
    rebuilt.load_state_dict(enc.state_dict())
    x, lengths = _ragged()
    z = enc(x, lengths)
    (z * torch.randn_like(z)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


def test_rejects_odd_bidirectional_units() -> None:
    with pytest.raises(ValueError, match="odd"):
        BenchmarkLSTM(F, units=7, depth=2, bidirectional=True)


def test_static_demographics_are_read_when_enabled() -> None:
    torch.manual_seed(0)
    x, lengths = _ragged()
    static = torch.randn(5, 4)
    plain = BenchmarkLSTM(F, 4, units=6, depth=2).eval()
    assert not plain.uses_static and "static" in plain.hparams()
    enc = BenchmarkLSTM(F, 4, units=6, depth=2, static=True).eval()
    assert enc.uses_static and enc.hparams()["static"] is True
    with torch.no_grad():
        z = enc(x, lengths, static)
        other = enc(x, lengths, static + 1.0)
        alone = torch.cat([enc(x[i : i + 1, : lengths[i]], lengths[i : i + 1], static[i : i + 1])
                           for i in range(5)])
    assert not torch.allclose(z, other)  # the demographics change z
    torch.testing.assert_close(z, alone, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="static=True"):
        enc(x, lengths)
