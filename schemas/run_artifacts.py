"""A training run directory, described once: its files and the keys inside them.

`scehr train` writes these (training.run, training.fit); `scehr evaluate` and `scehr export`
read them. The keys were contracts by string; here they are named, and a reader checks a file
has what it needs before using it, so a run from another version fails with a clear message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Per split, the arrays `scehr.training.fit.predict` returns and predictions.npz stores.
PREDICTION_FIELDS: tuple[str, ...] = ("z", "anchor_logits", "probability", "y")
#: Splits whose predictions are stored (calib only when the run held a calibration split out).
PREDICTION_SPLITS: tuple[str, ...] = ("val", "test", "calib")
#: Further arrays in predictions.npz: training embeddings and labels (prototypes at export),
#: raw test demographics (subgroup metrics) and the stay ids of val and test.
PREDICTION_EXTRAS: tuple[str, ...] = ("train_z", "train_y", "test_static_raw", "test_stays",
                                      "val_stays")
#: What export needs from predictions.npz.
EXPORT_NEEDS: tuple[str, ...] = ("val_y", "val_probability", "val_anchor_logits", "train_z",
                                 "train_y", "test_y", "test_probability", "test_static_raw")

#: The keys of model.pt (a torch checkpoint dict).
CHECKPOINT_KEYS: tuple[str, ...] = ("config", "state_dict", "encoder", "n_features", "n_static",
                                    "label_names", "normalizer", "static", "coverage",
                                    "best_epoch")


def prediction_key(split: str, field: str) -> str:
    """The predictions.npz key of one split's array, e.g. ("val", "probability")."""
    return f"{split}_{field}"


def split_key(key: str) -> tuple[str, str]:
    """(split, field) of a predictions.npz key (the split never contains '_')."""
    split, _, field = key.partition("_")
    return split, field


def require_keys(have: Iterable[str], need: Iterable[str], what: str) -> None:
    """ValueError naming the first missing key of `what` (a file of a run)."""
    have = set(have)
    missing = [k for k in need if k not in have]
    if missing:
        raise ValueError(f"{what} lacks {missing[0]!r} (and {len(missing) - 1} more): "
                         "written by another scehr version? Re-run `scehr train`")


def check_checkpoint(ck: Mapping[str, Any], path: Path) -> None:
    require_keys(ck, CHECKPOINT_KEYS, str(path))


@dataclass(frozen=True)
class RunArtifacts:
    """The files of one run directory."""

    root: Path

    @property
    def config(self) -> Path:
        """The resolved TrainConfig (JSON), written first."""
        return self.root / "config.json"

    @property
    def epochs(self) -> Path:
        """One row per epoch: train_loss, train_<part> per objective part, val metrics."""
        return self.root / "epochs.csv"

    @property
    def checkpoint(self) -> Path:
        """model.pt: the `CHECKPOINT_KEYS` dict."""
        return self.root / "model.pt"

    @property
    def predictions(self) -> Path:
        """predictions.npz: `prediction_key(split, field)` arrays plus `PREDICTION_EXTRAS`."""
        return self.root / "predictions.npz"

    @property
    def metrics(self) -> Path:
        """metrics.json: the final metrics with CIs (written last before the plots)."""
        return self.root / "metrics.json"

    def require(self, *paths: Path) -> None:
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(f"{self.root} is not a finished run directory (no "
                                        f"{p.name}; `scehr train` writes it)")
