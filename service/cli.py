"""`scehr serve`, `scehr score` and `scehr models list | add | set-default | remove | diff`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from scehr.schemas.tasks import TASK_NAMES


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = subparsers.add_parser(
        "serve", help="serve the models over HTTP",
        description="Start the scoring server (uvicorn). With no options it serves the default "
        "models of models/index.json on 127.0.0.1:8000. Every SCEHR_* setting also applies.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    serve.add_argument("--port", type=int, default=int(os.environ.get("SCEHR_PORT", "8000")),
                       help="TCP port (default: SCEHR_PORT, else 8000)")
    serve.add_argument("--workers", type=int, default=None,
                       help="worker processes, each with its own models and batcher (default: "
                       "one per available core, cgroup CPU quota included; ORT intra-op "
                       "threads per worker = cores // workers; on Linux each worker accepts "
                       "on its own SO_REUSEPORT socket)")
    serve.add_argument("--model-dir", type=Path, help="folder with index.json (SCEHR_MODEL_DIR)")
    serve.add_argument("--device", choices=["auto", "cuda", "cpu"], help="SCEHR_DEVICE")
    serve.add_argument("--version", metavar="TASK=VERSION", action="append",
                       help="serve this version of the task, repeatable; with several versions "
                       "of a task a request picks one with ?version= (e.g. mortality=1.3.1 "
                       "--version mortality=1.1.1 also serves the benchmark-17 model; "
                       "SCEHR_VERSIONS)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="SCEHR_LOG_LEVEL")
    serve.set_defaults(func=_serve)

    sc = subparsers.add_parser(
        "score", help="score a folder or file of stays offline (resumable, shardable)",
        description="Score every stay of INPUT with the service's own validation, tensorize "
        "and ONNX model, writing one row per stay (keyed by its id) to --out. Rerun the same "
        "command after a crash to resume. INPUT: a benchmark split folder (listfile.csv + "
        "*_timeseries.csv), a .jsonl of stay payloads, or a .csv/.parquet of long-form "
        "observations (stay_id, variable, time, value[, unit, end_hours, age, sex]).")
    sc.add_argument("model", metavar="MODEL_OR_TASK",
                    help="a task (its default model, or --version) or a model folder")
    sc.add_argument("input", type=Path, metavar="INPUT")
    sc.add_argument("--out", type=Path, required=True,
                    help="output file, .jsonl or .csv (appended to: resumes)")
    sc.add_argument("--version", help="model version of the task (default: index default)")
    sc.add_argument("--model-dir", type=Path, help="folder with index.json (SCEHR_MODEL_DIR)")
    sc.add_argument("--shard", default="0/1", metavar="I/N",
                    help="score only part I of N of INPUT, reading only that part (byte "
                    "ranges on line starts, listfile rows, Parquet row groups)")
    sc.add_argument("--chunk-size", type=int, default=256,
                    help="stays per chunk (scored and written together)")
    sc.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="ONNX Runtime device, as SCEHR_DEVICE")
    sc.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: "
                    "all cores this process may use)")
    sc.add_argument("--strict", action="store_true",
                    help="values outside the cleaning ranges are errors, as ?strict=true")
    sc.add_argument("--allow-insufficient", action="store_true",
                    help="score a stay below the model's data minimum anyway (its row warns "
                    "below_data_minimum), as ?allow_insufficient=true; by default such a stay "
                    "gets status insufficient_data and no risk")
    sc.add_argument("--every", choices=["1h"],
                    help="each stay's risk at every hour (from the task's landmark model, e.g. "
                    "mortality -> mortality-landmark), as POST /predict/{task}/trajectory: "
                    "one .jsonl row per stay with its hours and alert events")
    sc.add_argument("--quiet", action="store_true", help="no progress bar")
    sc.set_defaults(func=_score)

    models = subparsers.add_parser("models", help="inspect and manage the model directory")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION")
    ls = msub.add_parser("list", help="list the models of index.json")
    ls.add_argument("--model-dir", type=Path,
                    help="folder with index.json (default: SCEHR_MODEL_DIR, else models/)")
    ls.add_argument("--json", action="store_true", help="print the index entries as JSON")
    ls.set_defaults(func=_list)
    add = msub.add_parser("add", help="copy a model folder built elsewhere (e.g. by "
                          "build_default_models --models DIR) into the model directory and "
                          "register it; an existing version is refused")
    add.add_argument("folder", type=Path, help="a folder with manifest.json and its ONNX graph")
    add.add_argument("--model-dir", type=Path, help="folder with index.json (SCEHR_MODEL_DIR)")
    add.add_argument("--set-default", action="store_true",
                     help="make it the task's default (otherwise the default stays)")
    add.set_defaults(func=_add)
    sd = _version_parser(msub, "set-default", "make a version the task's default (prints the "
                         "change; running services pick it up on restart or reload)")
    sd.set_defaults(func=_set_default)
    rm = _version_parser(msub, "remove", "drop a version from index.json (never the default)")
    rm.add_argument("--delete-files", action="store_true",
                    help="also delete its folder (default: keep the files)")
    rm.set_defaults(func=_remove)
    diff = msub.add_parser("diff", help="compare two model folders: ONNX sha256, manifest "
                           "metrics and settings; exit 1 when they differ")
    diff.add_argument("a", type=Path)
    diff.add_argument("b", type=Path)
    diff.set_defaults(func=_diff)
    models.set_defaults(func=lambda a: models.print_help() or 2)


def _version_parser(msub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                    text: str) -> argparse.ArgumentParser:
    """A `scehr models` action on one version of a task in the model directory's index."""
    p = msub.add_parser(name, help=text)
    p.add_argument("task", choices=TASK_NAMES)
    p.add_argument("version")
    p.add_argument("--model-dir", type=Path, help="folder with index.json (SCEHR_MODEL_DIR)")
    return p


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from scehr.service.logs import uvicorn_log_config
    from scehr.service.registry import ModelLoadError, Registry, load_model
    from scehr.service.runtime import CUDA_UNUSABLE_ENV
    from scehr.service.settings import Settings, available_cores
    from scehr.service.workers import Reservation, check_port_free, reuse_port_balances, run_workers

    for opt, env in (("model_dir", "SCEHR_MODEL_DIR"), ("device", "SCEHR_DEVICE"),
                     ("log_level", "SCEHR_LOG_LEVEL")):
        value = getattr(args, opt)
        if value is not None:
            os.environ[env] = str(Path(value).resolve()) if opt == "model_dir" else str(value)
    if args.version:  # the workers read it from the environment, like every other setting
        os.environ["SCEHR_VERSIONS"] = ",".join(args.version)
    workers = args.workers if args.workers is not None else available_cores()
    if workers < 1:
        print("scehr serve: --workers must be >= 1", file=sys.stderr)
        return 2
    os.environ["SCEHR_WORKERS"] = str(workers)
    try:
        settings = Settings()
    except ValueError as e:  # pydantic's ValidationError: a bad SCEHR_* value, named
        print(f"scehr serve: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    # Fail here, with one clear line, before any worker starts: every configured model is
    # loaded and warmed up once (a corrupt graph whose sha256 matches, anchors that do not
    # reproduce the graph), since a worker could only report it as a model that never loads.
    try:
        registry = Registry(settings, None, None)  # type: ignore[arg-type]
        registry.preflight()
        for task, folders in registry.folders.items():
            for folder in folders:
                load_model(folder, task, settings, runtime=registry.runtime)
    except ModelLoadError as e:
        print(f"scehr serve: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    if registry.runtime.cuda_works is False:  # warned once here; the workers need not retry
        os.environ[CUDA_UNUSABLE_ENV] = "1"
    reservation = None
    if workers > 1:  # the port checked before any worker starts, as one clear line
        try:
            check_port_free(args.host, args.port)
            if reuse_port_balances():
                reservation = Reservation(args.host, args.port)
        except OSError as e:
            print(f"scehr serve: cannot listen on {args.host}:{args.port}: {e.strerror}",
                  file=sys.stderr)
            return 1
    created = _multiprocess_dir(workers)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the previous handler;
    # a no-op handler here makes a graceful stop exit with status 0, as process managers expect.
    signal.signal(signal.SIGTERM, lambda *_: None)
    app = "scehr.service.app:build_app"
    config: dict[str, Any] = dict(factory=True, host=args.host, port=args.port, workers=workers,
                  log_config=uvicorn_log_config(settings.log_level), access_log=False,
                  timeout_graceful_shutdown=30,
                  # Longer than a load balancer's idle timeout (60 s is common) and than the
                  # longest Retry-After: refused clients come back on the same connection
                  # instead of paying a new one each time.
                  timeout_keep_alive=75)
    try:
        if workers == 1:
            uvicorn.run(app, **config)
            return 0
        return run_workers(uvicorn.Config(app, **config), reservation)
    finally:
        os.environ.pop(CUDA_UNUSABLE_ENV, None)
        if reservation is not None:
            reservation.close()
        if created is not None:  # only a folder this process made is ever deleted
            shutil.rmtree(created, ignore_errors=True)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)


def _multiprocess_dir(workers: int) -> Path | None:
    """The Prometheus multiprocess folder; returns it when this process created it.

    Unset and several workers: a private temporary folder, removed at exit. Set by the operator:
    used as given and never deleted; only prometheus_client's own `<kind>_<pid>.db` files of an
    earlier run and its workers' readiness marks are removed from it (they would be summed into
    this run's counters, or count as ready workers).
    """
    from scehr.service import readiness
    from scehr.service.metrics import METRIC_FILE

    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for f in folder.iterdir():
            if f.is_file() and (METRIC_FILE.match(f.name) or readiness.MARK.match(f.name)):
                f.unlink()
        return None
    if workers <= 1:
        return None
    created = Path(tempfile.mkdtemp(prefix="scehr-metrics-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(created)
    return created


def _metrics(metrics: dict, on: str | None = None) -> str:
    """'auroc 0.826 [0.807, 0.842]; ...' from an index entry's metrics, led by where they
    were measured when the entry says (a site model: 'site held-out part of ...: ')."""
    parts = []
    for name, m in metrics.items():
        if isinstance(m, dict) and m.get("value") is not None:
            ci = (f" [{m['low']:.3f}, {m['high']:.3f}]" if m.get("low") is not None
                  and m.get("high") is not None else "")
            parts.append(f"{name} {m['value']:.3f}{ci}")
        elif isinstance(m, (int, float)):
            parts.append(f"{name} {m:.3f}")
    return (f"{on}: " if on and parts else "") + "; ".join(parts)


def _score(args: argparse.Namespace) -> int:
    """`_score_run`; Ctrl-C stops it with one line saying how to go on (status 130, the
    shell's for SIGINT): the rows written so far are kept and a rerun resumes after them."""
    try:
        return _score_run(args)
    except KeyboardInterrupt:
        again = shlex.join(["scehr", *getattr(args, "argv", sys.argv[1:])])
        print(f"scehr score: interrupted; the rows written so far stay in {args.out}: to go "
              f"on, run the same command: {again}", file=sys.stderr)
        return 130


def _score_run(args: argparse.Namespace) -> int:
    from scehr.service.offline_scoring import score
    from scehr.service.registry import ModelLoadError
    from scehr.service.shards import parse_shard

    if args.chunk_size < 1:
        raise ValueError("--chunk-size must be >= 1")
    try:
        summary = score(args.model, args.input, args.out, model_dir=_model_dir(args),
                        version=args.version, shard=parse_shard(args.shard),
                        chunk_size=args.chunk_size, device=args.device, threads=args.threads,
                        strict=args.strict, allow_insufficient=args.allow_insufficient,
                        progress=not args.quiet, every=args.every)
    except ModelLoadError as e:
        print(f"scehr score: {e}", file=sys.stderr)
        return 1
    del summary  # stays with errors are rows of the output, not a failure of the run
    return 0


def _model_dir(args: argparse.Namespace) -> Path:
    from scehr.service.settings import Settings

    return args.model_dir or Settings().model_dir


def _add(args: argparse.Namespace) -> int:
    from scehr.schemas.model_index import import_model

    for line in import_model(_model_dir(args), args.folder, set_default=args.set_default):
        print(line)
    return 0


def _set_default(args: argparse.Namespace) -> int:
    from scehr.schemas.model_index import set_default

    print(set_default(_model_dir(args), args.task, args.version))
    return 0


def _remove(args: argparse.Namespace) -> int:
    from scehr.schemas.model_index import remove_model

    message, folder = remove_model(_model_dir(args), args.task, args.version)
    print(message)
    if args.delete_files:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"deleted {folder}")
    else:
        print(f"files kept in {folder} (--delete-files deletes them)")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from scehr.schemas.model_index import compare_models

    differences, notes = compare_models(args.a, args.b)
    for line in notes:
        print(f"note: {line}")
    for line in differences:
        print(f"differs: {line}")
    if not differences:
        print(f"{args.a} and {args.b} are the same model (ONNX sha256, manifest)")
    return 1 if differences else 0


def _list(args: argparse.Namespace) -> int:
    from scehr.schemas.model_index import read_index

    index = read_index(_model_dir(args))
    if args.json:
        print(json.dumps(index.model_dump(), indent=2))
        return 0
    rows = [("TASK", "VERSION", "DEFAULT SINCE", "NAME", "ENCODER", "LOSS", "FEATURE SET",
             "METRICS (95% CI; test set, or a site model's held-out site stays)", "PATH")]
    order = {t: i for i, t in enumerate(TASK_NAMES)}
    for e in sorted(index.models, key=lambda e: (order.get(e.task, 9), e.version)):
        extra = e.model_dump(exclude_none=True)
        is_default = index.defaults.get(e.task) == e.version
        rows.append((e.task, e.version,
                     (index.default_since.get(e.task) or "*") if is_default else "",
                     e.name or "", str(extra.get("encoder", "")), str(extra.get("loss", "")),
                     str(extra.get("feature_set", "")), _metrics(extra.get("metrics") or {},
                                                                   extra.get("metrics_on")),
                     e.path))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0
