"""The screen of screened occlusion: which observed channels of a stay get an exact occlusion
row when contributions are asked for at `explain=top`.

Exact occlusion runs one model row per observed channel (a median of 29 on PhysioNet 2012);
the screen predicts each observed channel's |Δrisk| from statistics of its own columns in the
prepared (normalised) tensor, a per-channel linear model, and only the `candidates` channels it
ranks highest are occluded exactly. The deltas shown are exact; a true top-3 channel outside
the candidates is the only possible miss, and the share of validation stays where that never
happens is recorded with the screen (`ExplanationScreen.validation`).

Numpy only, per stay on its own: a stay's features and candidates are the same whichever batch
it came in. The section is data of a model version (manifest contract 1.6).
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from scehr.schemas.featureset import FeatureSet

#: Knots of the hinge features: an abnormal value's effect is rarely linear in its distance
#: from normal (either side of it).
KNOTS: Final = (0.5, 1.0, 2.0)
#: The version of the feature definition below: a screen's coefficients are read against it.
FEATURES_VERSION: Final = "channel-stats-1"
#: Per observed channel, in this order (d: the channel's value columns minus their value when
#: nothing is observed, normalised space, summed over a categorical channel's columns).
FEATURE_NAMES: Final = (
    "bias",
    "log1p(observed steps)",
    "steps since the last observation / length",
    "mean |d| over steps",
    "|d| at the last step",
    "d at the last step",
    "max d over steps",
    "min d over steps",
    "mean d over observed steps",
    "(d at the last step)^2",
    "(mean d over observed steps)^2",
    "max |d| over steps",
    *(f"max(0, {v} - {k:g})" for v in ("d last", "mean d observed", "max d") for k in KNOTS),
    *(f"max(0, -{v} - {k:g})" for v in ("d last", "mean d observed", "min d") for k in KNOTS),
)
#: The notice of a stay whose contributions were screened (about the method, not the data).
SCREENED_NOTICE: Final = "contributions_screened"
#: How the rows' budget is counted: a lone stay's run is padded to a multiple of this.
ROW_BLOCK: Final = 4


class ExplanationScreen(BaseModel):
    """Manifest contract 1.6: the screen of `explain=top` (absent: exact occlusion of every
    observed channel). A one-class model only: its top contributions are of that class."""

    model_config = ConfigDict(extra="forbid")

    features: Literal["channel-stats-1"] = Field(
        description="The feature definition version (scehr.schemas.explanation_screen)")
    candidates: int = Field(ge=1, description="Observed channels occluded exactly per stay (m): "
                            "the ones the screen ranks highest")
    coefficients: list[list[float]] = Field(
        description="[channels, features]: the predicted |Δrisk| of occluding each channel "
        "is its features times its row")
    target: str = Field(description="What the linear model was fitted to")
    fitted_on: str = Field(description="The stays the coefficients were fitted on")
    chosen_on: str = Field(description="The stays the features and m were chosen on")
    validation: dict[str, float] = Field(
        description="Per m tried: the share of the chosen-on stays whose whole exact top 3 "
        "was among the m candidates")
    onnx_sha256: str = Field(description="The graph whose occlusion deltas it was fitted on")

    @model_validator(mode="after")
    def _rows_match_the_features(self) -> ExplanationScreen:
        bad = [i for i, r in enumerate(self.coefficients) if len(r) != len(FEATURE_NAMES)]
        if bad:
            raise ValueError(f"explanation_screen.coefficients[{bad[0]}] must have "
                             f"{len(FEATURE_NAMES)} values (one per feature of "
                             f"{FEATURES_VERSION}), got {len(self.coefficients[bad[0]])}")
        return self


def channel_features(x: np.ndarray, unobserved: np.ndarray, length: int, chans: np.ndarray,
                     fs: FeatureSet) -> np.ndarray:
    """[len(chans), len(FEATURE_NAMES)] features of one stay's observed channels `chans`,
    from its normalised tensor `x` [T, F] and the same stay with nothing observed."""
    n_val = fs.n_value_columns
    t = max(int(length), 1)
    d_cols = (x[:t, :n_val] - unobserved[:t, :n_val]).astype(np.float64)
    d = np.add.reduceat(d_cols, fs.begins, axis=1)[:, chans]  # [t, k] per channel
    ad = np.add.reduceat(np.abs(d_cols), fs.begins, axis=1)[:, chans]
    mask = x[:t, n_val + chans] > 0  # [t, k]
    count = mask.sum(axis=0)
    last = t - 1 - np.argmax(mask[::-1], axis=0)  # last observed step (0 when never)
    since = np.where(count > 0, (t - 1 - last) / t, 1.0)
    mean_obs = (d * mask).sum(axis=0) / np.maximum(count, 1)
    d_max, d_min = d.max(axis=0), d.min(axis=0)
    hinges = [np.maximum(v - k, 0.0) for v in (d[-1], mean_obs, d_max) for k in KNOTS]
    hinges += [np.maximum(-v - k, 0.0) for v in (d[-1], mean_obs, d_min) for k in KNOTS]
    return np.stack([np.ones(len(chans)), np.log1p(count), since, ad.mean(axis=0), ad[-1],
                     d[-1], d_max, d_min, mean_obs, d[-1] ** 2, mean_obs ** 2, ad.max(axis=0),
                     *hinges], axis=1)


def rank_channels(features: np.ndarray, chans: np.ndarray, coefficients: np.ndarray
                  ) -> np.ndarray:
    """`chans` ordered by predicted |Δrisk|, highest first (ties: lower channel first)."""
    score = (features * coefficients[chans]).sum(axis=1)
    return chans[np.argsort(-score, kind="stable")]


def candidates(x: np.ndarray, unobserved: np.ndarray, length: int, chans: np.ndarray,
               fs: FeatureSet, coefficients: np.ndarray, m: int) -> np.ndarray:
    """The channels of `chans` one stay occludes exactly: all of them when there are at most
    `m`, else the `m` ranked highest, in ascending order as exact occlusion lists them."""
    if len(chans) <= m:
        return chans
    ranked = rank_channels(channel_features(x, unobserved, length, chans, fs), chans,
                           coefficients)
    return np.sort(ranked[:m])
