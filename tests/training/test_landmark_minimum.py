"""A landmark band's data minimum is chosen on validation by the 48-hour study and rule
(`scehr.training.sufficiency`): validation stays truncated at the band's first hour, data
removed, the model run again; the served trajectory abstains below it."""

from __future__ import annotations

import numpy as np

from scehr.schemas.alert_policy import AlertPolicy
from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.manifest import Calibration, Trajectory
from scehr.schemas.sufficiency import counted
from scehr.schemas.tensorize import Observations
from scehr.training.landmark_assets import (
    HELD_FIELDS,
    MinimumStudy,
    band,
    band_minimum,
    below_minimum,
    held_by_hour,
)

FS = FEATURE_SETS["physionet2012-full"]
HOURS = 12
N = 1500


def known_validation(seed: int = 0) -> tuple[MinimumStudy, dict[str, np.ndarray]]:
    """1500 stays, each with 4 variables observed every hour (hours 0-12), and a "model" that
    knows a stay's true risk when it holds at least 5 observations up to the hour and says
    0.3 (the outcome rate) otherwise: the rule must ask for 5 observations."""
    rng = np.random.default_rng(seed)
    chans = np.flatnonzero(counted(FS))[:4]
    stay, ch, t = (a.ravel() for a in np.meshgrid(np.arange(N), chans, np.arange(HOURS + 1.0),
                                                  indexing="ij"))
    obs = Observations(stay, ch, t, np.ones(len(t)), N)
    p_true = rng.uniform(0.02, 0.98, N)
    y = (rng.random(N) < p_true).astype(float)

    def risk_at(o: Observations, hour: int) -> tuple[np.ndarray, np.ndarray]:
        keep = counted(FS)[o.channel] & (o.time <= hour)
        n = np.bincount(o.stay[keep], minlength=N)
        p = np.where(n >= 5, p_true, 0.3)
        return p, np.log(p / (1 - p))

    study = MinimumStudy(obs, FS, held_by_hour(obs, N, HOURS, FS), risk_at)
    inside = np.ones((N, HOURS), dtype=bool)
    inside[: N // 2, 8:] = False  # half the stays leave after hour 8
    p_rows = np.tile(p_true[:, None], (1, HOURS))
    val = {"probability": p_rows, "margin": np.log(p_rows / (1 - p_rows)), "y": y,
           "inside": inside}
    return study, val


IDENTITY = Calibration(method="none")


def test_the_band_minimum_is_the_least_data_the_validation_study_supports() -> None:
    study, val = known_validation()
    m = band_minimum(study, val, IDENTITY, 3, HOURS)
    assert m.min_observations == 5  # 1, 2 and 3 observations: AUROC 0.5, far below full
    assert m.min_channels == 2  # one variable up to hour 3 holds 4 observations only
    assert "validation's 1500 stays truncated at hour 3" in m.rule and "3-12" in m.rule
    v = m.validation
    assert v is not None and v.n == int(val["inside"][:, 2:].sum())  # the band's rows
    assert v.kept == v.n  # every row holds 4 variables, >= 12 observations, last within 1 h
    assert set(HELD_FIELDS) == set(study.held)


def test_only_the_stays_still_there_at_the_first_hour_count() -> None:
    study, val = known_validation()
    m = band_minimum(study, val, IDENTITY, 10, HOURS)
    assert "validation's 750 stays truncated at hour 10" in m.rule


def test_the_trajectory_abstains_at_the_hours_below_their_bands_minimum() -> None:
    study, val = known_validation()
    policy = AlertPolicy(threshold=0.5, silence_hours=0, realert_rise=1.0)
    traj = Trajectory(first_hour=2, last_hour=HOURS, alert_policy=policy,
                      bands=[band(val, val, val, study, 2, 5, "margin"),
                             band(val, val, val, study, 6, HOURS, "margin")])
    for b in traj.bands:
        assert b.data_minimum is not None and "validation" in b.data_minimum.rule
    below = below_minimum(traj, study.held)
    # 4 observations per hour from hour 0: hour 1 holds 8 (before the first band)
    held_obs = study.held["observations"]
    for h in range(2, HOURS + 1):
        m = traj.band(h).data_minimum
        assert m is not None
        np.testing.assert_array_equal(below[:, h - 1], held_obs[:, h - 1] < m.min_observations)
    assert not below[:, 0].any()
    # a stay that held less: its observations thinned to one variable
    thin = study.obs.take(study.obs.channel == study.obs.channel.min())
    below_thin = below_minimum(traj, held_by_hour(thin, N, HOURS, FS))
    first = traj.bands[0].data_minimum
    assert first is not None and first.min_channels == 2
    assert below_thin[:, 1:5].all()  # hours 2-5: one variable, the band needs two
