"""`scehr score` counts the stays below the model's data minimum as abstentions, not as
scored stays, and scores them on request (`--allow-insufficient`), as the API does."""

from __future__ import annotations

import io
import json
from pathlib import Path

from scehr.service.offline_scoring import score
from tests.conftest import REPO

MODELS = REPO / "models"


def one_heart_rate(sid: str) -> dict:
    return {"id": sid, "observations": [{"variable": "heart_rate", "time": 3.0, "value": 80}]}


def stays(tmp_path: Path) -> Path:
    """Two stays far below the shipped default's minimum and the example above it."""
    example = json.loads((REPO / "examples" / "mortality_stay.json").read_text())
    items = [one_heart_rate("a"), {**example, "id": "full"}, one_heart_rate("b")]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in items))
    return path


def test_the_summary_counts_abstentions_apart_from_scored_stays(tmp_path: Path) -> None:
    log = io.StringIO()
    s = score("mortality", stays(tmp_path), tmp_path / "out.jsonl", model_dir=MODELS,
              device="cpu", progress=False, log=log)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["insufficient_data", "ok", "insufficient_data"]
    assert (s.scored, s.abstained, s.errors, s.written) == (1, 2, 0, 3)
    line = log.getvalue().splitlines()[-1]
    assert "1 scored, 2 abstained (below the model's data minimum" in line, line


def test_allow_insufficient_scores_every_stay_and_says_which_were_below(tmp_path: Path
                                                                        ) -> None:
    log = io.StringIO()
    s = score("mortality", stays(tmp_path), tmp_path / "out.jsonl", model_dir=MODELS,
              device="cpu", progress=False, log=log, allow_insufficient=True)
    rows = {r["id"]: r for r in map(json.loads,
                                    (tmp_path / "out.jsonl").read_text().splitlines())}
    assert all(r["status"] == "ok" and r["results"] for r in rows.values())
    assert [k for k, r in rows.items() if "below_data_minimum" in r["warnings"]] == ["a", "b"]
    assert (s.scored, s.abstained, s.below_minimum) == (3, 0, 2)
    assert "3 scored (2 of them below the data minimum, scored on request)" in log.getvalue()
