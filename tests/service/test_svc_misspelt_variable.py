"""A misspelt variable gets its suggestion on every interface that names it (README: "a
misspelt `heart_rat` gets 'did you mean heart_rate?'"), also once its rows are folded into one
problem per variable. FHIR and CDS Hooks name variables by LOINC code, not by a spelling: an
unknown code is an `unmapped_code` warning there, with no name to suggest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.service.offline_scoring import score

pytestmark = pytest.mark.anyio
SUGGESTION = "(did you mean heart_rate?)"


def misspelt(rows: int) -> dict[str, Any]:
    """A stay whose only variable is `heart_rat`, in `rows` observations."""
    return {"id": "typo", "observations": [
        {"variable": "heart_rat", "time": float(h), "value": 80} for h in range(rows)]}


@pytest.mark.parametrize("rows", [1, 48])
async def test_single_stay_answer_keeps_the_suggestion(client: httpx.AsyncClient,
                                                       rows: int) -> None:
    r = await client.post("/predict/mortality", json=misspelt(rows))
    assert r.status_code == 422, r.text
    [p] = r.json()["detail"]
    assert p["rule"] == "unknown_variable" and SUGGESTION in p["message"]
    assert ("(48 observations)" in p["message"]) == (rows == 48)


async def test_batch_item_keeps_the_suggestion(client: httpx.AsyncClient) -> None:
    r = await client.post("/predict/mortality/batch", json={"stays": [misspelt(48)]})
    assert r.status_code == 200, r.text
    [p] = r.json()["items"][0]["errors"]
    assert p["message"] == f"unknown variable 'heart_rat' (48 observations) {SUGGESTION}"
    assert p["loc"] == ["body", "stays", 0, "observations", 0, "variable"]


def test_scehr_score_row_keeps_the_suggestion(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps(misspelt(48)) + "\n")
    out = tmp_path / "out.jsonl"
    score("mortality", tmp_path / "in.jsonl", out, model_dir=model_dir, device="cpu",
          progress=False)
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "error"
    [e] = row["errors"]
    assert e["rule"] == "unknown_variable" and SUGGESTION in e["message"]
