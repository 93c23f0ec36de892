"""`scehr train | evaluate | recalibrate | grid | imbalance | compare | export` subcommands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.tasks import TASK_NAMES, task_spec

# The registries (and with them torch): a serve-only install fails here, and `scehr` reports
# in one line that these commands need the `train` extra.
from scehr.training.config import TrainConfig
from scehr.training.encoders import TRAINABLE
from scehr.training.losses import CCE_LOSSES, REGULARIZERS


def _nonnegative(text: str) -> float:
    """A finite number >= 0 (argparse type: the error names the rule in one line)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
    return value


def _lam(text: str) -> float:
    """λ for SCR: >= 0 and at most 1 (the paper's useful range is 0 to 0.01)."""
    value = _nonnegative(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} is out of range: λ must be in [0, 1] "
                                         "(the paper uses 0 to 0.01)")
    return value


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum`, refused in one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} must be >= {minimum}")
        return value

    return parse


_positive_int, _nonnegative_int = _int_at_least(1), _int_at_least(0)


def _prevalence(text: str) -> float:
    value = _nonnegative(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1)")
    return value


_DEFAULTS = TrainConfig()


def _d(name: str) -> str:
    """' (default: from --config, else X)' for an option whose default is the config's."""
    return f" (default: from --config, else {getattr(_DEFAULTS, name)!r})"


def _dropout_rate(text: str) -> float:
    value = _nonnegative(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in [0, 1)")
    return value


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file; command-line options override it")
    p.add_argument("--task", choices=TASK_NAMES, help="prediction task" + _d("task"))
    p.add_argument("--feature-set", dest="feature_set", choices=list(FEATURE_SETS),
                   help="input variables and window (schemas/resources/feature_sets.json) "
                   "(default: from --config, else the task's own)")
    p.add_argument("--data", help="benchmark-layout data folder (see `scehr data`)")
    p.add_argument("--extra-data", action="append", dest="extra_data", metavar="DIR",
                   help="another benchmark-layout folder whose train and val splits join "
                   "--data's (multi-source training; repeatable); the test split is --data's")
    p.add_argument("--out", help="run directory (default runs/<task>-...)")
    p.add_argument("--encoder", choices=list(TRAINABLE), help="encoder Φ" + _d("encoder"))
    p.add_argument("--loss", choices=list(CCE_LOSSES),
                   help="classification term (fixes the probability read-out)" + _d("loss"))
    p.add_argument("--lam", type=_lam, help="weight λ of the SCR regularizer, in [0, 1]; the "
                   "paper uses 0 to 0.01" + _d("lam"))
    p.add_argument("--regularizer", action="append", default=None, metavar="NAME[@WEIGHT]",
                   dest="regularizer_specs",
                   help="add a regularizer to the objective, repeatable; NAME is one of "
                   f"{', '.join(n for n in REGULARIZERS if n != 'scr')}; WEIGHT defaults to 1 "
                   "(default: the config's [regularizers.*] tables)")
    p.add_argument("--reg-param", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="a regularizer parameter, repeatable (e.g. supcon_krandom.k=3)")
    p.add_argument("--batch-size", type=_positive_int, dest="batch_size",
                   help="stays per step" + _d("batch_size"))
    p.add_argument("--lr", type=_nonnegative, help="Adam learning rate" + _d("lr"))
    p.add_argument("--epochs", type=_positive_int, help="maximum epochs" + _d("epochs"))
    p.add_argument("--patience", type=_positive_int,
                   help="early-stopping patience in epochs" + _d("patience"))
    p.add_argument("--seed", type=int, help="random seed" + _d("seed"))
    p.add_argument("--split-seed", type=int, dest="split_seed",
                   help="seed of the data split (calibration hold-out); default: --seed. "
                        "Ensemble members share it")
    p.add_argument("--threads", type=_positive_int, help="torch CPU threads" + _d("threads"))
    p.add_argument("--stream", action="store_true", default=None,
                   help="read the data from disk batch by batch instead of loading it all "
                   "into memory (for data larger than memory)" + _d("stream"))
    p.add_argument("--workers", type=_nonnegative_int,
                   help="with --stream, loader processes reading batches ahead" + _d("workers"))
    p.add_argument("--cache-stays", type=_nonnegative_int, dest="cache_stays",
                   help="with --stream, stays kept in memory per split (the memory bound)"
                   + _d("cache_stays"))
    p.add_argument("--ensemble-seeds", type=int, nargs="+", dest="ensemble_seeds",
                   metavar="SEED", help="train one member per seed (sharing the data split of "
                   "--split-seed, else --seed) into OUT/member-s<SEED> and combine them into "
                   "one ensemble run in OUT, exported as one graph")
    p.add_argument("--n-boot", type=_positive_int, dest="n_boot",
                   help="bootstrap resamples for the test CIs" + _d("n_boot"))
    p.add_argument("--train-prevalence", type=_prevalence, dest="train_prevalence",
                   help="down-sample training positives to this share (binary tasks)"
                   + _d("train_prevalence"))
    p.add_argument("--max-train-stays", type=_positive_int, dest="max_train_stays",
                   help="use at most this many training stays" + _d("max_train_stays"))
    p.add_argument("--channel-dropout", type=_dropout_rate, dest="channel_dropout",
                   help="make each channel of each training stay absent with this probability "
                   "(robustness to channels a site never records)" + _d("channel_dropout"))
    p.add_argument("--channel-dropout-groups", action="store_true", default=None,
                   dest="channel_dropout_groups", help="with --channel-dropout, also drop "
                   "whole channel groups (GCS, labs, blood gases, ...) at the same rate"
                   + _d("channel_dropout_groups"))
    p.add_argument("--encoder-param", action="append", default=[], metavar="KEY=VALUE",
                   help="encoder hyper-parameter override, repeatable (e.g. units=32)")
    p.add_argument("--no-progress", action="store_false", dest="progress", default=None,
                   help="no progress bar: one line per epoch instead (default: a bar on a "
                   "terminal, lines otherwise; always lines in <run>/train.log)")
    p.add_argument("--no-plots", action="store_false", dest="plots", default=None,
                   help="skip the run's PNG figures (ROC, PR, reliability, learning curves, "
                   "t-SNE)")
    p.add_argument("--no-tsne", action="store_false", dest="tsne", default=None,
                   help="skip the t-SNE figure of the test embeddings (the slowest plot)")


#: Config fields set from their own option (same name as the option's dest), derived from
#: TrainConfig so a new field with an option needs no second list; the dict-valued fields
#: come from --encoder-param / --regularizer instead.
_TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig)
                    if f.name not in ("encoder_hparams", "regularizers"))


def _regularizers(args: argparse.Namespace) -> dict[str, dict[str, Any]] | None:
    """`--regularizer name@w` and `--reg-param name.key=value` as the config's table."""
    from scehr.training.config import parse_param

    specs = getattr(args, "regularizer_specs", None)
    params = getattr(args, "reg_param", [])
    if not specs and not params:
        return None
    out: dict[str, dict[str, Any]] = {}
    for spec in specs or []:
        name, _, weight = spec.partition("@")
        if name not in REGULARIZERS or name == "scr":
            raise ValueError(f"--regularizer {name!r}: expected one of "
                             f"{', '.join(n for n in REGULARIZERS if n != 'scr')} "
                             "(SCR is weighted by --lam)")
        out[name] = {"weight": _nonnegative(weight) if weight else 1.0}
    for text in params:
        key, value = parse_param(text)
        name, dot, param = key.partition(".")
        if not dot or name not in out:
            raise ValueError(f"--reg-param {text!r}: expected NAME.KEY=VALUE with NAME given "
                             "by --regularizer")
        out[name][param] = value
    return out


def _config(args: argparse.Namespace) -> Any:
    from scehr.training.config import load_config, parse_param

    params = dict(parse_param(p) for p in getattr(args, "encoder_param", []))
    cfg = load_config(args.config, encoder_params=params, regularizers=_regularizers(args),
                      **{k: getattr(args, k, None) for k in _TRAIN_KEYS})
    if not cfg.data:
        raise ValueError("--data is required (a benchmark-layout folder, see `scehr data`)")
    for folder in (cfg.data, *cfg.extra_data):
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"data folder {folder} does not exist")
    return cfg


def echo_overrides(args: argparse.Namespace, cfg: Any) -> None:
    """Say at start which options override the config file, and the thread count."""
    from scehr.training.config import load_config

    file_cfg = load_config(args.config) if args.config else TrainConfig()
    changed = [f"{k}={getattr(cfg, k)!r} (config: {getattr(file_cfg, k)!r})"
               for k in _TRAIN_KEYS if getattr(args, k, None) is not None
               and k not in ("data", "out") and getattr(file_cfg, k) != getattr(cfg, k)]
    if getattr(args, "encoder_param", None):
        changed.append(f"encoder_hparams={cfg.encoder_hparams}")
    if getattr(args, "regularizer_specs", None) or getattr(args, "reg_param", None):
        changed.append(f"regularizers={cfg.regularizers}")
    print(f"config: {args.config or 'defaults'}; overrides: {', '.join(changed) or 'none'}; "
          f"torch threads: {cfg.threads}", flush=True)


def _recipe_task(path: Path) -> str:
    """The task a config trains (a landmark recipe shares its outcome's file-name prefix)."""
    with path.open("rb") as f:
        return str(tomllib.load(f).get("task", _DEFAULTS.task))


def no_recipe_note(task: str) -> str:
    """Plain `scehr train` trains with the library defaults, not a shipped model's recipe: say
    so, and name the recipes (configs/default_<task>*.toml) that built the shipped models."""
    pattern = f"default_{task.replace('-', '_')}*.toml"
    recipes = [p for p in sorted(Path("configs").glob(pattern)) if _recipe_task(p) == task]
    where = (", ".join(str(p) for p in recipes) if recipes
             else f"configs/{pattern} in the scehr repository")
    return (f"note: no --config, so this run uses the library defaults (loss "
            f"{_DEFAULTS.loss}, lam {_DEFAULTS.lam}, the task's paper encoder), not the recipe "
            f"of a shipped model; to train like the shipped {task} model pass --config "
            f"{where}")


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun line that runs `scehr <argv>` without its `--nproc` on `nproc` processes
    of this machine (a standalone c10d rendezvous on a free port). `--nproc` is left out:
    torchrun would read it as an abbreviation of its own `--nproc-per-node`."""
    rest, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--nproc="):
            skip = False
        elif arg == "--nproc":
            skip = True
        else:
            rest.append(arg)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "scehr.cli", *rest]


def run_forwarding_signals(command: list[str]) -> int:
    """Run `command` and pass it SIGINT/SIGTERM (Ctrl-C included) instead of dying on them:
    torchrun hands them to its processes, which stop after the current step and leave a
    resume checkpoint; this process then exits as one training process would (130, 143)."""
    import signal
    import subprocess

    proc = subprocess.Popen(command)
    forwarded: list[int] = []

    def forward(signum: int, _: object) -> None:
        forwarded.append(signum)
        proc.send_signal(signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
        # torchrun exits 1 when a signal stopped it: report the signal, as one process does
        return 128 + forwarded[0] if code and forwarded else code
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def cmd_train(args: argparse.Namespace) -> int:
    import os

    from scehr.training.config import TrainConfig as Config
    from scehr.training.distributed import leave as leave_process_group
    from scehr.training.interrupt import TrainingInterrupted
    from scehr.training.run import train_run

    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:  # not yet one of torchrun's
        if not (args.out or args.resume):
            raise ValueError("--nproc needs --out (or --resume): the processes share one run "
                             "directory")
        command = torchrun_command(args.nproc, args.argv)
        print("running: " + shlex.join(command), flush=True)
        return run_forwarding_signals(command)
    speaks = os.environ.get("RANK", "0") == "0"  # one of torchrun's processes: rank 0 speaks
    if args.resume:
        run = Path(args.resume)
        if not (run / "config.json").is_file():
            raise FileNotFoundError(f"{run}/config.json does not exist: not a run folder")
        cfg = Config(**json.loads((run / "config.json").read_text()))
        if speaks:
            print(f"resuming {run} with its saved config (command-line options are ignored)",
                  flush=True)
    else:
        cfg = _config(args)
        if speaks:
            echo_overrides(args, cfg)
        if not args.config and speaks:
            print(no_recipe_note(cfg.task), file=sys.stderr, flush=True)
    if cfg.ensemble_seeds and "WORLD_SIZE" in os.environ:
        raise ValueError("ensemble_seeds: an ensemble trains its members one by one; train "
                         "them on one process each")
    if task_spec(cfg.task).landmarks and "WORLD_SIZE" in os.environ:
        raise ValueError(f"task: {cfg.task}'s objective over (stay, hour) rows is not gathered "
                         "across processes; train a landmark task on one process")
    try:
        if cfg.ensemble_seeds:
            from scehr.training.ensemble import train_ensemble

            final = train_ensemble(cfg)
        else:
            final = train_run(cfg, resume=bool(args.resume))
    except TrainingInterrupted as e:
        if speaks:
            print(e, file=sys.stderr)
        return e.exit_code
    finally:
        leave_process_group()
    if final:  # the other processes of a distributed run leave the summary to rank 0
        print_summary(final)
    return 0


def print_summary(final: dict[str, Any]) -> None:
    from scehr.training.bootstrap import format_ci

    speed = final.get("train_stays_per_second")  # an ensemble run trains nothing itself
    print(f"run: {final.get('run_dir', '')}  best epoch {final['best_epoch']}  "
          + (f"train {speed:.0f} stays/s  " if speed else "")
          + f"wall {final['wall_seconds']:.0f} s")
    for name, ci in {**final["test_ci"], **(final.get("test_ci_binary") or {})}.items():
        if isinstance(ci, dict):
            print(f"  test {name:<17} {format_ci(ci)}")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from scehr.training.bootstrap import format_ci
    from scehr.training.evaluate import evaluate_run

    if (Path(args.run_dir) / "manifest.json").is_file():
        return _evaluate_exported(args)
    if args.data:
        raise ValueError("--data scores an exported model folder (model.onnx + manifest.json); "
                         f"{args.run_dir} is a run directory, evaluated on its own test split")
    out = evaluate_run(Path(args.run_dir), n_boot=args.n_boot)
    if args.json:
        print(json.dumps({k: out[k] for k in ("test_ci", "challenge2012") if k in out},
                         indent=2))
        return 0
    print_table(["TEST METRIC", "VALUE [95% CI]"],
                [[name, format_ci(ci)] for name, ci in out["test_ci"].items()])
    challenge = {k: v for k, v in out.get("challenge2012", {}).items() if isinstance(v, dict)}
    for which, ch in challenge.items():
        best = format_ci(ch["event1_best_threshold_on_test"])
        print(f"Challenge 2012 on the {which.replace('_', ' ')}: Event 1 "
              f"{format_ci(ch['event1'])} at threshold {ch['event1_threshold']:.3f} "
              f"(chosen on validation; best on test {best}), "
              f"Event 2 H {format_ci(ch['event2_h_normalized'], 2)} "
              f"(plain H {format_ci(ch['event2_h'], 2)}); winners 0.5353 / 17.88")
    if challenge:
        print(CHALLENGE_NOTE)
    return 0


#: What the PhysioNet/CinC Challenge 2012 scores mean, printed under them.
CHALLENGE_NOTE = (
    "  Event 1 = min(sensitivity, positive predictive value) of the alerts risk >= threshold:\n"
    "    higher is better; the Challenge's winners reached 0.5353 on set C.\n"
    "  Event 2 = Hosmer-Lemeshow H of the risk over 10 risk groups, divided by the spread of\n"
    "    the groups' mean risk (the Challenge's score): a calibration error, lower is better;\n"
    "    the winners reached 17.88. Plain H is the undivided statistic.")


def _evaluate_exported(args: argparse.Namespace) -> int:
    """External validation of an exported model folder on a converted dataset, scored the way
    the service serves it; the report is written to --out."""
    from scehr.training.site_report import write_report

    if not args.data:
        raise ValueError(f"{args.run_dir} is an exported model: give the dataset to score it "
                         "on with --data DIR (a converted, benchmark-layout folder)")
    model = Path(args.run_dir)
    out = Path(args.out) if args.out else Path(f"evaluation-{model.parent.name}-{model.name}")
    if out.suffix == ".json":
        raise ValueError(f"--out {out}: the report is a folder (report.json, report.html and "
                         "its figures); give a folder name")
    command = shlex.join(["scehr", *getattr(args, "argv", [])])
    report = write_report(model, Path(args.data), out, compare=args.compare and
                          Path(args.compare), split=args.split, n_boot=args.n_boot,
                          command=command)
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for line in report_lines(report):
        print(line)
    print(f"report: {out / 'report.html'} (figures inline; report.json holds every figure)")
    return 0


#: The discrimination and calibration rows of `scehr evaluate`'s table, with their digits.
_REPORT_ROWS = {"auroc": 3, "auprc": 3, "ece": 3, "calibration_slope": 3,
                "calibration_intercept": 3, "event1_best_threshold": 3,
                "event2_h_normalized": 2, "event2_h": 2}


def _ci_text(ci: dict | None, digits: int = 3, percent: bool = False) -> str:
    from scehr.training.bootstrap import format_ci

    if not ci:
        return "n/a"
    if ci.get("warning"):
        return "not estimable (see warnings)"
    if percent and ci.get("value") is not None:
        return format_ci({k: (100 * v if isinstance(v, float) and k in ("value", "low", "high")
                              else v) for k, v in ci.items()}, 1) + " %"
    return format_ci(ci, digits)


def report_lines(report: dict) -> list[str]:
    """`scehr evaluate`'s console summary of a report (scehr.training.site_report)."""
    d = report["data"]
    lines = [f"stays: {d['stays']} of {d['folder']} (split: {d['split']}), "
             f"{d['events']} with the outcome"]
    cols = [(role, pop) for role in report["models"] for pop in ("scored", "all")]
    for b in report["models"].values():
        a, v = b["abstention"], b["model"]["version"]
        if a["data_minimum"] is None:
            lines.append(f"{v}: no data minimum: every stay is scored")
            continue
        ref = a.get("rate_on_the_models_test_set")
        lines.append(f"{v}: {a['abstained']} of {a['n']} stays abstain below the data minimum "
                     f"({_ci_text(a['rate'], percent=True)})"
                     + (f"; {100 * ref:.1f} % on the model's own test set" if ref is not None
                        else ""))
        lines += [f"  {r['stays']:>5}  {r['reason']}" for r in a["reasons"]]
    header = ["METRIC", *(f"{report['models'][r]['model']['version']} "
                          + ("scored" if p == "scored" else "all (minimum lifted)")
                          for r, p in cols)]
    rows = [["stays (with outcome)", *(f"{report['models'][r][p]['metrics']['n']} "
                                        f"({report['models'][r][p]['metrics']['events']})"
                                        for r, p in cols)]]
    rows += [[k, *(_ci_text(report["models"][r][p]["metrics"].get(k), digits)
                   for r, p in cols)] for k, digits in _REPORT_ROWS.items()]
    covered = [(r, p) for r, p in cols if report["models"][r][p]["coverage"]]
    for key in ("overall", "with_outcome", "without_outcome"):
        if covered:
            rows.append([f"coverage {key.replace('_', ' ')}", *(
                _ci_text(report["models"][r][p]["coverage"][key], percent=True)
                if report["models"][r][p]["coverage"] else "no interval" for r, p in cols)])
    lines += table_lines(header, rows)
    for b in report["models"].values():
        v = b["model"]["version"]
        every = {p["name"]: p for p in b["all"]["operating_points"]}
        for p in b["scored"]["operating_points"]:
            rate, se, ppv = (_ci_text(p[k], percent=True)
                             for k in ("alert_rate", "sensitivity", "ppv"))
            lifted = _ci_text(every[p["name"]]["alert_rate"], percent=True)
            lines.append(f"{v} {p['name']}{' (default)' if p['default'] else ''}: alert rate "
                         f"{rate}, sensitivity {se}, PPV {ppv} (all stays: alert rate "
                         f"{lifted})")
        lines += [f"{v} {w['name']}: withheld: {w['reason']}"
                  for w in b["model"]["withheld_points"]]
    lines.append(CHALLENGE_NOTE)
    site = report.get("site", {})
    if site.get("neutralised_channels"):
        lines.append("never seen in training, treated as not observed: "
                     + ", ".join(site["neutralised_channels"]))
    if site.get("never_observed"):
        lines.append("never observed on this site: " + ", ".join(site["never_observed"]))
    return lines


def cmd_recalibrate(args: argparse.Namespace) -> int:
    from scehr.training.bootstrap import format_ci
    from scehr.training.site_model import recalibrate
    from scehr.training.site_report import REPORT_FOLDER

    def ci(i: object) -> str:
        return format_ci(i.model_dump()) if hasattr(i, "model_dump") else "n/a"

    out, record, index = recalibrate(Path(args.model_dir), Path(args.data), Path(args.out),
                                     version=args.version, seed=args.seed, n_boot=args.n_boot)
    prov, fig, was = record.provenance, record.figures, record.parent_figures
    print(f"wrote {out}: {prov.parent} recalibrated on {prov.data} ({prov.stays} stays, "
          f"{prov.below_minimum} below the data minimum)")
    print(f"split (seed {prov.split.seed}, {out / prov.split.file}): fitted on "
          f"{prov.split.fit.scored} stays ({prov.split.fit.scored_positives} with the outcome), "
          f"measured on {fig.scored} held-out stays ({fig.positives} with the outcome)")
    print(f"\nwhat changed against {prov.parent} (held-out figures: parent -> site model):")
    for line in record.changes:
        print(f"  {line}")
    rows = [[name, ci(getattr(was, name)), ci(getattr(fig, name))]
            for name in ("auroc", "auprc", "ece", "coverage", "coverage_with_outcome",
                         "abstention_rate")]
    rows += [[f"alert rate {n}", ci(was.alert_rates.get(n)), ci(i)]
             for n, i in fig.alert_rates.items()]
    print()
    print_table(["HELD-OUT (95% CI)", "parent", "site model"], rows)
    for line in index:
        print(line)
    report = out / REPORT_FOLDER / "report.html"
    if report.is_file():
        print(f"report against {args.model_dir}: {report}")
    return 0


def cmd_robustness(args: argparse.Namespace) -> int:
    from scehr.training.data.writer import write_json
    from scehr.training.robustness import evaluate_missing, markdown_table

    report = evaluate_missing(Path(args.model_dir), Path(args.data), split=args.split,
                              n_boot=args.n_boot)
    if args.out:
        write_json(Path(args.out), report)
    print(json.dumps(report, indent=2) if args.json else markdown_table(report))
    return 0


def table_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart (the human-readable default; --json for tools)."""
    cells = [header, *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in cells]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    for line in table_lines(header, rows):
        print(line)


def cmd_grid(args: argparse.Namespace) -> int:
    from scehr.training.studies.experiments import run_grid

    base = _config(args)
    echo_overrides(args, base)
    run_grid(base, Path(args.grid_dir), batch_sizes=args.batch_sizes, lams=args.lams,
             losses=args.losses, seeds=args.seeds)
    print((Path(args.grid_dir) / "summary.md").read_text())
    return 0


def cmd_imbalance(args: argparse.Namespace) -> int:
    from scehr.training.studies.experiments import run_imbalance

    cfg = _config(args)
    echo_overrides(args, cfg)
    run_imbalance(cfg, Path(args.study_dir), prevalences=args.prevalences,
                  seeds=args.seeds, losses=args.losses)
    print((Path(args.study_dir) / "imbalance.md").read_text())
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from scehr.training.studies.experiments import run_comparison

    argv = sys.argv[1:]  # the exact command for the report, when run from a shell
    cfg = _config(args)
    echo_overrides(args, cfg)
    run_comparison(cfg, Path(args.study_dir), lam=args.scr_lam, seeds=args.seeds,
                   docs=Path(args.docs) if args.docs else None,
                   command=shlex.join(["scehr", *argv]) if argv[:1] == ["compare"] else None)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from scehr.training.interrupt import TrainingInterrupted
    from scehr.training.studies.study import run_study

    try:
        run_study(args.study, out=Path(args.out) if args.out else None, data=args.data,
                  methods=args.methods, embeddings=args.embeddings)
    except TrainingInterrupted as e:
        print(f"{e}; rerun `scehr study {args.study}` to continue (finished runs are kept)",
              file=sys.stderr)
        return e.exit_code
    return 0


def cmd_embedding(args: argparse.Namespace) -> int:
    from scehr.training.studies.experiments import embedding_study

    report = embedding_study(Path(args.run_dir), label=args.label)
    if args.json:
        print(json.dumps(report, indent=2, default=float))
    else:
        print_table(["MEASURE", "VALUE"], [[k, _cell(v)] for k, v in report.items()])
    return 0


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "; ".join(f"{k} {_cell(x)}" for k, x in v.items())
    return str(v)


def cmd_export(args: argparse.Namespace) -> int:
    from scehr.training.export import export_run

    out, changes = export_run(
        Path(args.run_dir), Path(args.out), version=args.version, name=args.name,
        set_default=args.set_default,
        reproduce=args.reproduce.replace("\\n", "\n") if args.reproduce else None,
        limitations=args.limitation, data_description=args.data_description)
    print(f"exported {out}")
    for line in changes:
        print(line)
    return 0


def cmd_ensemble(args: argparse.Namespace) -> int:
    from scehr.training.ensemble import select_and_combine

    final = select_and_combine(args.runs, args.out, select=args.select,
                               max_members=args.max_members, n_boot=args.n_boot)
    print(f"ensemble run {args.out} ({len(final['members'])} members); "
          f"export it with: scehr export {args.out} --out models/<task>/<version>")
    print_summary(final)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an encoder with a contrastive loss")
    _train_args(p)
    p.add_argument("--resume", metavar="RUN", help="continue a run stopped by Ctrl-C/SIGTERM "
                   "from RUN/resume.pt, with RUN's saved config (on any number of processes)")
    p.add_argument("--nproc", type=_positive_int, default=1, metavar="N",
                   help="train on N processes of this machine (torchrun; gloo on CPUs, NCCL "
                   "with one GPU per process); --batch-size is the global batch they share "
                   "(default 1: one process)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="re-evaluate a run directory on its test set, or score "
                       "an exported model on another dataset (--data)")
    p.add_argument("run_dir", help="a run directory, or an exported model folder "
                   "(model.onnx + manifest.json, e.g. models/mortality/1.0.0)")
    p.add_argument("--data", help="with a model folder: the converted dataset to score it on, "
                   "as the service serves it (external validation)")
    p.add_argument("--out", help="with --data: the report folder (report.json, report.html "
                   "and its figures; default: evaluation-<task>-<version>)")
    p.add_argument("--compare", metavar="MODEL_DIR", help="with --data: also score this model "
                   "(e.g. the site model `scehr recalibrate` wrote) on the same stays, beside "
                   "the first")
    p.add_argument("--split", choices=["all", "train", "val", "test"], default="all",
                   help="with --data: the stays to report on")
    p.add_argument("--n-boot", type=_positive_int, default=1000,
                   help="bootstrap resamples for the CIs")
    p.add_argument("--json", action="store_true", help="print the test CIs (with --data: the "
                   "whole report) as JSON")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("recalibrate", help="refit an exported model's calibration map, "
                       "uncertainty map and operating points on a site's stays and write it as "
                       "a new model version with the site's figures (the ONNX graph is "
                       "unchanged)")
    p.add_argument("model_dir", help="exported model folder, e.g. models/mortality/1.3.2")
    p.add_argument("--data", required=True, help="the site's converted dataset: all its stays "
                   "are split, seeded and stratified, into a fitting part (70 %%) and a "
                   "held-out part (30 %%) that measures the site model")
    p.add_argument("--out", required=True, help="new folder <models>/<task>/<version>/ "
                   "(its index.json gets the entry; never the shipped models/)")
    p.add_argument("--version", help="default: the folder name of --out")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    p.add_argument("--n-boot", type=_positive_int, default=1000,
                   help="bootstrap resamples for the held-out figures' CIs")
    p.set_defaults(func=cmd_recalibrate)

    p = sub.add_parser("robustness", help="score an exported model with whole channel groups "
                       "removed (GCS, labs, ...), each as if never recorded")
    p.add_argument("model_dir", help="exported model folder, e.g. models/mortality/1.2.0")
    p.add_argument("--data", required=True, help="converted dataset to score it on")
    p.add_argument("--split", choices=["train", "val", "test"], default="test",
                   help="which split (default test; choose settings on val)")
    p.add_argument("--n-boot", type=_positive_int, default=1000,
                   help="bootstrap resamples for the CIs")
    p.add_argument("--out", help="also write the report as JSON here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_robustness)

    p = sub.add_parser("grid", help="resumable grid over batch size x lambda x loss")
    _train_args(p)
    p.add_argument("grid_dir")
    p.add_argument("--batch-sizes", type=_positive_int, nargs="+", default=[64, 256],
                   help="batch sizes of the grid")
    p.add_argument("--lams", type=_lam, nargs="+", default=[0.0, 0.002, 0.007, 0.01],
                   help="λ values of the grid")
    p.add_argument("--losses", nargs="+", default=["cbce"],
                   help=f"classification terms of the grid ({', '.join(CCE_LOSSES)})")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds per grid cell")
    p.set_defaults(func=cmd_grid)

    p = sub.add_parser("imbalance", help="down-sample training positives to target prevalences")
    _train_args(p)
    p.add_argument("study_dir")
    p.add_argument("--prevalences", type=_prevalence, nargs="+", default=[0.05, 0.01, 0.001],
                   help="training prevalences to down-sample to")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds per setting")
    p.add_argument("--losses", nargs="+", default=["bce", "cbce"],
                   help="losses as NAME or NAME@λ")
    p.set_defaults(func=cmd_imbalance)

    p = sub.add_parser("compare", help="CBCE+SCR vs BCE vs logistic regression, paired bootstrap")
    _train_args(p)
    p.add_argument("study_dir")
    p.add_argument("--scr-lam", type=_lam, default=0.007, help="λ of the CBCE+SCR arm")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds per arm")
    p.add_argument("--docs", help="also write the markdown report here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("study", help="methods x seeds from a study file (configs/study_*.toml): "
                       "resumable, progress with ETA, summary table with CIs vs the reference")
    p.add_argument("study", help="study TOML (see training/studies/study.py)")
    p.add_argument("--data", help="benchmark-layout data folder (default: the study's)")
    p.add_argument("--out", help="study folder (default runs/study-<file name>)")
    p.add_argument("--methods", nargs="+", help="train only these methods, no summary (to split "
                   "a study over processes; a run without it then reads all back)")
    p.add_argument("--embeddings", action="store_true", help="also the embedding study of every "
                   "method: separation, spread, linear probe (seed mean), t-SNE grid")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("embedding", help="embedding study of a run: separation, spread, "
                       "linear probe, t-SNE with the anchors")
    p.add_argument("run_dir")
    p.add_argument("--label", type=int, default=0, help="class whose anchors are drawn")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_embedding)

    p = sub.add_parser("ensemble", help="choose members among trained runs on validation and "
                       "combine them into one ensemble run (exported as one ONNX graph)")
    p.add_argument("runs", nargs="+", help="run directories trained with one data split "
                   "(scehr train --split-seed)")
    p.add_argument("--out", required=True, help="the ensemble's run directory")
    p.add_argument("--select", choices=["greedy", "all"], default="greedy",
                   help="greedy forward selection on validation (default; kept only if it "
                   "beats all runs together on validation) or all runs")
    p.add_argument("--max-members", type=_positive_int, dest="max_members",
                   help="at most this many members (greedy)")
    p.add_argument("--n-boot", type=_positive_int, dest="n_boot", default=1000,
                   help="bootstrap resamples for the test CIs (default 1000)")
    p.set_defaults(func=cmd_ensemble)

    p = sub.add_parser("export", help="export a run to ONNX + manifest under models/")
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="models/<task>/<version>/")
    p.add_argument("--version", help="default: the folder name of --out")
    p.add_argument("--name", help="model name (default scehr-<task>-<encoder>-<loss>)")
    p.add_argument("--set-default", action="store_true",
                   help="make it the task's default (otherwise the default stays, unless the "
                   "task has none yet); an existing version is never overwritten")
    p.add_argument("--reproduce", help="commands for the model card (default: train + export "
                   "of this run); '\\n' separates lines")
    p.add_argument("--limitation", action="append", default=[],
                   help="a limitation for the model card (repeatable)")
    p.add_argument("--data-description", help="one paragraph on the training data")
    p.set_defaults(func=cmd_export)
