"""Random stay payloads, valid and invalid, and a field-by-field comparison of two ingests.

Shared by `tests/schemas/test_ingest_equivalence.py` and `benchmarks/ingest_throughput.py`:
the payloads mix every spelling the ingest accepts (ids, benchmark names, case and blanks,
unit spellings, category aliases and numeric forms, ISO timestamps, wide form) with every
rule it enforces (unknown variables, units and categories, missing units, strings for
numbers, negative or late times, timezone mismatches, out-of-range values for cleaning).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from scehr.schemas.variables import VARIABLES, Variable

ADMISSION = datetime(2026, 1, 1, 6, 0, 0)


def _pick(rng: np.random.Generator, items: list | tuple) -> Any:
    return items[int(rng.integers(len(items)))]


def _name(rng: np.random.Generator, v: Variable, bad: float) -> str:
    if rng.random() < bad:
        return _pick(rng, ["lactate", "heartrate", "", "Heart  Rate"])
    return _pick(rng, [v.id, v.id, v.benchmark_name, v.benchmark_name.lower(),
                       f" {v.benchmark_name.upper()} ", f"{v.id.upper()}\t"])


def _unit(rng: np.random.Generator, v: Variable, bad: float) -> tuple[str | None, Any]:
    """A unit for `v` and its conversion; bad ones are missing, unknown or given to categories."""
    if rng.random() < bad:
        return _pick(rng, [None, "", "K", " ", "mmHg", "mmol"]), None
    if v.is_categorical:
        return _pick(rng, [None, None, None, ""]), None
    u = _pick(rng, v.units)
    spelling = _pick(rng, u.spellings)
    if rng.random() < 0.3:
        spelling = _pick(rng, [spelling.upper(), f" {spelling} ", spelling.lower()])
    if not v.unit_required and rng.random() < 0.4:
        return _pick(rng, [None, ""]), None
    return spelling, u


def _value(rng: np.random.Generator, v: Variable, unit: Any, bad: float) -> float | str:
    if v.is_categorical:
        if rng.random() < bad:
            return _pick(rng, ["bogus", 17, 2.5, "4 spontaneously!", 99.0])
        choices: list[Any] = [*v.categories, *v.category_aliases]
        choices += [int(k) for k in v.category_aliases if k.isdigit()]
        choices += [float(k) for k in v.category_aliases if k.replace(".", "", 1).isdigit()]
        choices += [int(c) for c in v.categories if c.isdigit()]
        choices += [f" {str(a).upper()} " for a in v.category_aliases]
        return _pick(rng, choices)
    if rng.random() < bad:
        return _pick(rng, ["fast", "80", "n/a"])
    r = v.ranges
    if r is not None and rng.random() < 0.05:  # outside the valid or outlier bounds
        span = max(r.outlier_high - r.outlier_low, 1.0)
        x = _pick(rng, [r.outlier_low - 0.1 * span, r.valid_low - 0.01 * span,
                        r.valid_high + 0.01 * span, r.outlier_high + 0.2 * span])
    else:
        x = float(v.normal) * float(rng.uniform(0.7, 1.3))
        if rng.random() < 0.01:
            x = _pick(rng, [-0.0, 0.0])
    if unit is not None and not unit.is_identity:  # send it in the other unit
        x = {"%": x * 100.0, "mmol/L": x / 18.0156, "in": x / 2.54, "m": x / 100.0,
             "[degF]": x * 9.0 / 5.0 + 32.0, "[lb_av]": x / 0.453592,
             "[oz_av]": x * 16.0 / 0.453592,
             "g": x * 1000.0}[unit.name]
    return round(x, int(rng.integers(0, 4))) if rng.random() < 0.7 else x


def _time(rng: np.random.Generator, max_hours: float, bad: float, iso: bool,
          aware: bool) -> float | str:
    h = float(rng.uniform(0, max_hours))
    if rng.random() < bad:
        h = _pick(rng, [-0.5, -3.0, max_hours + 5.0, max_hours + 0.001])
    elif rng.random() < 0.05:
        h = _pick(rng, [0.0, -0.0, max_hours, 48.0, 48.0 + 1e-7, 47.9999999])
    h = round(h, int(rng.integers(0, 3))) if rng.random() < 0.5 else h
    if not iso:
        return h
    t = ADMISSION + timedelta(hours=h)
    if aware or (rng.random() < bad):
        t = t.replace(tzinfo=timezone(timedelta(hours=2)))
    return t.isoformat()


def random_stay(rng: np.random.Generator, *, bad: float = 0.02, max_hours: float = 60.0,
                n_max: int = 80) -> dict[str, Any]:
    """One stay payload (a dict pydantic accepts); `bad` is the chance of each kind of error."""
    n = int(rng.integers(0, n_max + 1)) if rng.random() < 0.95 else 0
    variables = list(VARIABLES) if rng.random() < 0.7 else list(
        rng.choice(np.array(VARIABLES, dtype=object), int(rng.integers(1, 6)), replace=False))
    stay: dict[str, Any] = {"id": f"s{int(rng.integers(1_000_000))}"}
    if rng.random() < 0.5:  # the stay's length: whole-stay windows end there, capped
        stay["end_hours"] = _pick(rng, [float(rng.uniform(0.5, max_hours)), max_hours + 50.0,
                                        1.0])
    if rng.random() < 0.5:
        stay["demographics"] = _pick(rng, [{}, {"age": float(rng.uniform(18, 100))},
                                           {"sex": "male"}, {"age": 70, "sex": "female"}])
    if rng.random() < 0.2:
        return {**stay, "wide": _wide(rng, variables, n, bad, max_hours)}
    iso = rng.random() < 0.15
    aware = rng.random() < 0.5
    if iso and rng.random() > bad:
        adm = ADMISSION.replace(tzinfo=timezone(timedelta(hours=2))) if aware else ADMISSION
        stay["admission_time"] = adm.isoformat()
    obs = []
    for _ in range(n):
        v = _pick(rng, variables)
        unit, u = _unit(rng, v, bad)
        o: dict[str, Any] = {"variable": _name(rng, v, bad),
                             "time": _time(rng, max_hours, bad, iso and rng.random() < 0.9,
                                           aware),
                             "value": _value(rng, v, u, bad)}
        if unit is not None or rng.random() < 0.1:
            o["unit"] = unit
        obs.append(o)
    return {**stay, "observations": obs}


def _wide(rng: np.random.Generator, variables: list[Variable], n: int, bad: float,
          max_hours: float) -> dict[str, Any]:
    rows = max(1, n // 4)
    hours = sorted(float(_time(rng, max_hours, bad / 4, False, False)) for _ in range(rows))
    columns: dict[str, list[Any]] = {}
    units: dict[str, str] = {}
    for v in variables[: int(rng.integers(1, len(variables) + 1))]:
        unit, u = _unit(rng, v, bad)
        col = [None if rng.random() < 0.4 else _value(rng, v, u, bad) for _ in range(rows)]
        if rng.random() < bad:
            col = col[:-1] if rng.random() < 0.5 else [*col, None]  # length mismatch
        name = _name(rng, v, bad)
        columns[name] = col
        if unit is not None:
            units[name if rng.random() > bad else v.id + "_"] = unit  # a stray key is ignored
    return {"hours": hours, "columns": columns, "units": units}


# ---------------------------------------------------------------- comparison


def _same_array(a: Any, b: Any, dtype: type, what: str) -> None:
    """Equal bit for bit (so -0.0 differs from 0.0); an empty list may stand for any dtype."""
    a = np.asarray(a, dtype=dtype)
    b = np.asarray(b)
    assert b.dtype == dtype or len(b) == 0, f"{what}: dtype {b.dtype}"
    b = b.astype(dtype)
    np.testing.assert_array_equal(a, b, err_msg=what, strict=True)
    assert a.tobytes() == b.tobytes(), f"{what}: not bit for bit equal"


def assert_same_stay(ref: Any, new: Any, where: str = "") -> None:
    """Every output of one stay's ingest: arrays bit for bit, problems and notices in order."""
    _same_array(ref.channel, new.channel, np.int64, f"{where} channel")
    _same_array(ref.time, new.time, np.float64, f"{where} time")
    _same_array(ref.value, new.value, np.float64, f"{where} value")
    assert ref.loc == new.loc, f"{where} loc"
    np.testing.assert_array_equal(np.asarray(ref.static, dtype=float),
                                  np.asarray(new.static, dtype=float), err_msg=f"{where} static")
    assert [p.model_dump() for p in ref.problems] == [p.model_dump() for p in new.problems], (
        f"{where} problems")
    assert [n.model_dump() for n in ref.notices] == [n.model_dump() for n in new.notices], (
        f"{where} notices")
    assert isinstance(new.end_hours, float), f"{where} end_hours {new.end_hours!r}"
    _same_array([ref.end_hours], [new.end_hours], np.float64, f"{where} end_hours")


def assert_same_result(ref: Any, new: Any) -> None:
    """Two `IngestResult`s: each stay, then the stacked arrays."""
    assert len(ref.stays) == len(new.stays)
    for i, (a, b) in enumerate(zip(ref.stays, new.stays, strict=True)):
        assert_same_stay(a, b, f"stay {i}")
    assert ref.ok == new.ok
    for k, dtype in (("stay", np.int64), ("channel", np.int64), ("time", np.float64),
                     ("value", np.float64)):
        _same_array(getattr(ref.observations, k), getattr(new.observations, k), dtype, k)
    assert ref.observations.n_stays == new.observations.n_stays
    np.testing.assert_array_equal(ref.static_raw, new.static_raw, strict=True)
    _same_array(ref.end_hours, new.end_hours, np.float64, "end_hours")
