"""Where the raw tables and the benchmark's resource files are, and how the small tables are read.

MIMIC-III ships `NAME.csv.gz` with upper-case headers; the open demo has lower-case headers and
some copies are uncompressed or lower-case file names: every spelling is accepted and column
names are upper-cased on read.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from scehr.training.data.layout import data_dir

#: Strings pandas 1.x reads as missing (its `STR_NA_VALUES`), which the reference pipeline used
#: (pinned pandas 1.2.5). pandas 2 added "None", a real answer of the GCS items ("None" = no eye
#: opening), so the benchmark keeps it as a value, as its published data does.
PANDAS1_NA: tuple[str, ...] = (
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "<NA>", "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null",
)


def table_path(mimic_dir: Path, name: str) -> Path:
    """The file of table `name` (e.g. "CHARTEVENTS") under `mimic_dir`: .csv or .csv.gz, any case.

    Raises FileNotFoundError naming the folder and the spellings tried.
    """
    tried = []
    for stem in (name.upper(), name.lower()):
        for ext in (".csv.gz", ".csv"):
            p = Path(mimic_dir) / f"{stem}{ext}"
            tried.append(p.name)
            if p.is_file():
                return p
    raise FileNotFoundError(f"MIMIC table {name} not found in {mimic_dir} "
                            f"(tried {', '.join(tried)})")


def header(path: Path) -> list[str]:
    """The column names of a CSV(.gz), upper-cased."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        return [c.strip().strip('"').upper() for c in f.readline().rstrip("\r\n").split(",")]


def read_small(mimic_dir: Path, name: str, columns: list[str]) -> pd.DataFrame:
    """A small table (patients, admissions, ICU stays, diagnoses) as text, missing as None.

    Every cell stays a string so that later steps convert exactly what the reference converts.
    """
    path = table_path(mimic_dir, name)
    cols = header(path)
    missing = [c for c in columns if c not in cols]
    if missing:
        raise ValueError(f"{path}: column(s) {', '.join(missing)} missing (has {', '.join(cols)})")
    df = pd.read_csv(path, dtype=object, keep_default_na=False, na_values=list(PANDAS1_NA),
                     header=0, names=cols, usecols=columns)
    return df.astype(object).where(df.notna(), None)[columns]


@dataclass(frozen=True)
class Resources:
    """The benchmark's resource files (mimic3-benchmarks `mimic3benchmark/resources`, valset)."""

    itemid_map: Path
    ccs_definitions: Path
    testset: Path
    valset: Path

    @classmethod
    def from_dir(cls, root: Path | None = None) -> Resources:
        """Resources under `root` (a mimic3-benchmarks checkout or the shared copy of its files);
        default: `mimic3-benchmarks-resources` in the data folder."""
        root = Path(root) if root else data_dir() / "mimic3-benchmarks-resources"
        res = root / "mimic3benchmark" / "resources"
        out = cls(itemid_map=res / "itemid_to_variable_map.csv",
                  ccs_definitions=res / "hcup_ccs_2015_definitions.yaml",
                  testset=res / "testset.csv",
                  valset=root / "mimic3models" / "resources" / "valset.csv")
        absent = [str(p) for p in vars(out).values() if not Path(p).is_file()]
        if absent:
            raise FileNotFoundError("mimic3-benchmarks resource file(s) not found: "
                                    + ", ".join(absent))
        return out


def read_subject_set(path: Path) -> set[str]:
    """Subject ids marked 1 in `testset.csv` / `valset.csv` (lines `subject_id,0|1`)."""
    out = set()
    with open(path) as f:
        for line in f:
            x, y = line.split(",")
            if int(y) == 1:
                out.add(x)
    return out
