"""Scores of MEDS stays -> predictions in the meds-evaluation format (MEDS-DEV reads them).

`scehr score` keys each stay of a converted split folder by its file name; `convert-meds` wrote
beside the listfile which MEDS label row each stay is (`meds_labels.parquet`). Joined, they give
the MEDS label schema plus the two prediction columns meds-evaluation's `PredictionSchema` asks
for: `predicted_boolean_probability` (the model's calibrated risk) and
`predicted_boolean_value` (its alert at the operating threshold its card states). A stay that
was not scored (an error, too little data) has no prediction row; it is counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from scehr.training.data.meds_input import STAY_LABELS

#: The columns and types of meds-evaluation's PredictionSchema (a MEDS label table plus two).
PREDICTION_SCHEMA = pa.schema([
    ("subject_id", pa.int64()), ("prediction_time", pa.timestamp("us")),
    ("boolean_value", pa.bool_()), ("predicted_boolean_value", pa.bool_()),
    ("predicted_boolean_probability", pa.float32())])


def read_scores(path: Path) -> pd.DataFrame:
    """`scehr score` output (CSV or JSON Lines) as id, status, and `<label>.<field>` columns."""
    path = Path(path)
    if path.suffix == ".csv":
        return pd.read_csv(path, dtype={"id": str, "status": str})
    if path.suffix == ".jsonl":
        rows = []
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    flat = {"id": str(row["id"]), "status": row["status"]}
                    for label, fields in (row.get("results") or {}).items():
                        flat.update({f"{label}.{k}": v for k, v in fields.items()})
                    rows.append(flat)
        return pd.DataFrame(rows)
    raise ValueError(f"{path}: expected the .csv or .jsonl output of scehr score")


def meds_predictions(scores: Path, split_dir: Path, out: Path, *,
                     label: str | None = None) -> dict[str, Any]:
    """Write `out` (parquet, PREDICTION_SCHEMA) from `scores` of the stays in `split_dir`."""
    index_path = Path(split_dir) / STAY_LABELS
    if not index_path.is_file():
        raise FileNotFoundError(f"{index_path} not found: score a split folder written by "
                                "scehr data convert-meds")
    index = pq.read_table(index_path).to_pandas()
    table = read_scores(scores)
    labels = sorted({c.rsplit(".", 1)[0] for c in table.columns if c.endswith(".risk")})
    if label is None and len(labels) == 1:
        label = labels[0]
    if label not in labels:
        raise ValueError(f"{scores}: give --label, one of {labels}" if label is None else
                         f"--label {label!r}: the scores hold {labels}")
    scored = table[table.status == "ok"].set_index("id")
    unknown = sorted(set(scored.index) - set(index.stay))
    if unknown:
        raise ValueError(f"{len(unknown)} scored stay(s) are not in {index_path}, e.g. "
                         f"{unknown[0]!r}: scores of another folder?")
    rows = index[index.stay.isin(scored.index)]
    alert = scored.loc[rows.stay, f"{label}.alert"].astype(str).str.lower() == "true"
    df = pd.DataFrame({
        "subject_id": rows.subject_id.to_numpy(),
        "prediction_time": rows.prediction_time.to_numpy(),
        "boolean_value": rows.boolean_value.to_numpy(dtype=bool),
        "predicted_boolean_value": alert.to_numpy(),
        "predicted_boolean_probability": scored.loc[rows.stay, f"{label}.risk"]
        .to_numpy(dtype="float32")})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(df, schema=PREDICTION_SCHEMA, preserve_index=False), out)
    return {"label": label, "predictions": len(df), "stays": len(index),
            "not_scored": len(index) - len(df)}
