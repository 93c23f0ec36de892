"""`scehr data extract-mimic3`, `compare-mimic3`, `convert-meds` and `meds-predictions`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    """Add the MIMIC subcommands to `scehr data`."""
    p = sub.add_parser(
        "extract-mimic3",
        help="raw MIMIC-III tables -> mimic3-benchmarks layout (root, in-hospital-mortality, "
             "decompensation, length-of-stay, phenotyping)",
        description="Raw MIMIC-III v1.4 tables (CSV or CSV.gz, upper- or lower-case headers) -> "
                    "OUT/root, OUT/in-hospital-mortality, OUT/decompensation, "
                    "OUT/length-of-stay, OUT/phenotyping, as mimic3-benchmarks' "
                    "scripts write them. The scan of the event tables is kept in "
                    "OUT/.mimic3-work and reused by a rerun; delete it to rescan.")
    _extract_args(p, "folder with PATIENTS, ADMISSIONS, ICUSTAYS, DIAGNOSES_ICD, "
                     "D_ICD_DIAGNOSES, CHARTEVENTS, LABEVENTS, OUTPUTEVENTS")
    p.set_defaults(func=_extract, schema="mimic3")

    p = sub.add_parser(
        "extract-mimic4",
        help="MIMIC-IV v2+ (hosp/, icu/) -> the same layout (ICD-9 phenotypes only)",
        description="MIMIC-IV v2+ tables (hosp/ and icu/ modules, CSV or CSV.gz) -> OUT/root "
                    "and the four task folders with extract-mimic3's rules. "
                    "Phenotype labels use ICD-9 codes only; stays of admissions coded in "
                    "ICD-10 are left out of phenotyping (docs/mimic.md).")
    _extract_args(p, "MIMIC-IV root folder (holding hosp/ and icu/)")
    p.set_defaults(func=_extract, schema="mimic4")

    p = sub.add_parser("compare-mimic3",
                       help="compare an extraction with mimic3-benchmarks' output, file by file")
    p.add_argument("ours", type=Path, help="output of extract-mimic3")
    p.add_argument("reference", type=Path, help="the reference's data folder (root, tasks)")
    p.set_defaults(func=_compare)

    p = sub.add_parser("convert-meds",
                       help="MEDS dataset + label table -> in-hospital-mortality layout",
                       description="A MEDS dataset (data/**/*.parquet, "
                       "metadata/subject_splits.parquet) and a MEDS label table (one row per "
                       "stay: subject_id, prediction_time, boolean_value) -> "
                       "OUT/in-hospital-mortality, the 48 h before each prediction time.")
    p.add_argument("meds_dir", type=Path, help="MEDS dataset root")
    p.add_argument("labels", type=Path, help="label table (parquet, meds LabelSchema), or a "
                   "folder of them (ACES output)")
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--code-map", type=Path, default=None,
                   help="CSV code,variable[,unit] (variable id or benchmark name; a row may "
                        "name a code's `//` stem, e.g. LAB//211); comes before the rules below")
    p.add_argument("--items", choices=["auto", "mimic", "none"], default="auto",
                   help="map MIMIC item ids in codes (LAB//<itemid>//<unit>) by the benchmark's "
                        "item map; auto: when metadata/dataset.json names a MIMIC dataset. "
                        "Other codes map by LOINC: the code's own or its parent_codes in "
                        "metadata/codes.parquet")
    p.add_argument("--resources", type=Path, default=None,
                   help="mimic3-benchmarks checkout or copy of its resource files, for the item "
                        "map (default: mimic3-benchmarks-resources in SCEHR_DATA_DIR)")
    p.add_argument("--split-map", default=None,
                   help="MEDS split name -> train|val|test, e.g. "
                        "train=train,tuning=val,held_out=test (the default)")
    p.add_argument("--subjects-per-chunk", type=_positive_int, default=None,
                   help="whole subjects converted at a time, the shards read one Parquet row "
                        "group at a time: with a row group, the bound on memory (default 64)")
    p.set_defaults(func=_meds)

    p = sub.add_parser("meds-predictions",
                       help="scehr score output of a convert-meds split -> meds-evaluation "
                            "predictions (parquet)",
                       description="Joins the scores of a split folder written by convert-meds "
                       "with its meds_labels.parquet: subject_id, prediction_time, "
                       "boolean_value, predicted_boolean_value (the model's alert), "
                       "predicted_boolean_probability (its risk), as MEDS-DEV's evaluation "
                       "(meds-evaluation) reads them.")
    p.add_argument("scores", type=Path, help="scehr score output (.csv or .jsonl)")
    p.add_argument("split_dir", type=Path,
                   help="the scored folder, e.g. OUT/in-hospital-mortality/test")
    p.add_argument("--out", type=Path, required=True, help="predictions parquet to write")
    p.add_argument("--label", default=None,
                   help="which of the model's labels (needed only if it has several)")
    p.set_defaults(func=_meds_predictions)


def _positive_int(text: str) -> int:
    """The training CLI's rule for a count >= 1 (imported when the option is given)."""
    from scehr.training.cli import _positive_int as rule

    return rule(text)


def _extract_args(p: argparse.ArgumentParser, source_help: str) -> None:
    p.add_argument("mimic_dir", type=Path, help=source_help)
    p.add_argument("out", type=Path, help="output folder")
    p.add_argument("--resources", type=Path, default=None,
                   help="mimic3-benchmarks checkout or copy of its resource files (default: "
                        "mimic3-benchmarks-resources in SCEHR_DATA_DIR)")
    p.add_argument("--memory-limit", default="2GB",
                   help="DuckDB memory limit; larger intermediates spill to OUT/.mimic3-work "
                        "(default 2GB)")
    p.add_argument("--threads", type=int, default=None,
                   help="DuckDB threads (default: all; the scan's Polars reader takes "
                        "POLARS_MAX_THREADS from the environment)")


def _extract(args: argparse.Namespace) -> int:
    from scehr.training.data.mimic3.pipeline import extract
    from scehr.training.data.mimic3.sources import Resources

    t0 = time.perf_counter()
    res = Resources.from_dir(args.resources)
    prov = extract(args.mimic_dir, args.out, resources=res, memory_limit=args.memory_limit,
                   threads=args.threads, schema=args.schema,
                   progress=lambda s: print(s, flush=True))
    for step, c in prov["cohort"].items():
        print(f"{step:<24} {c['icu_stays']:>7} ICU stays {c['admissions']:>7} admissions "
              f"{c['subjects']:>7} subjects")
    print("validation: " + ", ".join(f"{k} {v}" for k, v in prov["validation"].items()))
    print(f"wrote {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from scehr.training.data.mimic3.compare import compare_trees

    report = compare_trees(args.ours, args.reference)
    print(report.summary())
    return 0 if report.equal else 1


def _meds(args: argparse.Namespace) -> int:
    from scehr.training.data.meds_input import convert_meds, parse_split_map, read_code_map
    from scehr.training.data.mimic3.sources import Resources

    cmap = read_code_map(args.code_map) if args.code_map else None
    items = Resources.from_dir(args.resources).itemid_map if args.resources else None
    counts = convert_meds(args.meds_dir, args.labels, args.out, code_map=cmap,
                          items=args.items, item_map=items,
                          split_map=parse_split_map(args.split_map) if args.split_map else None,
                          **({"subjects_per_chunk": args.subjects_per_chunk}
                             if args.subjects_per_chunk else {}))
    refused = counts["values_refused"]
    print(f"{counts['labels']} stays, {counts['events_used']} events in their windows; "
          f"{counts['codes_mapped']} codes mapped, {counts['events_ignored']} events of "
          f"{counts['codes_ignored']} other codes ignored")
    print(f"values refused by the rules: {sum(refused.values())} ("
          + (", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "none") + "); "
          f"same-time values not kept: {counts['same_time_values_dropped']}")
    print(f"wrote {args.out}")
    return 0


def _meds_predictions(args: argparse.Namespace) -> int:
    from scehr.training.data.meds_predictions import meds_predictions

    c = meds_predictions(args.scores, args.split_dir, args.out, label=args.label)
    print(f"{c['predictions']} predictions of {c['label']} for {c['stays']} stays "
          f"({c['not_scored']} not scored); wrote {args.out}")
    return 0
