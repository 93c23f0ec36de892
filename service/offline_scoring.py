"""`scehr score`: offline batch scoring of a folder or file of stays with the service's own code.

A stay goes through exactly what `POST /predict/{task}/batch` runs: `StayPayload` validation,
the service's scorer (`scorer.score_offline`: ingest, cleaning, tensorize, read-outs) on the
model's ONNX Runtime session loaded and warmed up by `registry.load_model`; so scores equal
the service's.
Needs the `serve` extra only (no torch, no pandas; Parquet input needs pyarrow).

Inputs, streamed one stay at a time (memory is bounded by one chunk of stays plus the set of
ids already written):
- a benchmark-layout folder: `listfile.csv` + one `*_timeseries.csv` per stay (+ optional
  `demographics.csv`), as `scehr data convert-*` and mimic3-benchmarks write them;
- a JSON Lines file of stay payloads (`.jsonl`), the API's request body per line;
- long-form observations (`.csv` or `.parquet`): columns `stay_id`, `variable`, `time`, `value`
  and optionally `unit`, `end_hours`, `age`, `sex`; the rows of one stay are contiguous.

Output: one row per input stay, keyed by its id, as JSON Lines (`.jsonl`) or CSV (`.csv`).
Rows are appended chunk by chunk and fsynced; a rerun of the same command after a crash or
SIGKILL reads the ids already written, drops a torn last line, and goes on; a chunk is always
scored whole, so a resumed run writes exactly what an uninterrupted one would.
`--shard I/N` scores part I of N of the input and reads only that part (service/shards.py):
a byte range of a JSON Lines or long-form CSV file moved to line starts, a range of listfile
rows for a folder, a range of row groups for Parquet; a stay whose rows cross a part's end
belongs to the part its first row is in. Per-shard work falls as 1/N.

A stay is keyed by its id; a stay that repeats an id already seen in the same run gets its own
error row (`duplicate_id`) keyed by its position (`line-N`, `row-N`), so the output holds one
row per input stay.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from scehr.schemas.payloads import ClassResult, Prediction, Problem, StayPayload
from scehr.schemas.tasks import TASK_NAMES, landmark_task, task_spec
from scehr.schemas.trajectory_payloads import TrajectoryPrediction
from scehr.schemas.variables import CATALOG
from scehr.service.pipeline import pydantic_problems
from scehr.service.scorer import score_offline
from scehr.service.shards import byte_range, index_range, line_before, lines_in

#: Output field per class -> where the service's response holds it. The one place that maps
#: the response contract to output columns: a renamed response field is one edit here.
CLASS_FIELDS: dict[str, Callable[[ClassResult], Any]] = {
    "risk": lambda c: c.risk,
    "score": lambda c: c.score,
    "alert": lambda c: c.alert,
    "risk_low": lambda c: None if c.risk_interval is None else c.risk_interval.low,
    "risk_high": lambda c: None if c.risk_interval is None else c.risk_interval.high,
    "outcomes": lambda c: None if c.risk_interval is None else (
        ";".join(c.risk_interval.outcomes) or "none"),
}

#: The steps `--every` takes: a landmark model's graph gives the risk at every hour.
EVERY = ("1h",)
LISTFILE = "listfile.csv"
#: The notice code of a stay below the data minimum that was scored on request.
BELOW_MINIMUM = "below_data_minimum"
DEMOGRAPHICS = "demographics.csv"
ID_COLUMNS = ("stay_id", "id", "stay")
STAY_COLUMNS = ("end_hours", "age", "sex", "admission_time")

Raw = dict[str, Any] | list[Problem]  # a payload to validate, or why it could not be read
Stay = tuple[str, Raw, str]  # (key, payload or problems, its position: line-N, row-N, stay-ID)


# ---------------------------------------------------------------- inputs


def _number(cell: str) -> float | str:
    try:
        return float(cell)
    except ValueError:
        return cell


def benchmark_payload(csv_path: Path, *, end_hours: float | None = None,
                      age: float | None = None, sex_male: float | None = None) -> dict[str, Any]:
    """A benchmark `*_timeseries.csv` as the API's wide form (units as the benchmark's)."""
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = set(reader.fieldnames or ())
    # every catalog variable the file has a column for: the benchmark channels, and e.g. the
    # labs of a physionet2012-full conversion (reading only the 17 would drop them)
    used = [v for v in CATALOG if v.benchmark_name in header]
    columns: dict[str, list[Any]] = {}
    for v in used:
        cells = [r.get(v.benchmark_name) or "" for r in rows]
        columns[v.benchmark_name] = [
            (c if v.is_categorical else float(c)) if c != "" else None for c in cells]
    payload: dict[str, Any] = {"wide": {
        "hours": [float(r["Hours"]) for r in rows], "columns": columns,
        "units": {v.benchmark_name: v.unit for v in used if v.unit_required}}}
    demo: dict[str, Any] = {}
    if age is not None:
        demo["age"] = age
    if sex_male is not None:
        demo["sex"] = "male" if sex_male == 1 else "female"
    if demo:
        payload["demographics"] = demo
    if end_hours is not None:
        payload["end_hours"] = end_hours
    return payload


def _optional_float(cell: str | None) -> float | None:
    try:
        return float(cell) if cell not in (None, "") else None
    except ValueError:
        return None


def count_benchmark(folder: Path) -> int:
    with open(folder / LISTFILE, newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


def read_benchmark(folder: Path, shard: tuple[int, int] = (0, 1)) -> Iterator[Stay]:
    """(stay, payload, row-N) per listfile row of the shard's range (only their time series
    are read); a missing or unreadable CSV is that stay's error."""
    demo: dict[str, dict[str, str]] = {}
    if (folder / DEMOGRAPHICS).is_file():
        with open(folder / DEMOGRAPHICS, newline="") as f:
            demo = {r["stay"]: r for r in csv.DictReader(f)}
    with open(folder / LISTFILE, newline="") as f:
        rows = list(csv.DictReader(f))
    for n in index_range(len(rows), shard):
        row = rows[n]
        stay, d, where = row["stay"], demo.get(row["stay"], {}), f"row-{n + 1}"
        try:
            yield stay, benchmark_payload(
                folder / stay, end_hours=_optional_float(row.get("period_length")),
                age=_optional_float(d.get("age")), sex_male=_optional_float(d.get("sex_male"))
            ), where
        except (OSError, ValueError, KeyError) as e:
            yield stay, [Problem(loc=["file", stay], rule="unreadable_timeseries",
                                 message=f"{type(e).__name__}: {e}")], where


def _clean_id(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable():
        return value
    return None


def read_jsonl(path: Path, shard: tuple[int, int] = (0, 1)) -> Iterator[Stay]:
    """(id, payload, line-N) per line of the shard's byte range; the key is the payload's `id`,
    else `line-N` (1-based). A line that is not UTF-8 or not JSON is that line's error."""
    for n, data in lines_in(path, shard):
        where = f"line-{n}"
        try:
            line = data.decode()
        except UnicodeDecodeError as e:
            yield where, [Problem(loc=["line", n], rule="invalid_utf8",
                                  message=f"the line is not UTF-8 (byte {e.start})")], where
            continue
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            yield where, [Problem(loc=["line", n], rule="invalid_json", message=str(e))], where
            continue
        if not isinstance(raw, dict):
            yield where, [Problem(loc=["line", n], rule="not_an_object",
                                  message="each line must be one JSON object")], where
            continue
        yield _clean_id(raw.get("id")) or where, raw, where


def count_jsonl(path: Path, shard: tuple[int, int] = (0, 1)) -> int:
    """The stays `read_jsonl` yields for the shard (its lines that are not blank), counted
    without parsing: the progress bar's total, so it shows an ETA."""
    return sum(1 for _, data in lines_in(path, shard) if data.strip())


def _csv_row(header: list[str], line: bytes) -> dict[str, Any]:
    cells = next(csv.reader([line.decode()]), [])
    return dict(zip(header, cells, strict=False))


def _long_rows_csv(path: Path, shard: tuple[int, int]
                   ) -> tuple[Iterator[tuple[dict[str, Any], bool]], dict[str, Any] | None]:
    """(row, inside the shard's byte range) from the range on, and the row just before it."""
    with open(path, "rb") as f:
        header = next(csv.reader([f.readline().decode()]), [])
        floor = f.tell()
        size = f.seek(0, 2)
        start, end = byte_range(f, size, shard, floor)
    before = _csv_row(header, line_before(path, start)) if start > floor else None

    def rows() -> Iterator[tuple[dict[str, Any], bool]]:
        with open(path, "rb") as f:
            f.seek(start)
            pos = start
            for line in f:
                pos_was, pos = pos, pos + len(line)
                if line.strip():
                    yield _csv_row(header, line), pos_was < end
    return rows(), before


def _long_rows_parquet(path: Path, shard: tuple[int, int]
                       ) -> tuple[Iterator[tuple[dict[str, Any], bool]], dict[str, Any] | None]:
    """(row, inside the shard's row groups) from its first group on, and the row before it."""
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ValueError("reading Parquet needs pyarrow: pip install 'scehr[parquet]'") from None
    pf = pq.ParquetFile(path)
    groups = index_range(pf.num_row_groups, shard)
    before = None
    if groups.start > 0:
        prev = pf.read_row_group(groups.start - 1)
        before = prev.slice(prev.num_rows - 1).to_pylist()[0] if prev.num_rows else None

    def rows() -> Iterator[tuple[dict[str, Any], bool]]:
        for g in range(groups.start, pf.num_row_groups):
            for row in pf.read_row_group(g).to_pylist():
                yield row, g < groups.stop
    return rows(), before


def _cell(v: Any) -> Any:
    return _number(v) if isinstance(v, str) else v


def _stay_id(path: Path, row: dict[str, Any]) -> str:
    id_col = next((c for c in ID_COLUMNS if c in row), None)
    if id_col is None:
        raise ValueError(f"{path}: no stay id column (one of {', '.join(ID_COLUMNS)})")
    return str(row[id_col])


def read_long(path: Path, shard: tuple[int, int] = (0, 1)) -> Iterator[Stay]:
    """Long-form observations grouped by stay id (contiguous rows) into payloads. A shard
    scores the stays whose first row is in its part: it skips a stay that began before its
    part and finishes the one its part ends in."""
    rows, before = (_long_rows_parquet if path.suffix == ".parquet" else _long_rows_csv)(
        path, shard)
    skip = _stay_id(path, before) if before is not None else None
    key: str | None = None
    current: dict[str, Any] = {}
    finished: set[str] = set()
    for row, inside in rows:
        sid = _stay_id(path, row)
        if skip is not None:
            if sid == skip:
                continue
            skip = None
        if sid != key:
            if not inside:
                break
            if key is not None:
                yield key, current, f"stay-{key}"
                finished.add(key)
            if sid in finished:
                raise ValueError(f"{path}: the rows of stay {sid!r} are not contiguous; sort "
                                 "the file by stay id")
            key = sid
            current = {"id": sid if _clean_id(sid) else None, "observations": []}
            for c in STAY_COLUMNS:
                if row.get(c) not in (None, ""):
                    v = _cell(row[c])
                    if c in ("age", "sex"):
                        current.setdefault("demographics", {})[c] = v
                    else:
                        current[c] = v
        obs = {"variable": row.get("variable"), "time": _cell(row.get("time")),
               "value": _cell(row.get("value"))}
        if row.get("unit") not in (None, ""):
            obs["unit"] = row["unit"]
        current["observations"].append(obs)
    if key is not None:
        yield key, current, f"stay-{key}"


def open_input(path: Path, shard: tuple[int, int] = (0, 1)
               ) -> tuple[Iterator[Stay], int | None]:
    """The stays of the shard's part of INPUT and, when cheap to know, how many there are."""
    if path.is_dir():
        if not (path / LISTFILE).is_file():
            found = sorted(str(p.parent) for p in path.glob(f"*/*/{LISTFILE}"))
            hint = f"; folders with one: {', '.join(found[:6])}" if found else ""
            raise ValueError(f"{path} has no {LISTFILE} (a benchmark split folder, e.g. "
                             f"in-hospital-mortality/test){hint}")
        return read_benchmark(path, shard), len(index_range(count_benchmark(path), shard))
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if path.suffix == ".jsonl":
        return read_jsonl(path, shard), count_jsonl(path, shard)
    if path.suffix in (".csv", ".parquet"):
        return read_long(path, shard), None
    raise ValueError(f"{path}: expected a benchmark folder, .jsonl, .csv or .parquet")


# ---------------------------------------------------------------- chunks


def chunks(items: Iterable[Stay], size: int) -> Iterator[list[Stay]]:
    buf: list[Stay] = []
    for item in items:
        buf.append(item)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


# ---------------------------------------------------------------- outputs


def prediction_row(pred: Prediction) -> dict[str, Any]:
    """A scored stay, or one below the model's data minimum (no results, the reasons)."""
    short = pred.status == "insufficient_data"
    reasons = pred.sufficiency.reasons if short and pred.sufficiency is not None else []
    return {"status": "insufficient_data" if short else "ok", "model": pred.model.name,
            "model_version": pred.model.version,
            "results": {c.label: {k: f(c) for k, f in CLASS_FIELDS.items()}
                        for c in pred.results},
            "warnings": sorted({n.code for n in pred.warnings}),
            "errors": [{"rule": "insufficient_data", "message": w} for w in reasons]}


def trajectory_row(t: TrajectoryPrediction) -> dict[str, Any]:
    """A stay's risk at every hour (`--every 1h`): one entry per hour, then the policy's
    alert events; `status` is its last hour's, as the API's."""
    hours = [{"hour": h.hour, "status": h.status, "risk": h.risk,
              "risk_low": None if h.interval is None else h.interval.low,
              "risk_high": None if h.interval is None else h.interval.high,
              "alert": h.alert, "reasons": [r.code for r in h.reasons]} for h in t.hours]
    short = t.status == "insufficient_data"
    return {"status": "insufficient_data" if short else "ok", "model": t.model.name,
            "model_version": t.model.version, "label": t.label, "hours": hours,
            "alerts": [a.model_dump() for a in t.alerts],
            "warnings": sorted({n.code for n in t.warnings}),
            "errors": [{"rule": r.code, "message": r.message} for r in t.hours[-1].reasons]}


def error_row(problems: list[Problem], name: str, version: str) -> dict[str, Any]:
    return {"status": "error", "model": name, "model_version": version, "results": {},
            "warnings": [], "errors": [p.model_dump(exclude_none=True) for p in problems]}


OUTPUT_SUFFIXES = (".jsonl", ".csv")


def check_output(path: Path) -> None:
    """A clear one-line error for an output the run could not write, before any work: the
    file is opened for appending (created empty if new) as the run will."""
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"--out {path}: unknown output format {path.suffix or '(no suffix)'!r}; "
                         f"use {' or '.join(OUTPUT_SUFFIXES)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        open(path, "a").close()
    except FileExistsError as e:  # a file where a folder of the path should be
        raise ValueError(f"--out {path}: cannot write it ({e.filename} is a file, not a "
                         "folder)") from None
    except OSError as e:
        raise ValueError(f"--out {path}: cannot write it ({e.strerror or e})") from None


class Output:
    """Append-only rows keyed by id, recoverable after a crash (JSONL or CSV by suffix)."""

    def __init__(self, path: Path, labels: list[str], model: tuple[str, str] = ("", "")) -> None:
        check_output(path)
        self.path = path
        self.model = model  # (name, version) every row must carry: never mix two models
        self.csv = path.suffix == ".csv"
        self.columns = ["id", "status", "model", "model_version",
                        *[f"{lab}.{k}" for lab in labels for k in CLASS_FIELDS],
                        "warnings", "errors"]
        self.done = self._recover()
        self.file: TextIO = open(path, "a", newline="")  # noqa: SIM115 - closed by close()
        if self.csv and path.stat().st_size == 0:
            self.file.write(",".join(self.columns) + "\r\n")

    def _recover(self) -> set[str]:
        """Ids already written; a torn last line (killed mid-write) is cut off."""
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return set()
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(end)
        text = data[:end].decode()
        if self.csv:
            reader = csv.reader(text.splitlines())
            header = next(reader, None)
            if header is not None and header != self.columns:
                raise ValueError(f"{self.path} has other columns than this model's output: "
                                 "write to a new file")
            rows = [{"id": r[0], "model": r[2], "model_version": r[3]} for r in reader if r]
        else:
            rows = [json.loads(line) for line in text.splitlines() if line]
        for r in rows:
            if (r["model"], r["model_version"]) != self.model:
                raise ValueError(
                    f"{self.path} holds rows of {r['model']} {r['model_version']}, this run "
                    f"uses {self.model[0]} {self.model[1]}: write to a new file, or pin the "
                    "version it was started with (--version)")
        return {r["id"] for r in rows}

    def _line(self, stay_id: str, row: dict[str, Any]) -> str:
        if not self.csv:
            return json.dumps({"id": stay_id, **row}, separators=(",", ":")) + "\n"
        flat = {"id": stay_id, **{k: row[k] for k in ("status", "model", "model_version")},
                "warnings": ";".join(row["warnings"]),
                "errors": json.dumps(row["errors"]) if row["errors"] else ""}
        for lab, vals in row["results"].items():
            for k, v in vals.items():
                flat[f"{lab}.{k}"] = v
        buf = io.StringIO()
        csv.writer(buf).writerow([flat.get(c, "") for c in self.columns])
        return buf.getvalue()

    def write(self, rows: list[tuple[str, dict[str, Any]]]) -> None:
        """All rows of a chunk in one write, then fsync: a kill loses at most this chunk."""
        if not rows:
            return
        self.file.write("".join(self._line(i, r) for i, r in rows))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.done.update(i for i, _ in rows)

    def close(self) -> None:
        self.file.close()


# ---------------------------------------------------------------- scoring


@dataclass
class Summary:
    """What a run wrote: a stay is scored (a risk), abstained (below the model's data minimum:
    `insufficient_data`, no risk) or an error row; `below_minimum` counts the scored stays
    that were below the minimum, scored on request (`--allow-insufficient`)."""

    read: int = 0
    already_done: int = 0
    duplicates: int = 0
    scored: int = 0
    abstained: int = 0
    errors: int = 0
    below_minimum: int = 0
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def written(self) -> int:
        return self.scored + self.abstained + self.errors

    def count(self, row: dict[str, Any]) -> None:
        """Count one written row by its status."""
        if row["status"] == "insufficient_data":
            self.abstained += 1
        elif row["status"] == "error":
            self.errors += 1
        else:
            self.scored += 1
            self.below_minimum += BELOW_MINIMUM in row["warnings"]

    def line(self) -> str:
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        on_request = (f" ({self.below_minimum} of them below the data minimum, scored on "
                      "request)" if self.below_minimum else "")
        return (f"{self.read} stays read: {self.scored} scored{on_request}, {self.abstained} "
                f"abstained (below the model's data minimum: insufficient_data, no risk), "
                f"{self.errors} with errors, {self.already_done} already in the output, "
                f"{self.duplicates} repeated ids (error rows); {self.seconds:.1f} s, "
                f"{rate:.0f} stays/s")


def score_chunk(model: Any, raws: list[Raw], max_batch_size: int, max_observations: int,
                strict: bool = False, allow_insufficient: bool = False,
                trajectory: bool = False
                ) -> list[Prediction | TrajectoryPrediction | list[Problem]]:
    """The batch route's path for a list of raw payloads: one result per input, in order
    (`trajectory`: the trajectory route's)."""
    parsed: list[StayPayload | list[Problem]] = []
    for raw in raws:
        if isinstance(raw, list):
            parsed.append(raw)
            continue
        try:
            parsed.append(StayPayload.model_validate(raw))
        except ValidationError as e:
            parsed.append(pydantic_problems(e))
    valid = [k for k, p in enumerate(parsed) if isinstance(p, StayPayload)]
    scored = score_offline(model, [parsed[k] for k in valid],  # type: ignore[misc]
                           strict=strict, max_observations=max_observations,
                           max_rows=max_batch_size, allow_insufficient=allow_insufficient,
                           trajectory=trajectory)
    results: list[Prediction | TrajectoryPrediction | list[Problem]] = list(
        parsed)  # type: ignore[arg-type]
    for k, res in zip(valid, scored, strict=True):
        results[k] = res.prediction or res.trajectory or res.problems
    return results


def resolve_model(model_or_task: str, model_dir: Path, version: str | None,
                  every: str | None = None) -> tuple[Path, str]:
    """A task name (its default, or --version, in the model dir) or a model folder; with
    `every`, a task's landmark task (`mortality` -> `mortality-landmark`) and a landmark
    model only."""
    from scehr.service.registry import read_index, resolve

    if every is not None:
        if model_or_task in TASK_NAMES:
            task = landmark_task(model_or_task)
            if task is None:
                raise ValueError(f"--every {every}: no landmark task gives the {model_or_task} "
                                 "risk at every hour")
            model_or_task = task
        else:
            folder, task = resolve_model(model_or_task, model_dir, version, every)
            if not task_spec(task).landmarks:
                raise ValueError(f"--every {every}: {model_or_task} is a {task} model, which "
                                 "gives no risk per hour (a landmark model does)")
            return folder, task
    if model_or_task in TASK_NAMES:
        index = read_index(model_dir)
        return resolve(model_dir, index, model_or_task, version=version), model_or_task
    folder = Path(model_or_task)
    if not (folder / "manifest.json").is_file():
        raise ValueError(f"{model_or_task!r} is neither a task ({', '.join(TASK_NAMES)}) nor a "
                         "folder with manifest.json")
    task = json.loads((folder / "manifest.json").read_text())["task"]
    return folder, task


def score(model_or_task: str, input_path: Path, out_path: Path, *, model_dir: Path,
          version: str | None = None, shard: tuple[int, int] = (0, 1), chunk_size: int = 256,
          device: str = "auto", threads: int | None = None, strict: bool = False,
          allow_insufficient: bool = False, progress: bool = True, log: TextIO = sys.stderr,
          every: str | None = None) -> Summary:
    """Score every stay of `input_path` into `out_path`; resumes what is already there.
    `allow_insufficient`: a stay below the model's data minimum gets a risk anyway (its row
    warns `below_data_minimum`), as the API's `allow_insufficient=true`. `every` ("1h"): each
    stay's risk at every hour from a landmark model (`trajectory_row`, JSON Lines only), as
    `POST /predict/{task}/trajectory`."""
    if every is not None and every not in EVERY:
        raise ValueError(f"--every {every}: the risk is served every {' or '.join(EVERY)} "
                         "(a landmark model's step)")
    if every is not None and out_path.suffix != ".jsonl":
        raise ValueError(f"--every {every} writes JSON Lines (a row per stay with its hours): "
                         f"give --out a .jsonl file, not {out_path.suffix or 'no suffix'!r}")
    from tqdm import tqdm

    from scehr.service.registry import load_model
    from scehr.service.settings import Settings

    stays, total = open_input(input_path, shard)  # lazy: a missing input fails here
    check_output(out_path)  # a wrong or unwritable path fails now, not after the model loads
    folder, task = resolve_model(model_or_task, model_dir, version, every)
    settings = Settings(model_dir=model_dir, device=device, workers=1,
                        intra_op_threads=threads)
    model = load_model(folder, task, settings)
    m = model.spec.manifest
    print(f"scehr score: {m.name} {m.version} ({model.provider}) on {input_path}"
          f"{f', shard {shard[0]}/{shard[1]}' if shard[1] > 1 else ''}", file=log)
    output = Output(out_path, list(model.spec.assets.labels), (m.name, m.version))
    summary = Summary()
    seen: set[str] = set()
    t0 = time.perf_counter()

    def keyed() -> Iterator[tuple[str, Raw]]:
        """A repeated id: its own error row, keyed by where the stay is."""
        for sid, raw, where in stays:
            summary.read += 1
            if sid in seen:
                summary.duplicates += 1
                yield where, [Problem(loc=["id"], rule="duplicate_id", message=(
                    f"another stay of this input ({sid!r}) already has this id: this one is "
                    f"not scored; give each stay its own id"))]
                continue
            seen.add(sid)
            yield sid, raw

    bar = tqdm(total=total, unit="stay", disable=not progress, file=log,
               mininterval=1.0 if log.isatty() else 30.0)
    try:
        for chunk in chunks(keyed(), chunk_size):
            todo = [sid not in output.done for sid, _ in chunk]
            summary.already_done += len(chunk) - sum(todo)
            if any(todo):
                results = score_chunk(model, [r for _, r in chunk], model.max_batch_size,
                                      settings.max_observations, strict, allow_insufficient,
                                      trajectory=every is not None)
                rows = []
                for (sid, _), res, new in zip(chunk, results, todo, strict=True):
                    if not new:
                        continue
                    row = (prediction_row(res) if isinstance(res, Prediction)
                           else trajectory_row(res) if isinstance(res, TrajectoryPrediction)
                           else error_row(res, m.name, m.version))
                    rows.append((sid, row))
                    summary.count(row)
                output.write(rows)
            bar.update(summary.read - bar.n)
    finally:
        bar.close()
        output.close()
        summary.seconds = time.perf_counter() - t0
    print(f"scehr score: {summary.line()} -> {out_path}", file=log)
    return summary
