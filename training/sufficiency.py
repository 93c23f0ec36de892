"""How a model's data minimum is chosen on validation: the one study and rule, shared by the
48-hour sufficiency study (`benchmarks/sufficiency_study.py`) and a landmark model's export
(each band's validation stays truncated at its first hour), so both minimums mean the same
thing. Validation stays have data removed (`degrade`) in four ways at several levels.

`choose` reads figures per way of removing data and level ({"level", "auroc", "ece"} rows, plus
the reference "full" row) and keeps, per way, the least data from which every level with more
data is acceptable: AUROC within `AUROC_DROP` of the reference and ECE at most `MAX_ECE`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.sufficiency import DESCRIPTORS, DataMinimum
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


#: The study's seed (which observations and variables are kept).
SEED = 0


def _ranked(obs: Observations, key: np.ndarray) -> np.ndarray:
    """Rank of each row within its stay by `key` (0 = smallest)."""
    order = np.lexsort((key, obs.stay))
    rank = np.empty(len(obs), dtype=np.int64)
    starts = np.searchsorted(obs.stay[order], obs.stay[order])
    rank[order] = np.arange(len(obs)) - starts
    return rank


def degrade(obs: Observations, fs: FeatureSet, how: str, level: float, window: float,
            rng: np.random.Generator) -> Observations:
    """`obs` with data removed as `how` at `level`; descriptors always stay."""
    desc = np.isin(np.asarray(fs.variable_ids)[obs.channel], list(DESCRIPTORS))
    inside = (obs.time <= window + 1e-6) & ~desc
    if how == "observations":
        rank = _ranked(obs, np.where(inside, rng.random(len(obs)), 2.0))
        keep = inside & (rank < level)
    elif how == "channels":
        score = rng.random((obs.n_stays, fs.n_channels))
        seen = np.zeros((obs.n_stays, fs.n_channels), dtype=bool)
        seen[obs.stay[inside], obs.channel[inside]] = True
        score[~seen] = 2.0
        order = np.argsort(score, axis=1).argsort(axis=1)  # rank of each channel per stay
        keep = inside & (order[obs.stay, obs.channel] < level)
    elif how == "hours_covered":
        keep = inside & (obs.time >= window - level - 1e-6)
    elif how == "hours_since_last":
        keep = inside & (obs.time <= window - level + 1e-6)
    else:
        raise ValueError(how)
    return obs.take(keep | desc)


def figures(y: np.ndarray, risk: np.ndarray) -> dict[str, float]:
    """The figures the rule reads: AUROC and ECE."""
    from scehr.training.calibration import expected_calibration_error
    from scehr.training.metrics import auroc

    return {"auroc": float(auroc(y, risk)), "ece": float(expected_calibration_error(y, risk))}


def split_observations(roots: list[Path], a: SplitArrays) -> Observations:
    """The observations of split `a`'s stays (stay i = a.stays[i]) as read from its data
    folders, cleaned as the service cleans them: what a data minimum counts."""
    from scehr.training.data.layout import task_dir
    from scehr.training.data.reader import read_timeseries, resolve_split

    dirs = [resolve_split(task_dir(r, a.task), a.task, a.split).files_dir for r in roots]
    paths = [next((d / s for d in dirs if (d / s).exists()), dirs[0] / s) for s in a.stays]
    obs, _ = read_timeseries(paths, a.feature_set, progress=False)
    return obs
