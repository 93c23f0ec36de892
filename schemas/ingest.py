"""Payloads -> long-form observations, with every rule checked and every problem named.

Errors (unknown variable or category, missing or unconvertible unit, time outside the window,
empty payload, too many observations) name the field path and the rule. Values that cannot be
physiological (the catalog's plausibility rule) become missing, known scalings (pH x 100) are
undone; then values outside the benchmark's outlier bounds are dropped and values between an
outlier and a valid bound are clipped; each is a warning, or an error with `strict=True`.

One path reads every payload. A reader lays a stay's rows out as `ObservationColumns`
(variable, time, value, unit, field path, in payload order): the long form's observations, the
wide form's non-null cells column by column, the values a FHIR Bundle's reader took
(`ColumnStay`, read by `ingest_columns`). The rules then run once over the whole columns:
each distinct (variable, unit) pair and category value is resolved by the rule functions and
memoized, so a row costs C-level dict look-ups (a wide column, one look-up for all its cells);
times, values and unit conversions are numpy arrays. Rows are visited one by one only where a
rule refused them (`_add_rows`), to name each one's first problem in payload order with the
same rule functions (`check_row` is a row's checks in order). Each rule is written once: a
name resolves to a channel with `variables.find`, a unit with `unit_converter`, a time with
`_hours_of`, a value with `canonical_number`. Field paths (`loc`) are built on demand, for the
few rows a notice or problem names. `tests/schemas/test_ingest_equivalence.py` holds the path
to the frozen per-row reference in `tests/oracles/ingest_reference.py`.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache, partial
from itertools import accumulate, repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from scehr.schemas.featureset import STATIC_FIELDS, FeatureSet
from scehr.schemas.payloads import Demographics, Notice, Problem, StayPayload, WideTable
from scehr.schemas.tensorize import Observations, apply_rules
from scehr.schemas.variables import (
    CategoryError,
    UnitError,
    Variable,
    did_you_mean,
    find,
    identity,
    in_catalog,
    name_index,
)

DEFAULT_MAX_OBSERVATIONS = 20_000
#: Memo entries per feature set and kind (bounded: the keys come from requests).
_MEMO_LIMIT = 4096

Loc = list[str | int]


def _long_loc(row: int) -> Loc:
    return ["observations", row]


def _empty(dtype: type) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass(frozen=True, eq=False)
class ObservationColumns:
    """A stay's observations as columns: what every payload reader hands to ingest's rules.

    One row per observation, in payload order (the order problems are named in): `time` is
    hours since ICU admission as a float64 array, or per row a number or a `datetime` (placed
    against `admission` by the time rule); `value` a number or a category's text; `locate(row)`
    the row's field path in the payload (default `["observations", row]`). `variable` and `unit`
    are the names as sent, once per run of rows that share them: run k covers the next
    `runs[k]` rows (a wide table's column, looked up once); `runs=None` means one row per run.
    `problems` are the reader's own, each with the number of rows before it (a wide column of
    the wrong length). A reader only lays rows out: every rule runs in ingest.
    """

    variable: Sequence[str]
    unit: Sequence[str | None]
    time: np.ndarray | Sequence[float | datetime]
    value: list[float | str]
    locate: Callable[[int], Loc] = _long_loc
    runs: Sequence[int] | None = None
    admission: datetime | None = None
    problems: Sequence[tuple[int, Problem]] = ()


@dataclass(eq=False)
class ColumnStay:
    """A stay whose reader laid its observations out as columns itself (the FHIR and CDS Hooks
    readers): what ingest reads of a `StayPayload`, without building one. Its rows (one per
    run, at `["observations", row]`) are the observations given: the limit and the
    empty-payload rules count them, at `["observations"]`. `end_hours` and `demographics` are
    the payload's fields."""

    columns: ObservationColumns
    id: str | None = None
    end_hours: float | None = None
    demographics: Demographics | None = None


#: A stay as ingest reads it: a JSON payload, or a reader's columns.
Stay = StayPayload | ColumnStay


@dataclass(eq=False)
class StayIngest:
    """One stay's observations in canonical form, or the problems that stopped it.

    `channel` (int64), `time` and `value` (float64) hold one entry per accepted observation;
    `source` is each one's row number in the payload's reading order and `locate` turns a row
    number into its field path (see `loc`).
    """

    channel: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    time: np.ndarray = field(default_factory=lambda: _empty(np.float64))
    value: np.ndarray = field(default_factory=lambda: _empty(np.float64))
    source: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    static: list[float] = field(default_factory=lambda: [np.nan] * len(STATIC_FIELDS))
    problems: list[Problem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    end_hours: float = 0.0
    locate: Callable[[int], Loc] = field(default=_long_loc, repr=False, compare=False)

    @property
    def loc(self) -> list[Loc]:
        """Field path of each observation, e.g. `["observations", 12]` (built on demand)."""
        return [self.locate(r) for r in self.source.tolist()]


@dataclass
class IngestResult:
    """Observations of the stays that passed (stay index = position in `ok`)."""

    stays: list[StayIngest]
    ok: list[int]
    observations: Observations
    static_raw: np.ndarray  # [len(ok), len(STATIC_FIELDS)], NaN where missing
    end_hours: np.ndarray  # [len(ok)]


# ---------------------------------------------------------------- the rules, written once


class RowError(ValueError):
    """A row breaks a rule: which field, which rule, and what is allowed."""

    def __init__(self, field: str, rule: str, message: str, allowed: str | None = None) -> None:
        super().__init__(message)
        self.field, self.rule, self.message, self.allowed = field, rule, message, allowed


Converter = Callable[[float], float]


def unit_converter(var: Variable, unit: str | None) -> Converter | None:
    """The unit rule: the converter to the canonical unit (None: the value is canonical).

    Categorical variables take no unit; a continuous one needs a unit where the catalog says
    so, and only a spelling the catalog lists (`Variable.unit_for`). Raises `RowError`.
    """
    if var.is_categorical:
        if unit not in (None, ""):
            raise RowError("unit", "unit_not_accepted",
                           f"{var.id} is categorical and takes no unit")
        return None
    try:
        u = var.unit_for(unit)
    except UnitError as e:
        rule = "unit_required" if unit in (None, "") else "unit_not_accepted"
        raise RowError("unit", rule, str(e), ", ".join(var.unit_names())) from None
    return None if u is None or u.is_identity else u.to_canonical


def canonical_number(var: Variable, value: float | str, convert: Converter | None) -> float:
    """The value rule: a category's index, or a JSON number in the canonical unit."""
    if var.is_categorical:
        try:
            return float(var.category_index(value))
        except CategoryError:
            raise RowError("value", "unknown_category", f"not a category of {var.id}",
                           ", ".join(var.categories) + " (aliases: "
                           + ", ".join(sorted(var.category_aliases)) + ")") from None
    if isinstance(value, str):
        raise RowError("value", "number_required", f"{var.id} takes a JSON number")
    number = float(value)
    return number if convert is None else convert(number)


def check_row(var: Variable, value: float | str, unit: str | None) -> float:
    """A row's canonical number, the checks in the order the problems are reported: for a
    continuous variable a string value before the unit, for a categorical one the unit first."""
    if not var.is_categorical and isinstance(value, str):
        raise RowError("value", "number_required", f"{var.id} takes a JSON number")
    return canonical_number(var, value, unit_converter(var, unit))



def _hours_of(t: float | datetime, admission: datetime | None) -> float:
    """The time rule: hours since ICU admission, not negative; a timestamp needs the stay's
    `admission_time`, both with or both without a timezone. Raises `RowError`."""
    if isinstance(t, datetime):
        if admission is None:
            raise RowError("time", "admission_time_required",
                           "an ISO timestamp needs `admission_time` on the stay")
        if (t.tzinfo is None) != (admission.tzinfo is None):
            raise RowError("time", "timezone_mismatch",
                           "timestamp and admission_time must both have or both lack a timezone")
        hours = (t - admission).total_seconds() / 3600.0
    else:
        hours = float(t)
    if hours < 0:
        raise RowError("time", "time_negative", "time must be >= 0 hours since ICU admission",
                       ">= 0")
    return hours


# ---------------------------------------------------------------- look-up tables


@dataclass(eq=False)
class _Tables:
    """A feature set's look-ups, built once, and memos of what requests spelled.

    `pairs[variable][unit]` (both exactly as sent) is a pair id whose channel and converter
    sit in preallocated arrays (id 0: a pair the rules refuse), so that two C-level dict
    look-ups per run of rows do the variable and unit checks. The memos are bounded: once
    full, new spellings are judged row by row.
    """

    fs: FeatureSet
    index: dict[str, int]  # id, benchmark name, lower-case benchmark name -> channel
    categorical: np.ndarray  # bool [C]
    pairs: dict[str, dict[str | None, int]] = field(default_factory=dict)
    n_pairs: int = 0
    pair_channel: np.ndarray = field(default_factory=lambda: _pair_slots())
    pair_converter: np.ndarray = field(default_factory=lambda: _pair_slots())
    n_accepted: int = 0
    converters: list[Callable[[float], float]] = field(default_factory=lambda: [identity])
    categories: list[dict[str | float, float]] = field(default_factory=list)  # per channel
    n_categories: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_NO_PAIRS: dict[str | None, int] = {}


def _pair_slots() -> np.ndarray:
    return np.zeros(_MEMO_LIMIT + 1, dtype=np.int64)


@lru_cache(maxsize=32)
def _tables(fs: FeatureSet) -> _Tables:
    """One per feature set (equal feature sets share theirs): the memos fill up across calls."""
    return _Tables(fs, name_index(fs.variables),
                   np.array([v.is_categorical for v in fs.variables], dtype=bool),
                   categories=[{} for _ in fs.variables])


def _resolve(t: _Tables, variable: str, unit: str | None
             ) -> tuple[int, Callable[[float], float] | None] | None:
    """Channel and converter (None: as is) of a row by the rules; None: a problem."""
    ch = find(t.index, variable)
    if ch is None:
        return None
    try:
        return ch, unit_converter(t.fs.variables[ch], unit)
    except RowError:
        return None


def _pair_id(t: _Tables, variable: str, unit: str | None) -> int:
    """A (variable, unit) pair's id (0: refused, or no room left to remember it), resolved by
    the rules the first time it is seen."""
    pid = t.pairs.get(variable, _NO_PAIRS).get(unit)
    if pid is not None:
        return pid
    resolved = _resolve(t, variable, unit)
    with t.lock:
        known = t.pairs.get(variable, {})
        if unit in known:
            return known[unit]
        if t.n_pairs >= _MEMO_LIMIT:
            return 0
        pid = 0
        if resolved is not None:
            ch, f = resolved
            if f is not None and f not in t.converters:
                t.converters.append(f)
            t.n_accepted += 1
            pid = t.n_accepted
            t.pair_channel[pid] = ch
            t.pair_converter[pid] = 0 if f is None else t.converters.index(f)
        # Only after the arrays are written: readers never see a half-made pair.
        t.pairs.setdefault(variable, {})[unit] = pid
        t.n_pairs += 1
        return pid


def _categories(t: _Tables, chans: list[int], values: list[str | float]
                ) -> list[float | None]:
    """`category_index` of each (channel, value), memoized; None where the value rule refuses
    it, or for a type other than text and float (a bool would pass for 0.0 or 1.0)."""
    numbers = list(map(dict.get, map(t.categories.__getitem__, chans), values))
    if None in numbers or not set(map(type, values)) <= {str, float}:
        numbers = [None if type(v) not in (str, float) else _category(t, c, v) if x is None
                   else x for x, c, v in zip(numbers, chans, values, strict=True)]
    return numbers


def _category(t: _Tables, channel: int, value: str | float) -> float | None:
    try:
        number = canonical_number(t.fs.variables[channel], value, None)
    except Exception:  # the row is judged on its own: its problem is named, or raised again
        return None
    with t.lock:
        if t.n_categories < _MEMO_LIMIT and value not in t.categories[channel]:
            t.categories[channel][value] = number
            t.n_categories += 1
    return number


# ---------------------------------------------------------------- payloads as columns


class _Column:
    """One field of every long-form observation, read from the models' field dicts (in C:
    faster than attribute access) afresh on each pass: no list is built for it."""

    def __init__(self, fields: list[dict[str, Any]], name: str) -> None:
        self.fields, self.name, self.get = fields, name, itemgetter(name)

    def __iter__(self) -> Iterator[Any]:
        return map(self.get, self.fields)

    def __getitem__(self, row: int) -> Any:
        return self.fields[row][self.name]


_DICT, _VALUE = attrgetter("__dict__"), itemgetter("value")


def _payload_columns(stay: StayPayload) -> ObservationColumns:
    """A JSON payload's rows: the long form's observations, or the wide form's cells."""
    if stay.wide is not None and stay.observations is None:
        return _wide_columns(stay.wide)
    fields = list(map(_DICT, stay.observations or []))
    return ObservationColumns(_Column(fields, "variable"), _Column(fields, "unit"),
                              _Column(fields, "time"), list(map(_VALUE, fields)), _long_loc,
                              admission=stay.admission_time)


def _wide_columns(w: WideTable) -> ObservationColumns:
    """A wide table's non-null cells column by column, one run per column (its name and unit
    as sent), hours read once and gathered by row; a column of the wrong length is a problem."""
    n = len(w.hours)
    names: list[str] = []
    runs: list[int] = []
    rows: list[int] = []
    values: list[float | str] = []
    problems: list[tuple[int, Problem]] = []
    for name, col in w.columns.items():
        if len(col) != n:
            problems.append((len(rows), Problem(
                loc=["wide", "columns", name], rule="length_mismatch",
                message=f"{len(col)} values for {n} rows in `hours`")))
            continue
        if None in col:
            idx: Sequence[int] = [r for r, v in enumerate(col) if v is not None]
            values += map(col.__getitem__, idx)  # list.__iadd__ of a map: filled in C
        else:
            idx = range(n)
            values += col
        if idx:
            names.append(name)
            runs.append(len(idx))
            rows += idx
    hours = np.fromiter(w.hours, np.float64, n)[np.array(rows, dtype=np.intp)]
    starts = list(accumulate(runs[:-1], initial=0))

    def locate(i: int) -> Loc:
        return ["wide", "columns", names[bisect_right(starts, i) - 1], rows[i]]

    return ObservationColumns(names, list(map(w.units.get, names)), hours, values, locate,
                              runs=runs, problems=problems)


# ---------------------------------------------------------------- the rules over columns


def _read(cols: ObservationColumns, fs: FeatureSet) -> StayIngest:
    """Every rule over whole columns; the rows a rule refused are then judged one by one."""
    t = _tables(fs)
    pid = _pair_ids(cols, t)
    hours = _hours(cols.time, len(cols.value), cols.admission)
    bad = (pid == 0) | ~(hours >= 0)  # NaN: a timestamp the time rule refuses
    ch = t.pair_channel[pid]
    value = _values(cols.value, ch, t.pair_converter[pid], t, bad)
    out = StayIngest(channel=ch, time=hours, value=value, source=np.arange(len(ch)),
                     locate=cols.locate)
    if cols.problems or bad.any():
        _add_rows(out, cols, fs, bad)
    return out


def read_columns(cols: ObservationColumns, fs: FeatureSet) -> StayIngest:
    """The row rules only (variable, unit, time, value), each refused row named in
    `problems` and left out: for a batch converter (MEDS) that keeps a stay whose rows a rule
    refused, counts them, and leaves cleaning to the reader of what it writes."""
    return _read(cols, fs)


def _pair_ids(cols: ObservationColumns, t: _Tables) -> np.ndarray:
    """Each row's pair id, looked up once per run: a wide column's cells share one."""
    n = len(cols.value) if cols.runs is None else len(cols.runs)
    try:  # map(dict.get, units_by_variable, units): both look-ups in C, no key tuples
        pid = np.fromiter(map(dict.get, map(t.pairs.get, cols.variable), cols.unit), np.intp, n)
    except TypeError:  # a variable or a unit not in the memo yet (None)
        pid = np.fromiter(map(partial(_pair_id, t), cols.variable, cols.unit), np.intp, n)
    return pid if cols.runs is None else pid.repeat(cols.runs)


def _hours(times: Iterable[float | datetime], n: int,
           admission: datetime | None) -> np.ndarray:
    """Hours since admission; NaN where the time rule refuses a timestamp."""
    if isinstance(times, np.ndarray):
        return np.asarray(times, np.float64)
    try:
        return np.fromiter(times, np.float64, n)
    except TypeError:  # ISO timestamps among the times
        return np.fromiter(map(_placed, times, repeat(admission)), np.float64, n)


def _placed(t: float | datetime, admission: datetime | None) -> float:
    try:
        return _hours_of(t, admission)
    except RowError:
        return math.nan


def _values(values: list[Any], ch: np.ndarray, conv: np.ndarray, t: _Tables,
            bad: np.ndarray) -> np.ndarray:
    """Canonical numbers: category indices, converted units. A row whose value the memo
    cannot accept (text for a number, an unknown category, a bool) is marked in `bad`."""
    cat_rows = (t.categorical[ch] & ~bad).nonzero()[0].tolist()  # .nonzero(): 4x flatnonzero
    if cat_rows:
        values = values.copy()
        numbers = _categories(t, ch[cat_rows].tolist(), [values[i] for i in cat_rows])
        for i, number in zip(cat_rows, numbers, strict=True):
            values[i] = number  # None: refused, marked below
    # numpy infers float64 only when every value is a number: a string left here is a string
    # for a continuous variable (`float()` would parse "80"; the value rule refuses it).
    out = np.array(values)
    if out.dtype != np.float64 or out.ndim != 1:
        refused = [v is None or isinstance(v, str) for v in values]
        bad |= refused
        out = np.array([math.nan if r else v for v, r in zip(values, refused, strict=True)],
                       dtype=np.float64)
    at = conv.nonzero()[0]
    if len(at):
        # Value by value, with the very function `Variable.convert` calls: exact for any one.
        f = t.converters
        out[at] = [f[k](v) for k, v in zip(conv[at].tolist(), out[at].tolist(), strict=True)]
    return out


# ---------------------------------------------------------------- rows a rule refused


def _add_rows(out: StayIngest, cols: ObservationColumns, fs: FeatureSet,
              bad: np.ndarray) -> None:
    """The rows a rule refused over the columns, one by one: each is accepted after all (a
    pair the memo had no room for) or its first problem named, in payload order with the
    reader's own problems; then `out` keeps the accepted rows."""
    tables = _tables(fs)
    runs = np.arange(len(cols.value)) if cols.runs is None else np.arange(
        len(cols.runs)).repeat(cols.runs)
    problems = list(cols.problems)
    for i in bad.nonzero()[0].tolist():
        k = int(runs[i])
        row = _add(fs, tables, cols.locate(i), cols.variable[k], cols.time[i], cols.value[i],
                   cols.unit[k], cols.admission)
        if isinstance(row, Problem):
            problems.append((i, row))
        else:  # its time passed the time rule: `hours` holds it already
            out.channel[i], out.value[i] = row
            bad[i] = False
    out.problems += [p for _, p in sorted(problems, key=itemgetter(0))]  # stable: reader's first
    keep = ~bad
    out.channel, out.time = out.channel[keep], out.time[keep]
    out.value, out.source = out.value[keep], out.source[keep]


def unknown_variable(variable: str, fs: FeatureSet, rows: int = 1) -> str:
    """The message of an `unknown_variable` problem, built here only: per row here, and once
    for the `rows` rows of a stay that name it where the service folds them into one problem
    (`scehr.service.unread_variables`); both keep the suggestion for a misspelt name."""
    times = f" ({rows} observations)" if rows > 1 else ""
    known = in_catalog(variable)  # a real variable another feature set reads: say so
    where = (f"; the catalog's {known.id} is not an input of this model (feature set "
             f"{fs.name}): score it with a model that reads it" if known
             else did_you_mean(variable, fs.variables))
    return f"unknown variable {variable!r}{times}{where}"


def _add(fs: FeatureSet, tables: _Tables, loc: Loc, variable: str, t: float | datetime,
         value: float | str, unit: str | None, admission: datetime | None
         ) -> Problem | tuple[int, float]:
    """One row by every rule in order: its (channel, number), or its first problem."""
    ch = find(tables.index, variable)
    if ch is None:
        return Problem(
            loc=[*loc, "variable"], rule="unknown_variable",
            message=unknown_variable(variable, fs),
            allowed=", ".join(v.id for v in fs.variables),
        )
    try:
        _hours_of(t, admission)  # the time rule comes before the unit and value rules
        return ch, check_row(fs.variables[ch], value, unit)
    except RowError as e:
        return Problem(loc=[*loc, e.field], rule=e.rule, message=e.message, allowed=e.allowed)


# ---------------------------------------------------------------- one stay, many stays


def _count(stay: StayPayload) -> int:
    if stay.observations is not None:
        return len(stay.observations)
    if stay.wide is not None:
        return sum(len(col) - col.count(None) for col in stay.wide.columns.values())
    return 0


def _cells(stay: StayPayload) -> int:
    """An upper bound of `_count` in one C-level pass over the columns (not their cells)."""
    if stay.observations is not None:
        return len(stay.observations)
    if stay.wide is not None:
        return sum(map(len, stay.wide.columns.values()))
    return 0


def ingest_stay(stay: Stay, fs: FeatureSet, *, strict: bool = False,
                max_observations: int = DEFAULT_MAX_OBSERVATIONS) -> StayIngest:
    """Check one stay and convert it to canonical units, category indices and hours."""
    if isinstance(stay, ColumnStay):
        return ingest_columns(stay.columns, fs, end_hours=stay.end_hours,
                              demographics=stay.demographics, strict=strict,
                              max_observations=max_observations)
    # Within the limit whatever is null (a wide table's cells bound its observations): then
    # the count is only needed for the empty-payload rule, and a stay read without problems
    # holds every observation given, so its rows are the count, with no pass over the cells.
    n_given = None if _cells(stay) <= max_observations else _count(stay)
    if n_given is not None and n_given > max_observations:
        return _too_many(n_given, max_observations,
                         ["observations"] if stay.observations is not None else
                         ["wide", "columns"])
    out = _read(_payload_columns(stay), fs)
    if n_given is None:
        n_given = _count(stay) if out.problems else len(out.channel)
    return _stay_rules(out, fs, n_given, "observations" if stay.wide is None else "wide",
                       stay.end_hours, stay.demographics, strict)


def ingest_columns(cols: ObservationColumns, fs: FeatureSet, *, end_hours: float | None = None,
                   demographics: Demographics | None = None, strict: bool = False,
                   max_observations: int = DEFAULT_MAX_OBSERVATIONS) -> StayIngest:
    """`ingest_stay` of a stay a reader laid out as columns (`ColumnStay`): the same rules,
    its rows counted as the observations given."""
    n_given = len(cols.value)
    if n_given > max_observations:
        return _too_many(n_given, max_observations, ["observations"])
    return _stay_rules(_read(cols, fs), fs, n_given, "observations", end_hours, demographics,
                       strict)


def _too_many(n_given: int, max_observations: int, loc: Loc) -> StayIngest:
    return StayIngest(problems=[Problem(
        loc=loc, rule="too_many_observations",
        message=f"{n_given} observations; the limit is {max_observations}",
        allowed=f"<= {max_observations}",
    )])


def _stay_rules(out: StayIngest, fs: FeatureSet, n_given: int, form: str,
                end_hours: float | None, demographics: Demographics | None,
                strict: bool) -> StayIngest:
    """The stay's own rules after its rows': not empty (`form`: where its observations are),
    the demographics read, then (without problems) cleaning and the window."""
    if n_given == 0:
        out.problems.append(Problem(loc=[form], rule="empty_payload",
                                    message="the stay has no observations"))
    if demographics is not None:
        d = demographics
        out.static = [
            np.nan if d.age is None else float(d.age),
            np.nan if d.sex is None else float(d.sex == "male"),
        ]
    if out.problems:
        return out
    _apply_cleaning(out, fs, strict)
    _window_notices(out, fs, end_hours)
    return out


def _apply_cleaning(out: StayIngest, fs: FeatureSet, strict: bool) -> None:
    """The plausibility rule, then the benchmark rule (`apply_rules`, as `clean` applies
    them), each change named."""
    rules = apply_rules(out.channel, out.value, fs)
    for r in rules.rescaled.nonzero()[0].tolist():
        _report_rescaled(out, fs, r)
    for r in rules.implausible.nonzero()[0].tolist():
        _report_implausible(out, fs, r, strict)
    dropped, clipped_rows = rules.drop.nonzero()[0], rules.clip.nonzero()[0]
    for rows, code, verb in ((dropped, "value_dropped", "dropped (outside outlier bounds)"),
                             (clipped_rows, "value_clipped", "clipped to the valid range")):
        for r in rows.tolist():
            _report_cleaning(out, fs, r, code, verb, strict)
    if strict and out.problems:
        return
    clipped = rules.value
    gone = rules.removed
    if gone.any():
        keep = ~gone
        out.channel, out.time, out.source = out.channel[keep], out.time[keep], out.source[keep]
        clipped = clipped[keep]
    out.value = clipped


def _report_implausible(out: StayIngest, fs: FeatureSet, row: int, strict: bool) -> None:
    var = fs.variables[out.channel[row]]
    rule = var.plausible.rule(var.id) if var.plausible else var.id
    loc = out.locate(int(out.source[row]))
    if strict:
        out.problems.append(Problem(loc=loc, rule="implausible_value",
                                    message=f"{var.id} value is not physiological",
                                    allowed=rule))
    else:
        out.notices.append(Notice(code="value_implausible", loc=loc, variable=var.id,
                                  message=f"{var.id} value treated as missing: not "
                                  f"physiological (rule: {rule})"))


def _report_rescaled(out: StayIngest, fs: FeatureSet, row: int) -> None:
    var = fs.variables[out.channel[row]]
    rule = var.plausible  # only a variable with a plausibility rule has rescaled rows
    assert rule is not None and rule.scaled_by is not None
    out.notices.append(Notice(code="value_rescaled", loc=out.locate(int(out.source[row])),
                              variable=var.id, message=f"{var.id} value divided by "
                              f"{rule.scaled_by:g}: a scaled value (rule: {rule.rule(var.id)})"))


def _report_cleaning(out: StayIngest, fs: FeatureSet, row: int, code: str, verb: str,
                     strict: bool) -> None:
    var = fs.variables[out.channel[row]]
    rng = var.ranges
    allowed = None if rng is None else f"{rng.valid_low:g} to {rng.valid_high:g}"
    loc = out.locate(int(out.source[row]))
    if strict:
        out.problems.append(Problem(loc=loc, rule=code.replace("value_", "out_of_range_"),
                                    message=f"{var.id} value {verb}", allowed=allowed))
    else:
        out.notices.append(Notice(code=code, loc=loc, variable=var.id,
                                  message=f"{var.id} value {verb}; valid: {allowed}"))


def _window_notices(out: StayIngest, fs: FeatureSet, stay_end: float | None) -> None:
    """The window end (fixed, or the stay's end capped at the maximum) and what falls outside.

    Whole-stay sets end where training ended them: the stay's length (`end_hours`, the
    benchmark's `period_length`) capped at `max_hours`; rows after the end are ignored.
    """
    last = float(out.time.max()) if len(out.time) else 0.0
    if last == 0.0:  # Python's max keeps the first of 0.0 and -0.0, and messages show the sign
        last = max(out.time.tolist(), default=0.0)
    if fs.window_hours is not None:
        out.end_hours = fs.window_hours
        after = 0
        if last > fs.window_hours + 1e-6:
            after = int(np.count_nonzero(out.time > fs.window_hours + 1e-6))
        if after:
            out.notices.append(Notice(
                code="observations_after_window",
                message=f"{after} observations after the {fs.window_hours:g} h window are ignored",
            ))
        if last < fs.window_hours - fs.timestep:
            out.notices.append(Notice(
                code="stay_shorter_than_window",
                message=f"last observation at {last:.1f} h, before the end of the "
                f"{fs.window_hours:g} h window: later hours carry forward the last values",
            ))
    else:
        if stay_end is None:
            out.notices.append(Notice(
                code="stay_end_unknown",
                message="no `end_hours` given: the window ends at the last observation "
                f"({last:.1f} h); training used the stay's length",
            ))
        out.end_hours = min(last if stay_end is None else stay_end, fs.max_hours)
        after = int(np.count_nonzero(out.time > out.end_hours + 1e-6))
        if after:
            out.notices.append(Notice(
                code="observations_after_window",
                message=f"{after} observations after the {out.end_hours:g} h window are ignored",
            ))
    seen = np.bincount(out.channel, minlength=fs.n_channels)
    unobserved = _not_observed(fs)
    out.notices += map(unobserved.__getitem__, (seen == 0).nonzero()[0].tolist())


@lru_cache(maxsize=32)
def _not_observed(fs: FeatureSet) -> tuple[Notice, ...]:
    """Per channel, its `channel_not_observed` notice: the same for every stay, so built once
    (a served stay lacks a dozen channels); shared between answers and never modified."""
    return tuple(Notice(code="channel_not_observed", variable=v.id,
                        message=f"{v.id} not observed: its normal value is used")
                 for v in fs.variables)


def ingest(stays: Sequence[Stay], fs: FeatureSet, *, strict: bool = False,
           max_observations: int = DEFAULT_MAX_OBSERVATIONS) -> IngestResult:
    """Ingest many stays; the ones without problems are stacked into one `Observations`."""
    parts = [ingest_stay(s, fs, strict=strict, max_observations=max_observations) for s in stays]
    ok = [i for i, p in enumerate(parts) if not p.problems]
    good = [parts[i] for i in ok]
    obs = Observations(
        np.zeros(len(good[0].channel), dtype=np.int64) if len(good) == 1  # a lone stay: 0s
        else np.arange(len(ok)).repeat([len(p.channel) for p in good]),
        _stack([p.channel for p in good], np.int64),
        _stack([p.time for p in good], np.float64),
        _stack([p.value for p in good], np.float64),
        len(ok),
    )
    static = np.array([p.static for p in good], dtype=np.float64).reshape(
        len(ok), len(STATIC_FIELDS))
    end = np.array([p.end_hours for p in good], dtype=np.float64)
    return IngestResult(parts, ok, obs, static, end)


def _stack(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    """One array, always a copy: the result never shares memory with a `StayIngest`."""
    if len(arrays) == 1:
        return arrays[0].copy()  # the common one-stay request: a third of concatenate's cost
    return np.concatenate(arrays) if arrays else _empty(dtype)
