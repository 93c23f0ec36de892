"""Compare an extraction with mimic3-benchmarks' output, every file, every row.

Files must be byte-identical, with two documented exceptions (docs/mimic.md):

- row order, where the reference's order is an accident: its train listfiles are shuffled (and
  its phenotyping test listfile left) in the order the file system lists the subject and
  episode files; those files must hold the same rows (ours: shuffled from sorted order with
  the reference's seed, the phenotyping test listfile sorted);
- `Age` in `episode*.csv`, where the reference re-reads `stays.csv` with pandas 1.2's default
  float parser, which is not correctly rounded: it may be 1 ulp off the value the reference
  itself wrote to `all_stays.csv`; ours is that value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

ORDER_FREE = {"listfile.csv", "train_listfile.csv", "val_listfile.csv", "test_listfile.csv"}
SKIP_PARTS = {".mimic3-work", "provenance.json"}


@dataclass
class Report:
    """Outcome of `compare_trees`."""

    identical: int = 0
    reordered: list[str] = field(default_factory=list)
    age_ulp: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)
    only_ours: list[str] = field(default_factory=list)
    only_reference: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.different or self.only_ours or self.only_reference)

    def summary(self) -> str:
        n = self.identical + len(self.reordered) + len(self.age_ulp) + len(self.different)
        lines = [f"files compared: {n}",
                 f"  byte-identical: {self.identical}",
                 f"  same rows, order differs (reference order is arbitrary): "
                 f"{len(self.reordered)}",
                 f"  Age 1 ulp off in the reference (pandas 1.2 float parser): "
                 f"{len(self.age_ulp)}",
                 f"  different: {len(self.different)}",
                 f"  only in ours: {len(self.only_ours)}; only in the reference: "
                 f"{len(self.only_reference)}"]
        for name, items in (("different", self.different), ("only in ours", self.only_ours),
                            ("only in the reference", self.only_reference)):
            lines += [f"  {name}: {p}" for p in items[:20]]
        lines.append("EQUAL" if self.equal else "NOT EQUAL")
        return "\n".join(lines)


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and not SKIP_PARTS & set(p.relative_to(root).parts)}


def _age_within_ulp(ours: list[str], ref: list[str]) -> bool:
    if len(ours) != len(ref) or ours[0] != ref[0]:
        return False
    age = ours[0].split(",").index("Age")
    for a, b in zip(ours[1:], ref[1:], strict=True):
        fa, fb = a.split(","), b.split(",")
        if fa[:age] + fa[age + 1:] != fb[:age] + fb[age + 1:]:
            return False
        x, y = float(fa[age]), float(fb[age])
        if abs(x - y) > math.ulp(x):
            return False
    return True


def compare_trees(ours: Path, reference: Path) -> Report:
    """File-by-file comparison of two benchmark data folders (root and task folders)."""
    ours, reference = Path(ours), Path(reference)
    a, b = _files(ours), _files(reference)
    rep = Report(only_ours=sorted(a - b), only_reference=sorted(b - a))
    for rel in sorted(a & b):
        x, y = (ours / rel).read_bytes(), (reference / rel).read_bytes()
        if x == y:
            rep.identical += 1
            continue
        lx, ly = x.decode().splitlines(), y.decode().splitlines()
        name = rel.rsplit("/", 1)[-1]
        if name in ORDER_FREE and lx[:1] == ly[:1] and sorted(lx[1:]) == sorted(ly[1:]):
            rep.reordered.append(rel)
        elif name.startswith("episode") and "timeseries" not in name and _age_within_ulp(lx, ly):
            rep.age_ulp.append(rel)
        else:
            rep.different.append(rel)
    return rep
