"""False-negative debiasing for supervised contrast, with a MoCo-style memory queue.

With rare positives (ICU mortality ≈ 10%), a batch often holds one or no partner for a positive
anchor. The queue keeps recent (embedding, label, prior-feature) rows so every step offers
partners; and a "negative" whose prior-space features (e.g. standardised raw vitals) are nearly
identical to the anchor's is likely a false negative: it is dropped from the denominator
(mode="drop") or counted as a positive (mode="attract").

Input convention: z [B, D] (cosine similarity), binary labels y [B] or [B, C] (per column as in
SCR), prior [B, P] (cosine similarity against the threshold).
Formulas as implemented, and how they fit the objective: docs/method.md.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from scehr.training.losses.pairwise import (
    cosine_similarity_matrix,
    informative_columns,
    label_matrix,
    masked_log_softmax,
    masked_mean,
    mean_over_kept,
    off_diagonal,
    same_label_masks,
    supcon_anchor_losses,
)


class MemoryQueue(nn.Module):
    """FIFO ring buffer of detached (embedding, label, prior) rows; buffers follow .to(device)."""

    def __init__(self, size: int, dim: int, n_labels: int = 1, prior_dim: int = 0) -> None:
        super().__init__()
        if size < 1:
            raise ValueError("size must be >= 1")
        self.size, self.prior_dim = size, prior_dim
        self.register_buffer("_z", torch.zeros(size, dim))
        self.register_buffer("_y", torch.zeros(size, n_labels))
        self.register_buffer("_prior", torch.zeros(size, prior_dim))
        self.register_buffer("_ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("_count", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return int(self._count)

    @torch.no_grad()
    def enqueue(self, z: Tensor, y: Tensor, prior: Tensor | None = None) -> None:
        """Add a batch, overwriting the oldest rows once full (keeps the last `size` rows)."""
        y = label_matrix(y, z.shape[0])
        if prior is None:
            prior = z.new_zeros(z.shape[0], self.prior_dim)
        z, y, prior = z[-self.size :], y[-self.size :], prior[-self.size :]
        rows = (int(self._ptr) + torch.arange(z.shape[0], device=self._z.device)) % self.size
        self._z[rows] = z.detach().to(self._z)
        self._y[rows] = y.detach().to(self._y)
        self._prior[rows] = prior.detach().to(self._prior)
        self._ptr.fill_((int(self._ptr) + z.shape[0]) % self.size)
        self._count.fill_(min(self.size, int(self._count) + z.shape[0]))

    def contents(self) -> tuple[Tensor, Tensor, Tensor]:
        """The filled rows (embeddings [Q, D], labels [Q, C], prior [Q, P])."""
        n = len(self)
        return self._z[:n], self._y[:n], self._prior[:n]


class DebiasedSupCon(nn.Module):
    """SupCon of the batch against batch + queue, with prior-space false negatives handled.

    Positives: same label (batch and queue). A negative with prior cosine similarity > `threshold`
    is removed from the denominator ("drop") or made a positive ("attract"). Columns are kept when
    some anchor has a positive and both labels occur among the keys. If a queue is given, the batch
    is enqueued (detached) after the loss is computed, as in MoCo.
    """

    def __init__(
        self,
        temperature: float = 0.1,
        threshold: float = 0.9,
        mode: Literal["drop", "attract"] = "drop",
        queue: MemoryQueue | None = None,
    ) -> None:
        super().__init__()
        if mode not in ("drop", "attract"):
            raise ValueError("mode must be 'drop' or 'attract'")
        self.temperature, self.threshold, self.mode = temperature, threshold, mode
        self.queue = queue

    def forward(self, z: Tensor, y: Tensor, prior: Tensor | None = None) -> Tensor:
        y = label_matrix(y, z.shape[0]).to(z.dtype)
        keys, key_y, key_prior = z, y, prior
        if self.queue is not None and len(self.queue):
            q_z, q_y, q_prior = self.queue.contents()
            keys, key_y = torch.cat((z, q_z.to(z))), torch.cat((y, q_y.to(y)))
            if prior is not None:
                key_prior = torch.cat((prior, q_prior.to(prior)))
        others = off_diagonal(z.shape[0], keys.shape[0], device=z.device)
        same, diff = same_label_masks(y, key_y)  # [C, B, K]
        positives, candidates = same & others, others.expand_as(same)
        if prior is not None and key_prior is not None:
            false_neg = (
                diff & others & (cosine_similarity_matrix(prior, key_prior) > self.threshold)
            )
            if self.mode == "drop":
                candidates = candidates & ~false_neg
            else:
                positives = positives | false_neg
        logits = cosine_similarity_matrix(z, keys) / self.temperature
        log_prob = masked_log_softmax(logits.expand_as(candidates), candidates)
        anchor_loss, has_pos = supcon_anchor_losses(log_prob, positives)
        kept = has_pos.any(dim=-1) & informative_columns(key_y)
        loss = mean_over_kept(masked_mean(anchor_loss, has_pos), kept, z)
        if self.queue is not None:
            self.queue.enqueue(z, y, prior)
        return loss

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, threshold={self.threshold}, mode={self.mode!r}"
