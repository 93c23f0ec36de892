"""A new version of a shipped model with the same ONNX graph and calibration: its operating
points screened by the defensible rule (`scehr.training.operating_points.screen`, from the
validation figures stored with each point), warning/critical levels, the data minimum of
the sufficiency study, and (with --uncertainty) the uncertainty map served with each risk.

    .venv/bin/python -m scehr.training.reissue models/mortality/1.2.0 models/mortality/1.2.1 \
        --data-minimum docs/sufficiency-mortality.json
    .venv/bin/python -m scehr.training.reissue models/mortality/1.2.1 models/mortality/1.2.2 \
        --uncertainty configs/default_mortality_full.toml --data data/physionet2012-full
    .venv/bin/python -m scehr.training.reissue models/mortality/1.3.1 models/mortality/1.3.2 \
        --points configs/default_mortality_ensemble.toml --data data/physionet2012-full

    .venv/bin/python -m scehr.training.reissue models/phenotypes/1.1.3 models/phenotypes/1.1.4 \
        --recalibrate configs/default_phenotypes.toml --data data/eicu-benchmark
    .venv/bin/python -m scehr.training.reissue models/mortality/1.3.2 models/mortality/1.3.3 \
        --explanation-screen runs/screen-mortality-1.3.2.json

--explanation-screen adds the screen of `explain=top` (`scehr.schemas.explanation_screen`),
fitted on the model's own graph by `python -m scehr.service.screen_fit` (refused when it was
fitted on another graph); the risk, points and figures are unchanged by it.

--uncertainty rebuilds the model's held-out calibration and validation splits from its
training config and data (checked against the manifest's recorded split sizes and
prevalences), scores them with the shipped ONNX graph and calibration map, and fits the map
with `scehr.training.uncertainty.fit_uncertainty`, the function export uses; the test and
validation figures of the card and the index are then computed on the served risk, the score's
beside them. A data minimum already in the shipped manifest is kept unless --data-minimum
replaces it.

--points rebuilds the validation and test splits the same way and chooses the named points
again with the current rule (`scehr.training.calibration.named_point_rules`) before screening
them; the map, the uncertainty map and the card figures stay the shipped ones.

--recalibrate (with --data) also refits each class's calibration map on the same held-out
calibration split, as export fits it (`scehr.training.serving_assets.fit_calibration`: maps that
keep the score's ranking, chosen on validation), and so everything read on the risk: the named
operating points (chosen on the new validation risks by the current rule, then screened), the
uncertainty map, the risk reference of drift monitoring, and the test figures of the card and
the index, which are then computed on the served risk with the score's beside them.

The shipped folder is never modified. Without --recalibrate the risk of every stay is
unchanged (same graph, same map); without --points or --recalibrate a kept point keeps its
threshold to the last bit, so the new version differs only in the alerts of withheld points and
in abstaining below the minimum.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.explanation_screen import ExplanationScreen
from scehr.schemas.manifest import ClassCard, Manifest, load_manifest, sha256_file
from scehr.schemas.model_index import add_model, entry_for, refuse_existing
from scehr.schemas.sufficiency import DataMinimum
from scehr.schemas.uncertainty import RiskUncertainty
from scehr.training.operating_points import screen, with_points
from scehr.training.uncertainty import UNCERTAINTY_WHERE, fit_uncertainty


def validation_positives(m: Manifest, c: int) -> int:
    """Validation stays with outcome `c`, from the manifest's provenance."""
    val = m.provenance.splits["val"]
    return round(val.n * val.prevalence[c])


def rescreen(card: ClassCard, positives: int) -> ClassCard:
    """One class card with its points screened, its default and levels set.

    A point an earlier issue already withheld keeps that reason: re-issuing a re-issued
    model must not turn "at the risk floor" into "cannot be met"."""
    kept, withheld = screen(card.named_points, positives)
    earlier = {w.name: w for w in card.withheld_points}
    return with_points(card, kept, [earlier.get(w.name, w) for w in withheld])


class SplitMismatch(ValueError):
    """The rebuilt held-out split is not the one the model was exported with."""


#: Per split name, (y [N, C], score [N, C], margin [N, C]) of a shipped model's stays.
HeldOut = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def held_out_outputs(folder: Path, config: Path, data: Path) -> HeldOut:
    """The calibration, validation and test splits of a shipped model, rebuilt from its
    training config and data (checked against the manifest's recorded sizes and outcome
    rates) and scored by its ONNX graph: labels, scores and margins."""
    from scehr.training.config import TrainConfig, load_config
    from scehr.training.external import ExportedModel
    from scehr.training.fit import prepare

    model = ExportedModel(folder, binary_only=False)
    if config.suffix == ".json":  # a run folder's config.json (TrainConfig.to_dict)
        cfg = TrainConfig(**{**json.loads(config.read_text()), "data": str(data)})
    else:
        cfg = load_config(config, data=str(data), task=model.manifest.task)
    cfg.stream = False  # the held-out splits are scored whole (their raw tensors)
    prep = prepare(cfg)
    if "calib" not in prep.raw:
        raise SplitMismatch(f"{config} holds out no calibration split: nothing to fit on")
    out: HeldOut = {}
    for split in ("calib", "val", "test"):
        a = prep.raw[split]
        rec = model.manifest.provenance.splits.get(split)
        got = np.round(a.y.mean(axis=0), 4)
        if rec is None or rec.n != len(a) or not np.allclose(got, rec.prevalence, atol=1e-4):
            raise SplitMismatch(
                f"the {split} split rebuilt from {config} and {data} has {len(a)} stays, "
                f"not the {rec.n if rec else 'unrecorded'} (with the same outcome rates) "
                f"that {folder} was exported with: give the model's own training config and "
                "data")
        out[split] = (np.asarray(a.y, dtype=np.float64), *model.outputs(a.x, a.lengths,
                                                                         a.static_raw))
    return out


def uncertainty_where(config: Path) -> str:
    """`RiskUncertainty.fitted_on` of a map fitted on splits rebuilt from `config`."""
    return UNCERTAINTY_WHERE.replace("split", f"split rebuilt from {config.name}", 1)


def fitted_uncertainty(m: Manifest, held: HeldOut, where: str) -> list[RiskUncertainty]:
    """Per class, the uncertainty map of the manifest's risk, fitted as export fits it: on the
    calibration split, its level chosen on the validation split, the test split scored."""
    def risk(split: str, c: int) -> tuple[np.ndarray, np.ndarray]:
        y, p, mg = held[split]
        return y[:, c], m.classes[c].calibration.apply(p[:, c], mg[:, c])

    return [fit_uncertainty(risk("calib", c), risk("val", c), where, test=risk("test", c))
            for c in range(len(m.classes))]


def held_out_uncertainty(folder: Path, config: Path, data: Path) -> list[RiskUncertainty]:
    """Per class, the uncertainty map of a shipped model, fitted as export fits it: on its
    calibration split (level chosen on its validation split), scored by its ONNX graph."""
    m = load_manifest(folder / "manifest.json")
    return fitted_uncertainty(m, held_out_outputs(folder, config, data),
                              uncertainty_where(config))


def recalibrated_cards(m: Manifest, held: HeldOut, where: str) -> list[ClassCard]:
    """Each class card with its calibration map refitted on the held-out calibration split (as
    export fits it, chosen on validation) and everything read on the risk refitted with it:
    named points (then screened), uncertainty map and the risk reference."""
    from scehr.training.drift_reference import risk_reference
    from scehr.training.losses import calibration_input
    from scehr.training.serving_assets import fit_calibration

    logistic_input = calibration_input(m.loss.name)
    cards = []
    for c, card in enumerate(m.classes):
        def col(split: str, c: int = c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            y, p, mg = held[split]
            return y[:, c], p[:, c], mg[:, c]

        fitted_on = card.calibration.fitted_on.split("; no map")[0]
        cal = fit_calibration(col("calib"), col("val"), fitted_on, logistic_input)
        risk = {s: (col(s)[0], cal.apply(*col(s)[1:])) for s in held}
        fresh = card.model_copy(update={
            "calibration": cal, "risk_reference": risk_reference(risk["val"][1]),
            "uncertainty": fit_uncertainty(risk["calib"], risk["val"], where,
                                           test=risk["test"])})
        cards.append(repoint(fresh, risk["val"], risk["test"]))
    return cards


def reissued_metrics(m: Manifest, cards: list[ClassCard], held: HeldOut,
                     n_boot: int = 1000) -> dict[str, Any]:
    """The manifest's metrics on the served risk of the cards' maps (`served_metrics`), the
    score's beside them, both from the ONNX graph's outputs; other entries (subgroups,
    too-rare labels) are kept."""
    from scehr.training.serving_assets import metric_block, served_metrics

    def risk(split: str) -> tuple[np.ndarray, np.ndarray]:
        y, p, mg = held[split]
        return y, np.stack([k.calibration.apply(p[:, c], mg[:, c])
                            for c, k in enumerate(cards)], axis=1)

    score = metric_block(m.task, m.label_names,
                         {s: (held[s][0], held[s][1]) for s in ("val", "test")}, n_boot)
    return {**m.metrics, **served_metrics(m.task, m.label_names,
                                          {s: risk(s) for s in ("val", "test")}, score, n_boot)}


def served_risks(m: Manifest, held: HeldOut) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per split, (y, risk) [N, C]: the held-out outputs read through the manifest's maps."""
    return {s: (y, np.stack([k.calibration.apply(p[:, c], mg[:, c])
                             for c, k in enumerate(m.classes)], axis=1))
            for s, (y, p, mg) in held.items()}


def repoint(card: ClassCard, val: tuple[np.ndarray, np.ndarray],
            test: tuple[np.ndarray, np.ndarray]) -> ClassCard:
    """One class card with its named points chosen again on validation (y, risk) by the
    current rule (test figures beside), screened, with its default and levels."""
    from scehr.training.calibration import named_point_rules
    from scehr.training.serving_assets import named_points

    unmet = named_point_rules(*val)[1]
    kept, withheld = screen(named_points(val, test), int(np.asarray(val[0]).sum()),
                            float(np.min(val[1])), unmet=unmet)
    return with_points(card, kept, withheld)


def reissue(folder: Path, out: Path, *, minimum: DataMinimum | None,
            command: str, uncertainty: list[RiskUncertainty] | None = None,
            held: tuple[HeldOut, str] | None = None, recalibrate: bool = False,
            points: bool = False, screen: ExplanationScreen | None = None
            ) -> tuple[Path, list[str]]:
    """Write the new version and add it to the index (never as the default).

    `held`: the model's held-out outputs (`held_out_outputs`) and where they come from; with
    them the uncertainty map is fitted (unless `uncertainty` is given or `points`) and the test
    figures are computed on the served risk; `recalibrate` also refits the calibration maps on
    them; `points` only chooses every class's named points again on them (`repoint`);
    `screen` is the explanation screen the new version carries (else the shipped one's)."""
    from scehr.training.export import code_version, manifest_json
    from scehr.training.model_card import write_model_card

    m = load_manifest(folder / "manifest.json")
    version = out.name
    refuse_existing(out.parent.parent, m.task, version, out)
    metrics = m.metrics
    refit = held is not None and not points  # the uncertainty map and the test figures
    if held is not None and recalibrate:
        cards = recalibrated_cards(m, *held)
    elif held is not None and points:
        risk = served_risks(m, held[0])
        cards = [repoint(card, *((risk[s][0][:, c], risk[s][1][:, c]) for s in ("val", "test")))
                 for c, card in enumerate(m.classes)]
    else:
        cards = [rescreen(card, validation_positives(m, c)) for c, card in enumerate(m.classes)]
        if held is not None and uncertainty is None:
            uncertainty = fitted_uncertainty(m, *held)
    if uncertainty is not None:
        cards = [card.model_copy(update={"uncertainty": u})
                 for card, u in zip(cards, uncertainty, strict=True)]
    if refit:
        print("scoring the test split's served risk (bootstrap CIs) ...", flush=True)
        metrics = reissued_metrics(m, cards, held[0])
    what = ("the same ONNX graph; each class's calibration map refitted on the held-out "
            "calibration split (maps that keep the score's ranking, chosen on validation) and "
            "the operating points re-chosen on the new validation risks, then screened"
            if recalibrate else
            "the same ONNX graph and calibration; operating points chosen again on the rebuilt "
            "validation split by the ordered rule (thresholds and PPV rising from "
            "high_sensitivity through balanced to high_ppv) and screened on validation"
            if points else "the same ONNX graph and calibration; operating points "
            "screened on validation")
    note = (f"re-issued from {m.name} {m.version} with training.reissue: {what} (none at "
            "the risk floor or ceiling, none alerting more than half of validation stays, "
            "none for a class with too few validation positives)"
            + ("; the data minimum of the sufficiency study" if minimum else "")
            + ("; the uncertainty map (Venn-Abers interval and conformal outcome set) fitted "
               "on the held-out calibration split"
               if uncertainty is not None or refit else "")
            + ("; test figures computed on the served risk, the score's beside them"
               if refit else "")
            + (f"; the explanation screen of explain=top (exact occlusion of the "
               f"{screen.candidates} observed channels it ranks highest, chosen on "
               f"{screen.chosen_on.split(':')[0]})" if screen is not None else ""))
    new = m.model_copy(update={
        "contract_version": CONTRACT_VERSION, "version": version, "classes": cards,
        "data_minimum": minimum if minimum is not None else m.data_minimum,
        "explanation_screen": screen if screen is not None else m.explanation_screen,
        "metrics": metrics,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "code_version": code_version(), "notes": [*m.notes, note]})
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "model.onnx", out / "model.onnx")
    (out / "manifest.json").write_text(manifest_json(new))
    write_model_card(out, new, command, [note])
    changes = add_model(out.parent.parent, entry_for(out, out.parent.parent, new),
                        set_default=False)
    return out, changes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="the shipped model folder")
    ap.add_argument("out", type=Path, help="models/<task>/<new version>")
    ap.add_argument("--data-minimum", type=Path, default=None,
                    help="the sufficiency study's JSON (benchmarks/sufficiency_study.py)")
    ap.add_argument("--uncertainty", type=Path, default=None, metavar="CONFIG",
                    help="add the uncertainty map, rebuilding the held-out splits from the "
                    "model's training config (e.g. configs/default_mortality_full.toml)")
    ap.add_argument("--points", type=Path, default=None, metavar="CONFIG",
                    help="choose the named points again with the current rule, on the "
                    "validation split rebuilt from the model's training config")
    ap.add_argument("--recalibrate", type=Path, default=None, metavar="CONFIG",
                    help="refit each class's calibration map (and all that is read on the "
                    "risk: points, uncertainty map, card figures) on the held-out splits "
                    "rebuilt from the model's training config")
    ap.add_argument("--data", type=Path, default=None,
                    help="the converted data the model was trained on (with --uncertainty, "
                    "--points or --recalibrate)")
    ap.add_argument("--explanation-screen", type=Path, default=None, metavar="JSON",
                    help="the screen of explain=top fitted on this model's graph "
                    "(python -m scehr.service.screen_fit)")
    args = ap.parse_args(argv)
    modes = [c for c in (args.uncertainty, args.points, args.recalibrate) if c is not None]
    if len(modes) > 1:
        ap.error("give one of --uncertainty, --points and --recalibrate (--recalibrate refits "
                 "the points and the uncertainty map too)")
    config = modes[0] if modes else None
    if (config is None) != (args.data is None):
        ap.error("--uncertainty, --points or --recalibrate CONFIG goes with --data DIR")
    minimum = None
    if args.data_minimum is not None:
        doc = json.loads(args.data_minimum.read_text())
        minimum = DataMinimum.model_validate(doc["data_minimum"])
    screen = None
    if args.explanation_screen is not None:
        screen = ExplanationScreen.model_validate_json(args.explanation_screen.read_text())
        graph = sha256_file(args.model / "model.onnx")
        if screen.onnx_sha256 != graph:
            print(f"error: {args.explanation_screen} was fitted on another graph (sha256 "
                  f"{screen.onnx_sha256[:12]}..., {args.model}'s is {graph[:12]}...)",
                  file=sys.stderr)
            return 2
    command = "python -m scehr.training.reissue " + " ".join(sys.argv[1:] if argv is None else argv)
    held = None
    if config is not None:
        print(f"scoring {args.data}'s held-out splits with {args.model}'s graph ...", flush=True)
        try:
            held = (held_out_outputs(args.model, config, args.data), uncertainty_where(config))
        except (SplitMismatch, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    out, changes = reissue(args.model, args.out, minimum=minimum, command=command, held=held,
                           recalibrate=args.recalibrate is not None,
                           points=args.points is not None, screen=screen)
    print(f"wrote {out}; index: {'; '.join(changes) or 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
