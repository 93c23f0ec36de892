"""A site model: a shipped model recalibrated on a site's own stays into a complete model.

`scehr recalibrate` keeps the shipped ONNX graph and refits everything a served risk carries
on the site's stays, by the methods the shipped models were built with:

- the split: every stay of the site's dataset (all its splits together) is assigned, seeded
  and stratified by outcome and by whether it meets the data minimum, to a fitting part or a
  held-out part (`HOLDOUT_FRACTION`); the assignment is written down (`SPLIT_FILE`);
- on the fitting part's stays that meet the minimum (the others are never given a risk): the
  calibration map (the parent's, none, temperature, Platt or isotonic, whichever has the best
  cross-validated Brier score, refitted on the whole part), the uncertainty map
  (`scehr.training.uncertainty.fit_uncertainty`, Venn-Abers + Mondrian conformal, at the
  parent's level: both read ranks, so fitting them where the map was fitted keeps their
  guarantees), the named points (`named_point_rules`, screened by
  `scehr.training.operating_points.screen`: a point the site cannot support is withheld with
  its reason) and the levels, which name only served points; the data minimum is the parent's;
- on the held-out part: the site model's figures and the parent's on the same stays
  (`scehr.schemas.site`), with 95 % bootstrap CIs, written into the manifest and the card.

A site with fewer than `MIN_SITE_EVENTS` stays with the outcome (or without) among those that
meet the minimum is refused: there would be too few to fit the maps and to check them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.manifest import Calibration, ClassCard, Interval, Manifest, sha256_file
from scehr.schemas.model_index import add_model, entry_for, refuse_existing
from scehr.schemas.site import (
    PARENT_KEY,
    SITE_KEY,
    SiteFigures,
    SitePart,
    SiteProvenance,
    SiteRecalibration,
    SiteSplit,
)
from scehr.schemas.sufficiency import shortfalls, summarize
from scehr.schemas.tasks import task_spec
from scehr.schemas.uncertainty import LEVELS
from scehr.training.bootstrap import bootstrap_ci
from scehr.training.calibration import brier, expected_calibration_error, named_point_rules
from scehr.training.data.layout import task_dir
from scehr.training.data.reader import read_timeseries, resolve_split
from scehr.training.data.splits import SplitArrays
from scehr.training.external import SPLITS, ExportedModel, Scored
from scehr.training.metrics import auprc, auroc
from scehr.training.operating_points import screen, with_points
from scehr.training.uncertainty import fit_uncertainty

#: The share of the site's stays held out of every fit to measure the site model on.
HOLDOUT_FRACTION = 0.3
#: Stays with the outcome, and stays without, that a site needs among those meeting the data
#: minimum: with 30 % held out, at least 28 to fit the maps and choose the points on (the
#: points need 10, the 90 % conformal set 9) and 12 to check them.
MIN_SITE_EVENTS = 40
#: Folds of the cross-validation that chooses the calibration map on the fitting part.
CV_FOLDS = 5
#: The file of a site model's folder that lists each stay's part.
SPLIT_FILE = "site_split.csv"


class SiteTooSmall(ValueError):
    """The site has too few stays of one outcome to refit the model's maps."""


@dataclass
class SiteStays:
    """Every stay of a site, scored by the parent model."""

    names: np.ndarray  # "<split>/<stay file>", unique
    scored: Scored
    meets: np.ndarray  # bool: meets the parent's data minimum
    digest: str  # sha256 of the stays as the model reads them

    def take(self, index: np.ndarray) -> SiteStays:
        """The stays at `index` (indices or a boolean mask); the digest is recomputed only by
        `read_site`, so a subset names its source's."""
        return SiteStays(self.names[index], self.scored.take(index), self.meets[index],
                         self.digest)


def meets_minimum(model: ExportedModel, data: Path, a: SplitArrays) -> np.ndarray:
    """Per stay of split `a`, whether it meets the model's data minimum: its observations
    counted inside the window as the service counts them (`scehr.schemas.sufficiency`)."""
    minimum = model.manifest.data_minimum
    if minimum is None:
        return np.ones(len(a), dtype=bool)
    spec = resolve_split(task_dir(data, a.task), a.task, a.split)
    obs, _ = read_timeseries([spec.files_dir / s for s in a.stays], model.fs, progress=False)
    return np.array([not shortfalls(s, minimum)
                     for s in summarize(obs, a.end_hours, model.fs)], dtype=bool)


def _digest(parts: list[tuple[str, SplitArrays]]) -> str:
    """sha256 over the stays in name order: name, outcomes, tensor and demographics."""
    rows = []
    for split, a in parts:
        for i, stay in enumerate(a.stays):
            h = hashlib.sha256(f"{split}/{stay}".encode())
            for arr in (a.y[i], a.x[i, : a.lengths[i]], a.static_raw[i]):
                h.update(np.ascontiguousarray(arr).tobytes())
            rows.append((f"{split}/{stay}", h.digest()))
    total = hashlib.sha256()
    for _, d in sorted(rows):
        total.update(d)
    return total.hexdigest()


def read_site(model: ExportedModel, data: Path) -> SiteStays:
    """Every stay of the site's dataset (its train, val and test splits together), scored."""
    parts = [(s, model.load(data, s)) for s in SPLITS]
    parts = [(s, a) for s, a in parts if len(a)]
    if not parts:
        raise SiteTooSmall(f"{data} holds no stays")
    return SiteStays(
        names=np.concatenate([np.char.add(f"{s}/", a.stays.astype(str)) for s, a in parts]),
        scored=Scored.concat([model.score(a) for _, a in parts]),
        meets=np.concatenate([meets_minimum(model, data, a) for _, a in parts]),
        digest=_digest(parts))


def check_enough(stays: SiteStays, where: str) -> None:
    """Refuse a site with fewer than MIN_SITE_EVENTS stays of either outcome among those
    meeting the minimum, naming the minimum."""
    y = stays.scored.y[stays.meets] > 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if min(pos, neg) < MIN_SITE_EVENTS:
        raise SiteTooSmall(
            f"{where}: {pos} stays with the outcome and {neg} without among the {y.size} of "
            f"{len(stays.names)} that meet the model's data minimum; recalibration needs at "
            f"least {MIN_SITE_EVENTS} of each ({1 - HOLDOUT_FRACTION:.0%} to fit the maps and "
            f"choose the points on, {HOLDOUT_FRACTION:.0%} to check them). Bring more stays, "
            "or measure the shipped model as it is with `scehr evaluate`")


def split_site(stays: SiteStays, seed: int, fraction: float = HOLDOUT_FRACTION
               ) -> np.ndarray:
    """Bool per stay: held out. Within each (outcome, meets the minimum) stratum, taken in
    stay-name order (so the file order does not matter), a seeded permutation holds out
    round(fraction * n) stays."""
    y = stays.scored.y > 0.5
    order = np.argsort(stays.names, kind="stable")
    rng = np.random.default_rng(seed)
    held = np.zeros(len(stays.names), dtype=bool)
    for outcome in (False, True):
        for meets in (False, True):
            idx = order[(y[order] == outcome) & (stays.meets[order] == meets)]
            held[rng.permutation(idx)[: round(fraction * idx.size)]] = True
    return held


def _folds(y: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold 0..k-1 per stay, stratified by outcome, seeded."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=int)
    for outcome in (False, True):
        idx = rng.permutation(np.flatnonzero((y > 0.5) == outcome))
        fold[idx] = np.arange(idx.size) % k
    return fold


def choose_calibration(model: ExportedModel, fit: Scored, where: str, seed: int
                       ) -> Calibration:
    """The parent's map, no map, or a temperature, Platt or isotonic map refitted on `fit`:
    the one with the best CV_FOLDS-fold cross-validated Brier score (in that order on a tie)
    among those that keep the ranking of `fit`'s scores (`keeps_ranking`), then refitted on all
    of `fit`. ECE before: the parent's map on `fit`; after: the chosen
    map's out-of-fold risks, which no map saw when fitted."""
    from scehr.training.losses import calibration_input
    from scehr.training.serving_assets import calibration_candidates, keeps_ranking

    kind = calibration_input(model.manifest.loss.name)
    y, p, m = fit.y, fit.probability, fit.margin
    parent = model.card.calibration
    full = [parent, *calibration_candidates((y, p, m), where, kind)]
    ranks = np.array([keeps_ranking(c, p, m) for c in full])  # only maps that keep the ranking
    fold = _folds(y, CV_FOLDS, seed)
    oof = np.empty((5, len(y)))
    for k in range(CV_FOLDS):
        out = fold == k
        maps = [parent, *calibration_candidates((y[~out], p[~out], m[~out]), where, kind)]
        for i, c in enumerate(maps):
            oof[i, out] = c.apply(p[out], m[out])
    best = int(np.argmin([brier(y, r) if ok else np.inf for r, ok in zip(oof, ranks,
                                                                        strict=True)]))
    chosen = full[best]
    among = (f"the best {CV_FOLDS}-fold cross-validated Brier score on {where} among the "
             "parent's map, no map, temperature, Platt and isotonic maps")
    how = (f"{where}: {among}, refitted on all of it" if best else
           f"{parent.fitted_on}: the parent's map, kept, as it had {among}")
    return chosen.model_copy(update={
        "fitted_on": how, "ece_before": expected_calibration_error(y, fit.risk),
        "ece_after": expected_calibration_error(y, oof[best])})


def _ci(fn: Callable[[np.ndarray, np.ndarray], float], y: np.ndarray, x: np.ndarray,
        n_boot: int, seed: int) -> Interval:
    d = bootstrap_ci(fn, y, x, n_boot=n_boot, seed=seed)
    return Interval(value=d["value"], low=d["low"], high=d["high"])


def _share(mask_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]
           ) -> Callable[[np.ndarray, np.ndarray], float]:
    """A bootstrap metric: the share of stays where `mask_fn(y, x)` holds (NaN: none)."""
    def fn(y: np.ndarray, x: np.ndarray) -> float:
        m = mask_fn(y, x)
        return float(m.mean()) if m.size else float("nan")
    return fn


def site_figures(card: ClassCard, model: str, on: str, y: np.ndarray, risk: np.ndarray,
                 abstained: int, n_boot: int, seed: int = 0) -> SiteFigures:
    """`card`'s figures on scored held-out stays (y, its risk), `abstained` more held out."""
    n = len(y) + abstained
    gone = np.r_[np.zeros(len(y)), np.ones(abstained)]
    u = card.uncertainty

    def covered(mask: Callable[[np.ndarray], np.ndarray]) -> Interval | None:
        if u is None:
            return None
        return _ci(lambda yy, r: (float(u.covered(yy, r)[mask(yy)].mean())
                                  if mask(yy).any() else float("nan")), y, risk, n_boot, seed)

    return SiteFigures(
        model=model, on=on, n=n, scored=len(y), positives=int(y.sum()),
        abstention_rate=_ci(_share(lambda _, g: g > 0.5), gone, gone, n_boot, seed),
        auroc=_ci(auroc, y, risk, n_boot, seed), auprc=_ci(auprc, y, risk, n_boot, seed),
        ece=_ci(expected_calibration_error, y, risk, n_boot, seed),
        level=None if u is None else u.level,
        coverage=covered(lambda yy: np.ones(len(yy), dtype=bool)),
        coverage_with_outcome=covered(lambda yy: yy > 0.5),
        coverage_without_outcome=covered(lambda yy: yy <= 0.5),
        alert_rates={p.name: _ci(_share(lambda _, r, t=p.threshold: r >= t), y, risk, n_boot,
                                 seed) for p in card.named_points})


def _map_in_words(c: Calibration) -> str:
    params = {"temperature": f"T = {c.temperature:.3g}" if c.temperature else "",
              "platt": f"slope {c.slope or 0:.3g}, intercept {c.intercept or 0:.3g}",
              "isotonic": f"{len(c.x or [])} knots", "none": "the model's own probability"}
    return f"{c.method} ({params[c.method]})".replace(" ()", "")


def _pct(i: Interval | None) -> str:
    return "n/a" if i is None or i.value is None else f"{100 * i.value:.1f} %"


def changes(parent: ClassCard, site: ClassCard, before: SiteFigures, after: SiteFigures,
            minimum: bool) -> list[str]:
    """What the site model changes against its parent, in words, with the held-out figures
    of both on the same stays; `minimum`: whether the parent declares a data minimum."""
    out = []
    same_map = site.calibration.model_copy(update={"fitted_on": "", "ece_before": None,
                                                   "ece_after": None}) == \
        parent.calibration.model_copy(update={"fitted_on": "", "ece_before": None,
                                              "ece_after": None})
    out.append("calibration: " + (f"kept {_map_in_words(parent.calibration)}" if same_map else
                                  f"{_map_in_words(parent.calibration)} -> "
                                  f"{_map_in_words(site.calibration)}")
               + f"; held-out ECE {before.ece.value:.3f} -> {after.ece.value:.3f}, AUROC "
               f"{before.auroc.value:.3f} -> {after.auroc.value:.3f}")
    was = {p.name: p for p in parent.named_points}
    now = {p.name: p for p in site.named_points}
    why = {w.name: w.reason for w in site.withheld_points}
    for name in dict.fromkeys([*was, *now, *why]):
        old = f"{was[name].threshold:.3f}" if name in was else "not served"
        new = f"{now[name].threshold:.3f}" if name in now else f"withheld ({why.get(name)})"
        rates = (f"; held-out alert rate {_pct(before.alert_rates.get(name))} -> "
                 f"{_pct(after.alert_rates.get(name))}") if name in now else ""
        out.append(f"point {name}: {old} -> {new}{rates}")
    if site.default_operating_point != parent.default_operating_point:
        out.append(f"default point: {parent.default_operating_point} -> "
                   f"{site.default_operating_point}")
    lv = [(c.levels.warning, c.levels.critical) if c.levels else (None, None)
          for c in (parent, site)]
    out.append(f"levels (warning, critical): {lv[0][0]}, {lv[0][1]} -> {lv[1][0]}, {lv[1][1]}"
               if lv[0] != lv[1] else f"levels (warning, critical): kept {lv[1][0]}, "
               f"{lv[1][1]}")
    if after.level is not None:
        out.append(f"{after.level:.0%} outcome sets on the held-out stays: coverage "
                   f"{_pct(before.coverage)} -> {_pct(after.coverage)}; with the outcome "
                   f"{_pct(before.coverage_with_outcome)} -> "
                   f"{_pct(after.coverage_with_outcome)}")
    out.append(f"data minimum: the parent's, kept ({_pct(after.abstention_rate)} of held-out "
               "stays abstain)" if minimum else "data minimum: none (the parent declares none)")
    return out


def _part(stays: SiteStays, mask: np.ndarray) -> SitePart:
    y = stays.scored.y[mask] > 0.5
    m = stays.meets[mask]
    return SitePart(n=int(mask.sum()), positives=int(y.sum()), scored=int(m.sum()),
                    scored_positives=int((y & m).sum()))


@dataclass
class SiteModel:
    """A fitted site model: its class card, its record (`metrics["site"]`), the split."""

    card: ClassCard
    record: SiteRecalibration
    held_out: np.ndarray  # bool per stay


def fit_site_model(model: ExportedModel, stays: SiteStays, data_name: str, *, seed: int = 0,
                   holdout: float = HOLDOUT_FRACTION, n_boot: int = 1000) -> SiteModel:
    """Split the site's stays, refit the card on the fitting part, measure on the held-out
    part (see the module docstring). Raises SiteTooSmall below MIN_SITE_EVENTS."""
    from scehr.training.drift_reference import risk_reference
    from scehr.training.serving_assets import named_points

    check_enough(stays, data_name)
    held = split_site(stays, seed, holdout)
    fit, test = stays.scored.take(~held & stays.meets), stays.scored.take(held & stays.meets)
    part = (f"the fitting part of {data_name} ({len(fit.y)} stays meeting the data minimum, "
            f"{int(fit.y.sum())} with the outcome)")
    cal = choose_calibration(model, fit, part, seed)
    rf, rt = cal.apply(fit.probability, fit.margin), cal.apply(test.probability, test.margin)
    parent = model.card
    levels = (parent.uncertainty.level,) if parent.uncertainty is not None else LEVELS
    unc = fit_uncertainty((fit.y, rf), (fit.y, rf), f"{part}; level: the parent's"
                          if parent.uncertainty is not None else part, levels=levels,
                          test=(test.y, rt), names=("site fitting part", "site held-out part"))
    on = "site fitting-part"
    kept, withheld = screen(named_points((fit.y, rf), (test.y, rt)), int(fit.y.sum()),
                            float(rf.min()), unmet=named_point_rules(fit.y, rf, on)[1], on=on)
    card = with_points(parent.model_copy(update={
        "calibration": cal, "uncertainty": unc, "risk_reference": risk_reference(rf)}),
        kept, withheld)
    m = model.manifest
    abstained = int((held & ~stays.meets).sum())
    held_on = (f"the held-out part of {data_name}: {int(held.sum())} stays, never fitted on "
          f"({abstained} below the data minimum)")
    site_name = f"{m.name} {m.version} recalibrated on {data_name}"
    before = site_figures(parent, f"{m.name} {m.version}", held_on, test.y, test.risk,
                          abstained, n_boot, seed)
    after = site_figures(card, site_name, held_on, test.y, rt, abstained, n_boot, seed)
    split = SiteSplit(
        rule=(f"every stay of {data_name} (its splits together), in stay-name order, "
              f"stratified by outcome and by meeting the data minimum; a seeded permutation "
              f"holds out {holdout:.0%} of each stratum"),
        seed=seed, holdout_fraction=holdout, file=SPLIT_FILE, fit=_part(stays, ~held),
        held_out=_part(stays, held))
    prov = SiteProvenance(
        parent=f"{m.name} {m.version}", parent_manifest_sha256=sha256_file(
            model.folder / "manifest.json"), data=data_name, data_sha256=stays.digest,
        stays=len(stays.names), positives=int(stays.scored.y.sum()),
        below_minimum=int((~stays.meets).sum()), split=split)
    record = SiteRecalibration(figures=after, parent_figures=before, provenance=prov,
                               changes=changes(parent, card, before, after,
                                               m.data_minimum is not None))
    return SiteModel(card, record, held)


def site_manifest(model: ExportedModel, fitted: SiteModel, version: str) -> Manifest:
    """The site model's manifest: the parent's, with the refitted card, the site's record
    as `metrics["site"]` and the parent's figures moved to `metrics["parent"]`."""
    from scehr.training.export import code_version

    m = model.manifest
    note = (f"site model: {m.name} {m.version} recalibrated with scehr recalibrate on "
            f"{fitted.record.provenance.data} (the ONNX graph is unchanged); in its point "
            "rules and withheld reasons, 'validation' is the site's fitting part")
    parent: dict[str, Any] = {"model": f"{m.name} {m.version}",
                              "on": f"{m.name} {m.version} on its own test set, "
                              f"{m.provenance.dataset}: not on this site", **m.metrics}
    return m.model_copy(update={
        "contract_version": CONTRACT_VERSION, "version": version,
        "classes": [fitted.card, *m.classes[1:]],
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "code_version": code_version(), "notes": [*m.notes, note],
        "metrics": {SITE_KEY: fitted.record.model_dump(mode="json"), PARENT_KEY: parent}})


def write_split(path: Path, stays: SiteStays, held: np.ndarray) -> None:
    """`stay,part,meets_minimum` per stay, in name order (names only, no values)."""
    order = np.argsort(stays.names, kind="stable")
    lines = ["stay,part,meets_minimum"] + [
        f"{stays.names[i]},{'held_out' if held[i] else 'fit'},{int(stays.meets[i])}"
        for i in order]
    path.write_text("\n".join(lines) + "\n")


def recalibrate(folder: Path, data: Path, out: Path, version: str | None = None, *,
                seed: int = 0, holdout: float = HOLDOUT_FRACTION, n_boot: int = 1000
                ) -> tuple[Path, SiteRecalibration, list[str]]:
    """Write the site model of `folder` on `data` as a new version in `out` (registered in
    `<out>/../../index.json`; the shipped folder is never modified): (folder, record, what
    the index says changed)."""
    from scehr.training.export import manifest_json
    from scehr.training.model_card import write_model_card
    from scehr.training.site_report import REPORT_FOLDER, write_report

    model = ExportedModel(folder)
    version = version or out.name
    refuse_existing(out.parent.parent, model.manifest.task, version, out)
    stays = read_site(model, data)
    fitted = fit_site_model(model, stays, Path(data).name, seed=seed, holdout=holdout,
                            n_boot=n_boot)
    new = site_manifest(model, fitted, version)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model.folder / "model.onnx", out / "model.onnx")
    (out / "manifest.json").write_text(manifest_json(new))
    write_split(out / SPLIT_FILE, stays, fitted.held_out)
    write_model_card(out, new, f"scehr recalibrate {folder} --data {data} --out {out} "
                     f"--seed {seed}", [new.notes[-1]])
    if task_spec(new.task).binary:  # the report beside the parent, on the held-out stays
        held = [str(n).split("/", 1)[1] for n in stays.names[fitted.held_out]]
        write_report(folder, data, out / REPORT_FOLDER, compare=out, stays=held,
                     n_boot=n_boot, seed=seed, command=f"scehr recalibrate {folder} --data "
                     f"{data} --out {out} --seed {seed}",
                     title=f"{new.task} {version} (site) against {model.manifest.version} on "
                     "the site's held-out part")
    index = add_model(out.parent.parent, entry_for(out, out.parent.parent, new),
                      set_default=False)
    return out, fitted.record, index
