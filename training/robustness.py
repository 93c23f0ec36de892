"""Robustness to missing channels: an exported model scored with whole channel groups removed.

A site that never records a channel (GCS on the eICU demo, labs in a small hospital) gives the
model stays where that channel is absent throughout. Here every stay of a split loses one group
at a time, encoded exactly as a channel never recorded (`scehr.training.external.neutralise`: normal
value, mask 0), and the exported ONNX graph scores it as the service would. The rows show how
far discrimination and the mean risk move; `mean_auroc` (over all rows) is the figure a
validation split uses to choose the channel-dropout rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scehr.training.bootstrap import bootstrap_ci
from scehr.training.calibration import expected_calibration_error
from scehr.training.channel_dropout import CHANNEL_GROUPS
from scehr.training.data.eicu_demo import empty_channels
from scehr.training.external import ExportedModel
from scehr.training.metrics import auroc

# The groups removed one at a time are CHANNEL_GROUPS (training/channel_dropout.py), then
# "eICU demo gaps": every channel the eICU demo conversion never fills.
ALL = "all channels"
EICU_GAPS = "eICU demo gaps"


def channel_groups(model: ExportedModel) -> dict[str, list[int]]:
    """The model's groups as channel indices, "all channels" (nothing removed) first."""
    ids = model.fs.variable_ids
    named = {**CHANNEL_GROUPS, EICU_GAPS: tuple(empty_channels(model.fs))}
    out: dict[str, list[int]] = {ALL: []}
    for name, members in named.items():
        idx = [ids.index(v) for v in members if v in ids]
        if idx:
            out[name] = idx
    return out


def evaluate_missing(folder: Path, data: Path, split: str = "test", n_boot: int = 1000,
                     seed: int = 0) -> dict[str, Any]:
    """AUROC and ECE with 95% CIs, and the mean risk, with each channel group removed."""
    model = ExportedModel(folder)
    a = model.load(data, split)
    rows: dict[str, Any] = {}
    base: np.ndarray | None = None
    for name, idx in channel_groups(model).items():
        s = model.score(a, absent=idx)
        base = s.risk if base is None else base
        rows[name] = {
            "channels": [model.fs.variable_ids[i] for i in idx],
            "auroc": bootstrap_ci(auroc, s.y, s.risk, n_boot=n_boot, seed=seed),
            "ece": bootstrap_ci(expected_calibration_error, s.y, s.risk, n_boot=n_boot,
                                seed=seed),
            "mean_risk": float(s.risk.mean()),
            "mean_abs_risk_change": float(np.abs(s.risk - base).mean()),
        }
    y = a.y[:, 0]
    return {"model": str(folder), "model_version": model.manifest.version, "data": str(data),
            "split": split, "n": len(y), "deaths": int(y.sum()),
            "observed_rate": float(y.mean()),
            "mean_auroc": float(np.mean([r["auroc"]["value"] for r in rows.values()])),
            "rows": rows}


def markdown_table(report: dict[str, Any]) -> str:
    """One row per removed group: AUROC [CI], ECE [CI], mean risk, mean |risk change|."""
    def ci(d: dict[str, Any]) -> str:
        return f"{d['value']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"

    lines = [f"{report['split']} split of `{report['data']}`: {report['n']} stays, "
             f"{report['deaths']} deaths (observed rate {report['observed_rate']:.3f})", "",
             "| removed | AUROC | ECE | mean risk | mean abs. risk change |",
             "|---|---|---|---|---|"]
    for name, r in report["rows"].items():
        lines.append(f"| {name} | {ci(r['auroc'])} | {ci(r['ece'])} | {r['mean_risk']:.3f} | "
                     f"{r['mean_abs_risk_change']:.3f} |")
    lines += ["", f"mean AUROC over the rows: {report['mean_auroc']:.3f}"]
    return "\n".join(lines)
