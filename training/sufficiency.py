"""How a model's data minimum is chosen on validation: the one rule, shared by the 48-hour
sufficiency study (`benchmarks/sufficiency_study.py`, stays with data removed) and a landmark
model's export (each band's validation stays truncated at its hours, grouped by the data they
hold), so both minimums mean the same thing.

`choose` reads figures per way of removing data and level ({"level", "auroc", "ece"} rows, plus
the reference "full" row) and keeps, per way, the least data from which every level with more
data is acceptable: AUROC within `AUROC_DROP` of the reference and ECE at most `MAX_ECE`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scehr.schemas.sufficiency import DataMinimum
from scehr.schemas.tensorize import Observations

if TYPE_CHECKING:
    from scehr.training.data.splits import SplitArrays

AUROC_DROP = 0.05  # the most AUROC a stay at the minimum may lose against full stays
MAX_ECE = 0.05  # the worst calibration accepted at the minimum
LEVELS = {
    "observations": [1, 2, 3, 5, 10, 20, 50, 100, 200],
    "channels": [1, 2, 3, 4, 6, 8, 12, 20],
    "hours_covered": [1, 2, 4, 6, 12, 24, 36],
    "hours_since_last": [44, 40, 36, 24, 12, 6, 2],
}
#: Ways where more data is a larger level (for hours_since_last, more data is a smaller gap).
GROWING = ("observations", "channels", "hours_covered")

Study = dict[str, list[dict[str, Any]]]


def acceptable(row: dict[str, Any], reference_auroc: float) -> bool:
    """A level's figures are acceptable: AUROC within AUROC_DROP of the reference's, ECE at
    most MAX_ECE."""
    return row["auroc"] >= reference_auroc - AUROC_DROP and row["ece"] <= MAX_ECE


def choose(res: Study) -> dict[str, float | None]:
    """Per way of removing data, the least data that keeps AUROC and ECE acceptable (None:
    no level from which every level with more data is acceptable)."""
    ref = res["full"][0]["auroc"]
    chosen: dict[str, float | None] = {}
    for how in GROWING:
        good = [r["level"] for r in res[how] if acceptable(r, ref)]
        # the least level from which every larger one is acceptable too
        levels = [r["level"] for r in res[how]]
        chosen[how] = next((lv for lv in levels if all(lv2 in good for lv2 in levels
                                                        if lv2 >= lv)), None)
    rows = res["hours_since_last"]  # more data = smaller gap
    gaps = [r["level"] for r in rows]
    good = {r["level"] for r in rows if acceptable(r, ref)}
    chosen["hours_since_last"] = next((g for g in gaps if all(g2 in good for g2 in gaps
                                                              if g2 <= g)), None)
    return chosen


def data_minimum(pick: dict[str, float | None], rule: str, study: str) -> DataMinimum:
    """The `DataMinimum` of `choose`'s pick (a way with no pick asks for nothing beyond one
    observation of one variable)."""
    return DataMinimum(
        min_observations=int(pick["observations"] or 1),
        min_channels=int(pick["channels"] or 1),
        min_hours_covered=float(pick["hours_covered"] or 0.0),
        max_hours_since_last=pick["hours_since_last"],
        rule=rule, study=study)


def rule_text(where: str) -> str:
    """The rule in words, with where it was applied."""
    return (f"per way of removing data, the least data at which validation AUROC stays within "
            f"{AUROC_DROP:g} of the full stays' and ECE at most {MAX_ECE:g} ({where})")


#: A group of (stay, hour) rows is judged only with at least this many of each outcome.
MIN_PER_OUTCOME = 10


def study_by_level(y: np.ndarray, risk: np.ndarray, held: dict[str, np.ndarray]) -> Study:
    """`choose`'s input from stays as they are, not degraded: for each way and level, the rows
    that a minimum at that level keeps and the next level (more data) would not, i.e. the rows
    holding that much data (`held[how]`, one value per row; NaN gap: nothing observed). A level
    whose rows hold fewer than MIN_PER_OUTCOME of either outcome is left out (no evidence)."""
    from scehr.training.calibration import expected_calibration_error
    from scehr.training.metrics import auroc

    def row(level: float, keep: np.ndarray) -> dict[str, Any] | None:
        pos = int((y[keep] > 0.5).sum())
        if min(pos, int(keep.sum()) - pos) < MIN_PER_OUTCOME:
            return None
        return {"level": level, "n": int(keep.sum()), "auroc": float(auroc(y[keep], risk[keep])),
                "ece": float(expected_calibration_error(y[keep], risk[keep]))}

    res: Study = {"full": [row(0, np.ones(len(y), dtype=bool)) or
                           {"level": 0, "n": len(y), "auroc": float("nan"), "ece": float("nan")}]}
    for how, levels in LEVELS.items():
        v = held[how]
        if how in GROWING:
            lv = [0.0, *levels] if how == "hours_covered" else levels  # a span of 0 h is data
            uppers = [*lv[1:], np.inf]
            groups = [(a, (v >= a) & (v < b)) for a, b in zip(lv, uppers, strict=True)]
        else:  # gaps, largest first: a gap g keeps rows whose last observation is within g h
            lowers = [*levels[1:], -np.inf]
            groups = [(g, (v <= g) & (v > b)) for g, b in zip(levels, lowers, strict=True)]
        res[how] = [r for r in (row(a, k) for a, k in groups) if r is not None]
    return res


def split_observations(roots: list[Path], a: SplitArrays) -> Observations:
    """The observations of split `a`'s stays (stay i = a.stays[i]) as read from its data
    folders, cleaned as the service cleans them: what a data minimum counts."""
    from scehr.training.data.layout import task_dir
    from scehr.training.data.reader import read_timeseries, resolve_split

    dirs = [resolve_split(task_dir(r, a.task), a.task, a.split).files_dir for r in roots]
    paths = [next((d / s for d in dirs if (d / s).exists()), dirs[0] / s) for s in a.stays]
    obs, _ = read_timeseries(paths, a.feature_set, progress=False)
    return obs
