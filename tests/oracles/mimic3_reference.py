"""Fingerprints of mimic3-benchmarks' output on the MIMIC-III demo, and the check against them.

The reference output (915 files, 44 MB, demo patient data) is not stored: only a sha256 per
file (`mimic3_demo_reference.json`), so the suite can tell byte for byte whether our extraction
equals it without copying any data into the repository. Where the reference's row order is an
accident the sha256 of its sorted rows is stored too; where its `Age` is 1 ulp off (pandas 1.2's
float parser) the sha256 with that field blanked and the ulp step from our value.

Made with github.com/YerevaNN/mimic3-benchmarks at ea0314c7cbd369f62e2237ace6f683740f867e3a
(MIT License, Copyright (c) 2017 YerevaNN), its scripts for the root folder and the four tasks
(`REFERENCE_STEPS` in benchmarks/mimic3_extract.py) run on the demo (headers upper-cased, files
gunzipped) with its pinned pandas 1.2.5 and numpy 1.16.5 on Python 3.7 (`python
benchmarks/mimic3_extract.py --copies 1 --reference-dir ... --reference-python ... --workdir W`
leaves the reference's output in W/reference and ours in W/ours):

    python tests/oracles/mimic3_reference.py REFERENCE_DATA_DIR OUR_OUTPUT_DIR > \
        tests/oracles/mimic3_demo_reference.json
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

from scehr.training.data.mimic3.compare import ORDER_FREE, SKIP_PARTS

MANIFEST = Path(__file__).with_name("mimic3_demo_reference.json")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sorted_sha(data: bytes) -> str:
    lines = data.decode().splitlines()
    return _sha("\n".join(lines[:1] + sorted(lines[1:])).encode())


def _files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*"))
            if p.is_file() and not SKIP_PARTS & set(p.relative_to(root).parts)}


def _age_parts(data: bytes) -> tuple[list[str], int, float]:
    lines = data.decode().splitlines()
    age = lines[0].split(",").index("Age")
    return lines, age, float(lines[1].split(",")[age])


def _blank_age(data: bytes) -> str:
    lines, age, _ = _age_parts(data)
    fields = lines[1].split(",")
    fields[age] = ""
    return _sha("\n".join([lines[0], ",".join(fields)]).encode())


def _with_age(data: bytes, value: float) -> bytes:
    lines, age, _ = _age_parts(data)
    fields = lines[1].split(",")
    fields[age] = repr(value)
    return ("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n").encode()


def fingerprint(reference: Path, ours: Path) -> dict[str, dict[str, object]]:
    """The manifest: per reference file its sha256, plus what the documented exceptions need."""
    out: dict[str, dict[str, object]] = {}
    mine = _files(ours)
    for rel, path in _files(reference).items():
        data = path.read_bytes()
        entry: dict[str, object] = {"sha256": _sha(data)}
        name = rel.rsplit("/", 1)[-1]
        if name in ORDER_FREE:
            entry["sorted_sha256"] = _sorted_sha(data)
        own = mine[rel].read_bytes() if rel in mine else None
        if (name.startswith("episode") and "timeseries" not in name and own is not None
                and own != data and len(data.splitlines()) == 2):
            ref_age, our_age = _age_parts(data)[2], _age_parts(own)[2]
            step = 1 if ref_age > our_age else -1
            if math.nextafter(our_age, math.inf * step) == ref_age:
                entry["age_blank_sha256"] = _blank_age(data)
                entry["age_ulp_step"] = step
        out[rel] = entry
    return out


def check(ours: Path, manifest: dict[str, dict[str, object]]) -> dict[str, list[str]]:
    """Classify our files against the manifest: identical / reordered / age_ulp / different,
    only_ours / only_reference."""
    res: dict[str, list[str]] = {k: [] for k in ("identical", "reordered", "age_ulp",
                                                 "different", "only_ours", "only_reference")}
    mine = _files(ours)
    res["only_ours"] = sorted(set(mine) - set(manifest))
    res["only_reference"] = sorted(set(manifest) - set(mine))
    for rel in sorted(set(mine) & set(manifest)):
        data, entry = mine[rel].read_bytes(), manifest[rel]
        if _sha(data) == entry["sha256"]:
            res["identical"].append(rel)
        elif "sorted_sha256" in entry and _sorted_sha(data) == entry["sorted_sha256"]:
            res["reordered"].append(rel)
        elif ("age_blank_sha256" in entry and _blank_age(data) == entry["age_blank_sha256"]
              and _sha(_with_age(data, math.nextafter(
                  _age_parts(data)[2], math.inf * int(entry["age_ulp_step"]))))  # type: ignore[arg-type]
              == entry["sha256"]):
            res["age_ulp"].append(rel)
        else:
            res["different"].append(rel)
    return res


if __name__ == "__main__":
    json.dump(fingerprint(Path(sys.argv[1]), Path(sys.argv[2])), sys.stdout, indent=0,
              sort_keys=True)
    sys.stdout.write("\n")
