"""Landmark training and prediction: the risk at every hour h from the data of hours [0, h).

A landmark task (`TaskSpec.landmarks`) trains a causal encoder (`causal_sumlstm`) on truncated
windows: each batch draws a few landmark hours and the objective is summed over (stay, hour)
rows, each row being the stay's z after h hours with the stay's outcome. One run of the encoder
gives every hour's z, so a batch of 8 hours costs one forward pass. Validation selects the epoch
on the mean AUROC over `REPORT_HOURS`.

Landmark populations: hour h's population is the stays still in the ICU at h, i.e. whose valid
length reaches h (`lengths >= h`). In PhysioNet 2012 every stay lasted at least 48 h (the
Challenge excluded shorter ones), so at every landmark up to 48 h the population is every stay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scehr.training.metrics import task_metrics

#: The landmark hours that tables and validation selection report.
REPORT_HOURS: tuple[int, ...] = (6, 12, 24, 36, 48)


@dataclass(frozen=True)
class LandmarkObjective:
    """How a landmark run draws its training rows: `hours_per_batch` hours per batch, uniformly
    from `first_hour` to the window's last hour (TrainConfig.landmark)."""

    first_hour: int = 1
    hours_per_batch: int = 8

    @classmethod
    def from_config(cls, params: dict[str, Any]) -> LandmarkObjective:
        unknown = sorted(set(params) - {"first_hour", "hours_per_batch"})
        if unknown:
            raise ValueError(f"landmark: unknown keys {unknown}; known: first_hour, "
                             "hours_per_batch")
        obj = cls(**params)
        if obj.first_hour < 1 or obj.hours_per_batch < 1:
            raise ValueError("landmark: first_hour and hours_per_batch must be >= 1")
        return obj

    def draw_hours(self, n_steps: int, gen: torch.Generator) -> Tensor:
        """Distinct landmark hours (1-based) for one batch, ascending."""
        pool = torch.arange(min(self.first_hour, n_steps), n_steps + 1)
        k = min(self.hours_per_batch, len(pool))
        return pool[torch.randperm(len(pool), generator=gen)[:k]].sort().values

    def rows(self, model: Any, x: Tensor, lengths: Tensor, static: Tensor, y: Tensor,
             gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """(z [N, D], anchor_logits [N, C, 2], y [N, C]) of the batch's (stay, hour) rows whose
        stay is in the hour's population."""
        steps = model.encoder.steps(x, lengths, static)  # [B, T, D]
        hours = self.draw_hours(x.shape[1], gen)
        z = steps[:, hours - 1]  # [B, k, D]
        inside = hours.unsqueeze(0) <= lengths.unsqueeze(1)  # [B, k]
        z = z[inside]
        yy = y.unsqueeze(1).expand(-1, len(hours), -1)[inside]
        return z, model.head(z), yy


@torch.no_grad()
def predict_hours(model: Any, crit: Any, split: Any, batch_size: int = 512
                  ) -> dict[str, np.ndarray]:
    """Every hour's outputs of a split (eval mode): probability [N, T], anchor margin uᵀz − vᵀz
    [N, T] (first class), labels y [N] and the population mask [N, T] (hour t + 1 <= length)."""
    model.eval()
    probs, margins = [], []
    for i in range(0, len(split), batch_size):
        idx = torch.arange(i, min(i + batch_size, len(split)))
        x, lengths, static, _ = split.batch(idx)
        logits = model.head(model.encoder.steps(x, lengths, static).flatten(0, 1))
        logits = logits.unflatten(0, (x.shape[0], x.shape[1]))[:, :, 0]  # [B, T, 2]
        pad = split.width - x.shape[1]  # batches trim shared padding: put it back
        p = torch.nn.functional.pad(crit.probability(logits), (0, pad))
        m = torch.nn.functional.pad(logits[..., 0] - logits[..., 1], (0, pad))
        probs.append(p)
        margins.append(m)
    lengths = split.lengths.numpy()
    t = split.width
    return {"probability": torch.cat(probs).numpy(), "margin": torch.cat(margins).numpy(),
            "y": split.y.numpy()[:, 0],
            "inside": np.arange(1, t + 1)[None, :] <= lengths[:, None]}


def hour_metrics(task: str, preds: dict[str, np.ndarray], hours: tuple[int, ...] = REPORT_HOURS
                 ) -> dict[int, dict[str, Any]]:
    """The task's metrics of the model's probability at each hour, on the hour's population."""
    out = {}
    for h in hours:
        keep = preds["inside"][:, h - 1]
        y = preds["y"][keep][:, None]
        out[h] = task_metrics(task, y, preds["probability"][keep, h - 1][:, None])
    return out


def selection_score(task: str, headline: str, preds: dict[str, np.ndarray]) -> float:
    """Mean validation headline metric over REPORT_HOURS (what selects a landmark run's epoch).
    """
    vals = [m[headline] for m in hour_metrics(task, preds).values()]
    return float(np.mean(vals)) if all(v is not None for v in vals) else -np.inf
