"""The smallest training config the one-epoch CI runs share (objectives, regimes)."""

from __future__ import annotations

BASE = """task = "mortality"
encoder = "lstm"
epochs = 1
batch_size = 16
threads = 1
n_boot = 5
tsne = false
progress = false
[encoder_hparams]
units = 4
depth = 1
bidirectional = false
dropout = 0.0
"""


def tiny_config(lines: str) -> str:
    """`lines` (top-level keys, then any tables) merged into BASE: the keys before BASE, the
    tables after it, as TOML wants keys before tables."""
    head, _, tables = lines.partition("\n[")
    return head + "\n" + BASE + ("\n[" + tables if tables else "")
