"""ChannelwiseGRU: per-channel GRUs + static token + attention, exact on padded batches."""

from __future__ import annotations

import pytest
import torch

from scehr.training.encoders import ChannelwiseGRU, build_encoder

F, S = 5, 3


def _ragged(b: int = 4, t: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(b, t, F), torch.tensor([t, 1, 6, 3][:b]), torch.randn(b, S)


@pytest.mark.parametrize("channels", [None, [[0, 1], [2], [3, 4]]])
def test_shapes_and_padding_invariance(channels: list[list[int]] | None) -> None:
    torch.manual_seed(0)
    enc = ChannelwiseGRU(F, S, hidden=4, channels=channels, n_heads=2).eval()
    x, lengths, static = _ragged()
    with torch.no_grad():
        z = enc(x, lengths, static)
        alone = [
            enc(x[i : i + 1, :n], lengths[i : i + 1], static[i : i + 1])
            for i, n in enumerate(lengths.tolist())
        ]
    assert z.shape == (4, enc.out_dim) == (4, 4)
    assert len(enc.grus) == (F if channels is None else 3)
    torch.testing.assert_close(z, torch.cat(alone), atol=1e-6, rtol=0)


def test_static_is_a_token() -> None:
    torch.manual_seed(0)
    enc = ChannelwiseGRU(F, S, hidden=4).eval()
    x, lengths, static = _ragged()
    assert enc.uses_static and not ChannelwiseGRU(F, 0).uses_static
    with torch.no_grad():
        assert not torch.allclose(enc(x, lengths, static), enc(x, lengths, static + 1.0))
    with pytest.raises(ValueError, match="static"):
        enc(x, lengths)
    ChannelwiseGRU(F, 0, hidden=4).eval()(x, lengths)  # no static token: static not needed


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    enc = ChannelwiseGRU(F, S, hidden=4, dropout=0.5)
    x, lengths, static = _ragged()
    enc.eval()
    with torch.no_grad():
        assert torch.equal(enc(x, lengths, static), enc(x, lengths, static))
    enc.train()
    with torch.no_grad():
        assert not torch.equal(enc(x, lengths, static), enc(x, lengths, static))


def test_hparams_round_trip_and_gradients() -> None:
    enc = ChannelwiseGRU(F, S, hidden=4, channels=[[0, 1], [2, 3, 4]], n_heads=1, dropout=0.1)
    rebuilt = build_encoder("cwgru", F, S, **enc.hparams())
    assert rebuilt.hparams() == enc.hparams()
    assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in enc.parameters()]
    rebuilt.load_state_dict(enc.state_dict())
    x, lengths, static = _ragged()
    z = enc(x, lengths, static)
    (z * torch.randn_like(z)).sum().backward()  # not z.sum(): a LayerNorm output sums to ~0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


@pytest.mark.parametrize("channels", [[[0], []], [[0, 9]]])
def test_rejects_bad_channels(channels: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="channels"):
        ChannelwiseGRU(F, S, channels=channels)
