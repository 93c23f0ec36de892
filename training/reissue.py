"""A new version of a shipped model with the same ONNX graph and calibration: its operating
points screened by the defensible rule (`training.operating_points.screen`, from the
validation figures stored with each point), warning/critical levels, and the data minimum of
the sufficiency study.

    .venv/bin/python -m training.reissue models/mortality/1.2.0 models/mortality/1.2.1 \
        --data-minimum docs/sufficiency-mortality.json

The shipped folder is never modified. The risk of every stay is unchanged (same graph, same
map) and a kept point keeps its threshold to the last bit, so the new version differs only in
the alerts of withheld points and in abstaining below the minimum.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

from schemas.contract import CONTRACT_VERSION
from schemas.manifest import ClassCard, Manifest, load_manifest
from schemas.model_index import add_model, entry_for, refuse_existing
from schemas.sufficiency import DataMinimum
from training.operating_points import default_point, risk_levels, screen


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
    withheld = [earlier.get(w.name, w) for w in withheld]
    default = default_point(kept, card.default_operating_point)
    return card.model_copy(update={"named_points": kept, "withheld_points": withheld,
                                   "default_operating_point": default,
                                   "levels": risk_levels(kept, default)})


def reissue(folder: Path, out: Path, *, minimum: DataMinimum | None,
            command: str) -> tuple[Path, list[str]]:
    from training.export import code_version, manifest_json
    from training.model_card import write_model_card

    m = load_manifest(folder / "manifest.json")
    version = out.name
    refuse_existing(out.parent.parent, m.task, version, out)
    cards = [rescreen(card, validation_positives(m, c)) for c, card in enumerate(m.classes)]
    note = (f"re-issued from {m.name} {m.version} with training.reissue: the same ONNX graph "
            "and calibration; operating points screened on validation (none at the risk "
            "floor or ceiling, none alerting more than half of validation stays, none for a "
            "class with too few validation positives)"
            + ("; the data minimum of the sufficiency study" if minimum else ""))
    new = m.model_copy(update={
        "contract_version": CONTRACT_VERSION, "version": version, "classes": cards,
        "data_minimum": minimum,
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
    args = ap.parse_args(argv)
    minimum = None
    if args.data_minimum is not None:
        doc = json.loads(args.data_minimum.read_text())
        minimum = DataMinimum.model_validate(doc["data_minimum"])
    command = "python -m training.reissue " + " ".join(sys.argv[1:] if argv is None else argv)
    out, changes = reissue(args.model, args.out, minimum=minimum, command=command)
    print(f"wrote {out}; index: {'; '.join(changes) or 'unchanged'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
