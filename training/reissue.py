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

--uncertainty rebuilds the model's held-out calibration and validation splits from its
training config and data (checked against the manifest's recorded split sizes and
prevalences), scores them with the shipped ONNX graph and calibration map, and fits the map
with `scehr.training.uncertainty.fit_uncertainty`, the function export uses. --points rebuilds
the validation and test splits the same way and chooses the named points again with the
current rule (`scehr.training.calibration.named_point_rules`) before screening them. A data
minimum already in the shipped manifest is kept unless --data-minimum replaces it.

The shipped folder is never modified. The risk of every stay is unchanged (same graph, same
map); without --points a kept point keeps its threshold to the last bit, so the new version
differs only in the alerts of withheld points and in abstaining below the minimum.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.manifest import ClassCard, Manifest, load_manifest
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


def held_out_risks(folder: Path, config: Path, data: Path
                   ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"calib", "val", "test"}: (y, risk) [N, C] of a shipped model's own held-out splits,
    rebuilt from its training config and data (checked against the manifest's split sizes and
    outcome rates) and scored by its ONNX graph and calibration maps."""
    from scehr.training.config import TrainConfig, load_config
    from scehr.training.external import ExportedModel
    from scehr.training.fit import prepare

    model = ExportedModel(folder, binary_only=False)
    if config.suffix == ".json":  # a run folder's config.json (TrainConfig.to_dict)
        cfg = TrainConfig(**{**json.loads(config.read_text()), "data": str(data)})
    else:
        cfg = load_config(config, data=str(data), task=model.manifest.task)
    prep = prepare(cfg)
    if "calib" not in prep.raw:
        raise SplitMismatch(f"{config} holds out no calibration split: nothing to fit on")
    risks = {}
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
        risks[split] = (a.y, model.risks(a))
    return risks


def held_out_uncertainty(folder: Path, config: Path, data: Path,
                         risks: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
                         ) -> list[RiskUncertainty]:
    """Per class, the uncertainty map of a shipped model, fitted as export fits it: on its
    calibration split (level chosen on its validation split), scored by its ONNX graph."""
    risks = risks or held_out_risks(folder, config, data)
    (yc, rc), (yv, rv), (yt, rt) = risks["calib"], risks["val"], risks["test"]
    where = UNCERTAINTY_WHERE.replace("split", f"split rebuilt from {config.name}", 1)
    return [fit_uncertainty((yc[:, c], rc[:, c]), (yv[:, c], rv[:, c]), where,
                            test=(yt[:, c], rt[:, c]))
            for c in range(yc.shape[1])]


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
            points: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
            ) -> tuple[Path, list[str]]:
    """Write the new version; `points`: the rebuilt {"val", "test"} (y, risk) [N, C] to
    choose every class's named points on again (`repoint`), else the stored ones are
    re-screened."""
    from scehr.training.export import code_version, manifest_json
    from scehr.training.model_card import write_model_card

    m = load_manifest(folder / "manifest.json")
    version = out.name
    refuse_existing(out.parent.parent, m.task, version, out)
    if points is not None:
        (yv, rv), (yt, rt) = points["val"], points["test"]
        cards = [repoint(card, (yv[:, c], rv[:, c]), (yt[:, c], rt[:, c]))
                 for c, card in enumerate(m.classes)]
    else:
        cards = [rescreen(card, validation_positives(m, c)) for c, card in enumerate(m.classes)]
    if uncertainty is not None:
        cards = [card.model_copy(update={"uncertainty": u})
                 for card, u in zip(cards, uncertainty, strict=True)]
    note = (f"re-issued from {m.name} {m.version} with training.reissue: the same ONNX graph "
            "and calibration; "
            + ("operating points chosen again on the rebuilt validation split by the ordered "
               "rule (thresholds and PPV rising from high_sensitivity through balanced to "
               "high_ppv) and " if points is not None else "operating points ")
            + "screened on validation (none at the risk "
            "floor or ceiling, none alerting more than half of validation stays, none for a "
            "class with too few validation positives)"
            + ("; the data minimum of the sufficiency study" if minimum else "")
            + ("; the uncertainty map (Venn-Abers interval and conformal outcome set) fitted "
               "on the held-out calibration split" if uncertainty is not None else ""))
    new = m.model_copy(update={
        "contract_version": CONTRACT_VERSION, "version": version, "classes": cards,
        "data_minimum": minimum if minimum is not None else m.data_minimum,
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
    ap.add_argument("--data", type=Path, default=None, help="the converted data the model "
                    "was trained on (with --uncertainty or --points)")
    args = ap.parse_args(argv)
    config = args.uncertainty or args.points
    if (config is None) != (args.data is None):
        ap.error("--uncertainty CONFIG or --points CONFIG goes with --data DIR")
    if args.uncertainty and args.points and args.uncertainty != args.points:
        ap.error("--uncertainty and --points rebuild the same splits: give one config")
    minimum = None
    if args.data_minimum is not None:
        doc = json.loads(args.data_minimum.read_text())
        minimum = DataMinimum.model_validate(doc["data_minimum"])
    command = "python -m scehr.training.reissue " + " ".join(sys.argv[1:] if argv is None else argv)
    maps, risks = None, None
    if config is not None:
        print(f"scoring {args.data}'s held-out splits ...", flush=True)
        try:
            risks = held_out_risks(args.model, config, args.data)
        except (SplitMismatch, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.uncertainty is not None:
        maps = held_out_uncertainty(args.model, config, args.data, risks)
    out, changes = reissue(args.model, args.out, minimum=minimum, command=command,
                           uncertainty=maps, points=risks if args.points else None)
    print(f"wrote {out}; index: {'; '.join(changes) or 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
