"""Shared test settings: where the real open data lives (tests needing it skip without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SCEHR_DATA_DIR", REPO.parent / "shared" / "data"))

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f"real data folder {SHARED_DATA} is absent (set SCEHR_DATA_DIR to run these)",
)
