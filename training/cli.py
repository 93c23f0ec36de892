"""`scehr train | evaluate | grid | imbalance | compare | export` subcommands."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file; command-line options override it")
    p.add_argument("--task", choices=["mortality", "phenotypes"])
    p.add_argument("--data", help="benchmark-layout data folder (see `scehr data`)")
    p.add_argument("--out", help="run directory (default runs/<task>-...)")
    p.add_argument("--encoder", choices=["lstm", "cwgru"])
    p.add_argument("--loss", choices=["bce", "cbce", "csce", "focal"])
    p.add_argument("--lam", type=float, help="weight of the SCR regularizer (0 to 0.01)")
    p.add_argument("--batch-size", type=int, dest="batch_size")
    p.add_argument("--lr", type=float)
    p.add_argument("--epochs", type=int)
    p.add_argument("--patience", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--n-boot", type=int, dest="n_boot")
    p.add_argument("--train-prevalence", type=float, dest="train_prevalence")
    p.add_argument("--max-train-stays", type=int, dest="max_train_stays")
    p.add_argument("--encoder-param", action="append", default=[], metavar="KEY=VALUE",
                   help="encoder hyper-parameter override, repeatable (e.g. units=32)")
    p.add_argument("--no-progress", action="store_false", dest="progress", default=None)


_TRAIN_KEYS = ("task", "data", "out", "encoder", "loss", "lam", "batch_size", "lr", "epochs",
               "patience", "seed", "threads", "n_boot", "train_prevalence", "max_train_stays",
               "progress")


def _config(args: argparse.Namespace) -> Any:
    from training.config import load_config, parse_param

    params = dict(parse_param(p) for p in getattr(args, "encoder_param", []))
    cfg = load_config(args.config, encoder_params=params,
                      **{k: getattr(args, k, None) for k in _TRAIN_KEYS})
    if not cfg.data:
        raise ValueError("--data is required (a benchmark-layout folder, see `scehr data`)")
    if not Path(cfg.data).is_dir():
        raise FileNotFoundError(f"data folder {cfg.data} does not exist")
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from training.run import train_run

    final = train_run(_config(args))
    print_summary(final)
    return 0


def print_summary(final: dict[str, Any]) -> None:
    from training.bootstrap import format_ci

    print(f"run: {final.get('run_dir', '')}  best epoch {final['best_epoch']}  "
          f"train {final['train_stays_per_second']:.0f} stays/s  "
          f"wall {final['wall_seconds']:.0f} s")
    for name, ci in final["test_ci"].items():
        print(f"  test {name:<12} {format_ci(ci)}")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from training.bootstrap import format_ci
    from training.evaluate import evaluate_run

    out = evaluate_run(Path(args.run_dir), n_boot=args.n_boot)
    print(json.dumps(out["test_ci"], indent=2))
    for which, ch in out.get("challenge2012", {}).items():
        if isinstance(ch, dict):
            best = format_ci(ch["event1_best_threshold_on_test"])
            print(f"Challenge 2012 on the {which.replace('_', ' ')}: Event 1 "
                  f"{format_ci(ch['event1'])} at threshold {ch['event1_threshold']:.3f} "
                  f"(chosen on validation; best on test {best}), "
                  f"Event 2 H {format_ci(ch['event2_h_normalized'], 2)} "
                  f"(plain H {format_ci(ch['event2_h'], 2)}); winners 0.5353 / 17.88")
    return 0


def cmd_grid(args: argparse.Namespace) -> int:
    from training.experiments import run_grid

    base = _config(args)
    run_grid(base, Path(args.grid_dir), batch_sizes=args.batch_sizes, lams=args.lams,
             losses=args.losses, seeds=args.seeds)
    return 0


def cmd_imbalance(args: argparse.Namespace) -> int:
    from training.experiments import run_imbalance

    run_imbalance(_config(args), Path(args.study_dir), prevalences=args.prevalences,
                  seeds=args.seeds, losses=args.losses)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from training.experiments import run_comparison

    argv = sys.argv[1:]  # the exact command for the report, when run from a shell
    run_comparison(_config(args), Path(args.study_dir), lam=args.scr_lam, seeds=args.seeds,
                   docs=Path(args.docs) if args.docs else None,
                   command=shlex.join(["scehr", *argv]) if argv[:1] == ["compare"] else None)
    return 0


def cmd_embedding(args: argparse.Namespace) -> int:
    from training.experiments import embedding_study

    report = embedding_study(Path(args.run_dir), label=args.label)
    print(json.dumps(report, indent=2, default=float))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from training.export import export_run

    out = export_run(Path(args.run_dir), Path(args.out), version=args.version,
                     name=args.name, make_default=not args.no_default,
                     reproduce=args.reproduce.replace("\\n", "\n") if args.reproduce else None,
                     limitations=args.limitation, data_description=args.data_description)
    print(f"exported {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an encoder with a contrastive loss")
    _train_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="re-evaluate a run directory on its test set")
    p.add_argument("run_dir")
    p.add_argument("--n-boot", type=int, default=1000)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("grid", help="resumable grid over batch size x lambda x loss")
    _train_args(p)
    p.add_argument("grid_dir")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--lams", type=float, nargs="+", default=[0.0, 0.002, 0.007, 0.01])
    p.add_argument("--losses", nargs="+", default=["cbce"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.set_defaults(func=cmd_grid)

    p = sub.add_parser("imbalance", help="down-sample training positives to target prevalences")
    _train_args(p)
    p.add_argument("study_dir")
    p.add_argument("--prevalences", type=float, nargs="+", default=[0.05, 0.01, 0.001])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--losses", nargs="+", default=["bce", "cbce"])
    p.set_defaults(func=cmd_imbalance)

    p = sub.add_parser("compare", help="CBCE+SCR vs BCE vs logistic regression, paired bootstrap")
    _train_args(p)
    p.add_argument("study_dir")
    p.add_argument("--scr-lam", type=float, default=0.007)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--docs", help="also write the markdown report here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("embedding", help="embedding study of a run: separation, spread, "
                       "linear probe, t-SNE with the anchors")
    p.add_argument("run_dir")
    p.add_argument("--label", type=int, default=0, help="class whose anchors are drawn")
    p.set_defaults(func=cmd_embedding)

    p = sub.add_parser("export", help="export a run to ONNX + manifest under models/")
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="models/<task>/<version>/")
    p.add_argument("--version", help="default: the folder name of --out")
    p.add_argument("--name", help="model name (default scehr-<task>-<encoder>-<loss>)")
    p.add_argument("--no-default", action="store_true", help="do not make it the task default")
    p.add_argument("--reproduce", help="commands for the model card (default: train + export "
                   "of this run); '\\n' separates lines")
    p.add_argument("--limitation", action="append", default=[],
                   help="a limitation for the model card (repeatable)")
    p.add_argument("--data-description", help="one paragraph on the training data")
    p.set_defaults(func=cmd_export)
