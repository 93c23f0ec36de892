"""What a site model says about itself: the figures measured at the site, and where they and
its maps come from.

`scehr recalibrate` refits a shipped model's calibration map, uncertainty map and operating
points on part of a site's stays and measures the result on the rest. It writes this record
as `metrics["site"]` of the site model's manifest, and moves the parent's own test figures to
`metrics["parent"]`, so that nothing reading the manifest (`GET /models`, `scehr models list`,
the model card) can take the parent's figures for the site's. Both sides read it: training
writes it, the model index and the card show it, the service returns it with the metrics.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scehr.schemas.manifest import Interval

#: Where a site model keeps this record, and the parent's own figures, in `Manifest.metrics`.
SITE_KEY = "site"
PARENT_KEY = "parent"


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SitePart(_S):
    """One part of the site's stays."""

    n: int = Field(description="Stays in the part")
    positives: int = Field(description="Of which with the outcome")
    scored: int = Field(description="Stays meeting the data minimum (the rest abstain)")
    scored_positives: int = Field(description="Of which with the outcome")


class SiteSplit(_S):
    """How the site's stays were divided: seeded, stratified, written down."""

    rule: str = Field(description="The split in words")
    seed: int
    holdout_fraction: float
    file: str = Field(description="The file of the site model's folder listing each stay's "
                      "part (stay file names only)")
    fit: SitePart = Field(description="Stays the maps and points were fitted on")
    held_out: SitePart = Field(description="Stays the figures were measured on")


class SiteProvenance(_S):
    parent: str = Field(description="The model recalibrated: name and version")
    parent_manifest_sha256: str
    data: str = Field(description="The site's dataset folder, by name")
    data_sha256: str = Field(description="sha256 of the site's stays as the model reads them "
                             "(names, outcomes, tensors, demographics), in name order")
    stays: int
    positives: int
    below_minimum: int = Field(description="Stays below the data minimum (never fitted on)")
    split: SiteSplit


class SiteFigures(_S):
    """One model's figures on the site's held-out stays, with 95 % bootstrap CIs."""

    model: str = Field(description="Which model these are of (name and version)")
    on: str = Field(description="Which stays, in words")
    n: int = Field(description="Held-out stays")
    scored: int = Field(description="Of which meeting the data minimum, scored")
    positives: int = Field(description="Scored stays with the outcome")
    abstention_rate: Interval = Field(description="Share of held-out stays below the minimum")
    auroc: Interval
    auprc: Interval
    ece: Interval = Field(description="Expected calibration error of the risk, 10 bins")
    level: float | None = Field(None, description="Nominal coverage of the outcome sets "
                                "(None: the model serves none)")
    coverage: Interval | None = Field(None, description="Share of scored stays whose outcome "
                                      "is in their set")
    coverage_with_outcome: Interval | None = None
    coverage_without_outcome: Interval | None = None
    alert_rates: dict[str, Interval] = Field(
        default_factory=dict, description="Per served named point: share of scored stays "
        "alerted")


class SiteRecalibration(_S):
    """`metrics["site"]` of a site model."""

    figures: SiteFigures = Field(description="The site model on the held-out stays")
    parent_figures: SiteFigures = Field(description="The parent, as shipped, on the same "
                                        "stays")
    provenance: SiteProvenance
    changes: list[str] = Field(description="What differs from the parent, in words")


def site_record(metrics: dict[str, Any]) -> SiteRecalibration | None:
    """The site record of a manifest's metrics (None: not a site model)."""
    raw = metrics.get(SITE_KEY)
    return SiteRecalibration.model_validate(raw) if isinstance(raw, dict) else None
