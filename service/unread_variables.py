"""Variables a model does not read: one problem per variable, and a served version that reads
them.

`scehr.schemas.ingest` refuses a stay row by row; a stay shaped for another feature set (the 17
benchmark channels sent to the PhysioNet model) would get one `unknown_variable` problem per
observation, each repeating the model's variable list. Here they become one problem per
distinct variable (the first occurrence's path, how many rows), the allowed names once, and
catalog variables are "not read by this model" (rule `variable_not_read`), not unknown. When
another served version of the task reads them, a first problem names it (`?version=`).
"""

from __future__ import annotations

from collections.abc import Sequence

from scehr.schemas.ingest import ColumnStay, Stay, unknown_variable
from scehr.schemas.payloads import Problem
from scehr.schemas.variables import in_catalog
from scehr.service.model import ModelSpec

UNKNOWN = "unknown_variable"
NOT_READ = "variable_not_read"
HINT = "served_version_reads_them"


def _variable_at(stay: Stay, loc: Sequence[str | int]) -> str | None:
    """The variable name a problem's field path points at (long or wide form, or a reader's
    columns)."""
    if len(loc) >= 2 and loc[0] == "observations" and isinstance(loc[1], int):
        if isinstance(stay, ColumnStay):
            names = stay.columns.variable
            return names[loc[1]] if loc[1] < len(names) else None
        if stay.observations is not None and loc[1] < len(stay.observations):
            return stay.observations[loc[1]].variable
    if len(loc) >= 3 and loc[0] == "wide" and loc[1] == "columns":
        return str(loc[2])
    return None


def _hint(spec: ModelSpec, unread: list[str], served: Sequence[ModelSpec]) -> Problem | None:
    """The served version (other than `spec`'s) that reads most of the catalog variables
    `spec` does not, when one reads any."""
    best, best_reads = None, set()
    for other in served:
        if other.ref.version == spec.ref.version:
            continue
        reads = set(unread) & set(other.fs.variable_ids)
        if len(reads) > len(best_reads):
            best, best_reads = other, reads
    if best is None:
        return None
    which = ("all of them" if len(best_reads) == len(unread)
             else ", ".join(v for v in unread if v in best_reads))
    return Problem(loc=["query", "version"], rule=HINT,
                   message=f"{len(unread)} variable(s) of this stay are not read by {spec.task} "
                   f"{spec.ref.version}; {spec.task} {best.ref.version}, also served here, "
                   f"reads {which}: send ?version={best.ref.version}",
                   allowed=best.ref.version)


def compact(spec: ModelSpec, stay: Stay, problems: list[Problem],
            served: Sequence[ModelSpec] = ()) -> list[Problem]:
    """`problems` with the unknown-variable rows folded into one problem per variable (at its
    first row), the allowed names on the first only, preceded by a hint naming a served
    version that reads them (`served`: the task's loaded models)."""
    rows: dict[str, int] = {}
    for p in problems:
        if p.rule == UNKNOWN and (var := _variable_at(stay, p.loc)) is not None:
            rows[var] = rows.get(var, 0) + 1
    if not rows:
        return problems
    out: list[Problem] = []
    done: set[str] = set()
    allowed_given = False
    unread: list[str] = []
    for p in problems:
        var = _variable_at(stay, p.loc) if p.rule == UNKNOWN else None
        if var is None:
            out.append(p)
            continue
        if var in done:
            continue
        done.add(var)
        n = rows[var]
        known = in_catalog(var)
        if known is not None:
            unread.append(known.id)
            rule = NOT_READ
            times = f" ({n} observations)" if n > 1 else ""
            message = (f"{var!r} is not read by this model ({spec.task} {spec.ref.version}, "
                       f"feature set {spec.fs.name}){times}")
        else:
            rule = UNKNOWN
            message = unknown_variable(var, spec.fs, n)
        out.append(Problem(loc=p.loc, rule=rule, message=message,
                           allowed=None if allowed_given else p.allowed))
        allowed_given = True
    hint = _hint(spec, list(dict.fromkeys(unread)), served) if unread else None
    return [hint, *out] if hint is not None else out
