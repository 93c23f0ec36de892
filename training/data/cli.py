"""`scehr data ...`: convert open datasets to the benchmark layout, synthesise, inspect."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from scehr.schemas.featureset import FEATURE_SETS, FeatureSet
from scehr.schemas.tasks import TASK_NAMES, task_spec
from scehr.training.data.layout import TASK_DIRS, available_tasks
from scehr.training.data.report import cleaning_table, pct, table


def register(subparsers: Any) -> None:
    """Add the `data` command and its subcommands to the `scehr` parser."""
    data = subparsers.add_parser("data", help="data conversion, synthetic data and inspection",
                                 description=__doc__)
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    data.set_defaults(func=lambda _args: (data.print_help(), 2)[1])

    p = sub.add_parser("convert-physionet2012",
                       help="PhysioNet 2012 tarballs -> in-hospital-mortality layout")
    p.add_argument("src", type=Path, help="folder with set-{a,b,c}.tar.gz and Outcomes-*.txt")
    p.add_argument("out", type=Path, help="output dataset folder")
    p.add_argument("--seed", type=int, default=0, help="validation split seed (default 0)")
    p.add_argument("--val-fraction", type=float, default=0.15,
                   help="share of training patients held out for validation")
    p.add_argument("--limit", type=int, default=None,
                   help="only the first N records of each set (quick checks)")
    _feature_set_arg(p, "benchmark76-48h")
    p.set_defaults(func=_physionet)

    p = sub.add_parser("convert-eicu-demo",
                       help="eICU demo (+ YAIB hourly grid) -> phenotyping and mortality layouts")
    p.add_argument("src", type=Path, help="eicu-demo folder")
    p.add_argument("out", type=Path, help="output dataset folder")
    p.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    p.add_argument("--split-by", dest="split_by", choices=["patient", "hospital"],
                   default="patient", help="draw test and validation by patient, or by "
                   "hospital so they hold hospitals training never saw (default patient)")
    p.add_argument("--ccs-definitions", type=Path, default=None,
                   help="hcup_ccs_2015_definitions.yaml (default: from SCEHR_DATA_DIR)")
    p.add_argument("--limit-patients", type=int, default=None,
                   help="only the first N patients (quick checks)")
    _feature_set_arg(p, "benchmark76-stay")
    p.set_defaults(func=_eicu)

    p = sub.add_parser("synth", help="write a synthetic dataset with a known signal")
    p.add_argument("out", type=Path)
    p.add_argument("--task", choices=[*TASK_NAMES, "both"], default="both",
                   help="which task folders to write")
    p.add_argument("--n-train", type=int, default=200, help="train stays incl. validation")
    p.add_argument("--n-test", type=int, default=50, help="test stays")
    p.add_argument("--prevalence", type=float, default=0.2,
                   help="exact positive share per split (per label for phenotypes)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.set_defaults(func=_synth)

    p = sub.add_parser("inspect", help="counts, prevalence, coverage and missingness per split")
    p.add_argument("path", type=Path, help="a benchmark-layout dataset folder or task folder")
    p.add_argument("--task", choices=sorted(TASK_DIRS), default=None,
                   help="task folder to inspect (default: every task found)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--feature-set", dest="feature_set", choices=list(FEATURE_SETS),
                   default=None, help="channels to read (default: the one provenance.json "
                   "names, else the task's)")
    p.set_defaults(func=_inspect)

    from scehr.training.data.mimic3.cli import register as register_mimic3

    register_mimic3(sub)


def _feature_set_arg(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--feature-set", dest="feature_set", choices=list(FEATURE_SETS),
                   default=default, help="channels to write (schemas/resources/"
                   f"feature_sets.json; default {default})")


def _physionet(args: argparse.Namespace) -> int:
    from scehr.training.data.physionet2012 import convert_physionet2012

    t0 = time.perf_counter()
    prov = convert_physionet2012(args.src, args.out, limit=args.limit, seed=args.seed,
                                 val_fraction=args.val_fraction,
                                 fs=FEATURE_SETS[args.feature_set])
    wall = time.perf_counter() - t0
    rows = [[f"set-{n}", s["split"], s["stays"], s["positives"], pct(s["positive_rate"]),
             len(s["records_without_timeseries"]), s["empty_parameter_rows_dropped"],
             s["invalid_category_dropped"], s["noninvasive_superseded_by_invasive"],
             s["same_time_duplicates_last_kept"]]
            for n, s in prov["sets"].items()]
    print(table(["set", "split", "stays", "deaths", "rate", "no time series",
                 "empty-name rows", "bad category", "NI superseded", "same-time dups"], rows))
    print()
    print(table(["split", "stays", "deaths", "rate"],
                [[k, v["stays"], v["positives"], pct(v["positive_rate"])]
                 for k, v in prov["splits"].items()]))
    print()
    print(cleaning_table({f"set-{n}": s for n, s in prov["sets"].items()}))
    no_ts = [r for s in prov["sets"].values() for r in s["records_without_timeseries"]]
    print(f"\nrecords with no time series (kept; they tensorize to normal values): "
          f"{len(no_ts)}: {', '.join(map(str, no_ts))}")
    print(f"wrote {Path(args.out) / TASK_DIRS['mortality']} in {wall:.1f} s")
    return 0


def _eicu(args: argparse.Namespace) -> int:
    from scehr.training.data.eicu_demo import convert_eicu_demo

    t0 = time.perf_counter()
    prov = convert_eicu_demo(args.src, args.out, ccs_definitions=args.ccs_definitions,
                             limit_patients=args.limit_patients, seed=args.seed,
                             fs=FEATURE_SETS[args.feature_set], split_by=args.split_by)
    wall = time.perf_counter() - t0
    ph, ihm = prov["phenotyping"], prov["in_hospital_mortality"]
    print(f"ICU stays {prov['stays_in_patient_table']}, with grid data "
          f"{prov['stays_with_grid_data']}, with an ICD-9 code {prov['stays_with_icd9']}")
    print(f"phenotyping: {ph['kept']} stays (excluded: {ph['excluded_no_grid_data']} without "
          f"grid data, {ph['excluded_no_icd9_code']} without an ICD-9 code)")
    print(f"in-hospital mortality: {ihm['kept']} stays of >= 48 h (excluded: "
          f"{ihm['excluded_status_unknown']} unknown status, {ihm['excluded_no_data_in_48h']} "
          "without data in the first 48 h)\n")
    rows = [["phenotyping", split, v["stays"], v["patients"], "", ""]
            for split, v in ph["splits"].items()]
    rows += [["in-hospital-mortality", split, v["stays"], v["patients"],
              v["positives"]["y_true"], pct(v["prevalence"]["y_true"])]
             for split, v in ihm["splits"].items()]
    print(table(["task", "split", "stays", "patients", "deaths", "rate"], rows))
    print()
    labels = list(ph["splits"]["train"]["prevalence"])
    print(table(["phenotype", *ph["splits"]],
                [[name, *(pct(v["prevalence"][name]) for v in ph["splits"].values())]
                 for name in labels]))
    print()
    print(cleaning_table({"all stays": prov["cleaning"]}))
    print(f"\ngrid rows after discharge dropped: {prov['grid_rows_after_discharge_dropped']}")
    print(f"wrote {args.out} in {wall:.1f} s")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from scehr.training.data.synthetic import write_synthetic

    t0 = time.perf_counter()
    out = write_synthetic(args.out, task=args.task, n_train=args.n_train, n_test=args.n_test,
                          prevalence=args.prevalence, seed=args.seed, progress=None)
    print(f"wrote synthetic {args.task} data to {out} in {time.perf_counter() - t0:.2f} s")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from scehr.training.data.report import inspect_task
    from scehr.training.data.splits import load_split

    path: Path = args.path
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (expected a dataset folder: "
                                f"{_expected(path)})")
    tasks = [args.task] if args.task else available_tasks(path)
    if not tasks:
        raise FileNotFoundError(f"no benchmark data under {path}: expected "
                                f"{_expected(path)} (mimic3-benchmarks layout)")
    fs = _written_feature_set(path, args.feature_set)
    for task in tasks:
        task_fs = fs if fs is not None and fs.window_hours == task_spec(task).window_hours \
            else None
        arrays = {split: load_split(path, task, split, task_fs, cache=not args.no_cache)
                  for split in ("train", "val", "test")}
        print(f"== {task} ({TASK_DIRS[task]}) ==")
        print(inspect_task(task, arrays))
        print()
    return 0


def _written_feature_set(path: Path, name: str | None) -> FeatureSet | None:
    """`name`'s feature set, else the one the converter recorded in provenance.json."""
    prov = path / "provenance.json"
    if name is None and prov.is_file():
        name = json.loads(prov.read_text()).get("feature_set", {}).get("name")
    return None if name is None else FEATURE_SETS.get(name)


def _expected(path: Path) -> str:
    return " and/or ".join(f"{path / d}/{{train,test}}/listfile.csv" for d in TASK_DIRS.values())
