"""The 422 a stay gets from a model that cannot read it, compacted and as it was row by row.

    .venv/bin/python benchmarks/version_422.py [--stay examples/mortality_stay_benchmark17.json]
        [--versions mortality=1.2.2,1.1.1]

Serves the shipped models in-process (SCEHR_VERSIONS as given; the task's default answers),
posts the stay to `POST /predict/{task}`, and prints the status, the body's size, the number
of problems and how many carry the allowed-names list: once as served, once with the
compaction (`scehr.service.unread_variables.compact`) switched off, which is the row-by-row answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import httpx

import scehr.service.scorer as scorer
from scehr.service.app import create_app
from scehr.service.settings import Settings

REPO = Path(__file__).resolve().parents[1]


async def answer(body: dict, versions: str, task: str) -> httpx.Response:
    app = create_app(Settings(model_dir=REPO / "models", device="cpu", versions=versions,
                              log_level="ERROR"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            for _ in range(2000):
                if (await c.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            return await c.post(f"/predict/{task}", json=body)


def describe(label: str, r: httpx.Response) -> None:
    detail = r.json().get("detail", [])
    rules = sorted({p["rule"] for p in detail})
    print(f"{label}: {r.status_code}, {len(r.content):,} bytes, {len(detail)} problems, "
          f"{sum(p['allowed'] is not None for p in detail)} with `allowed`, rules {rules}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stay", type=Path,
                    default=REPO / "examples" / "mortality_stay_benchmark17.json")
    ap.add_argument("--versions", default="mortality=1.2.2,1.1.1")
    args = ap.parse_args()
    body = json.loads(args.stay.read_text())
    task = args.versions.split("=", 1)[0]
    describe("compacted", asyncio.run(answer(body, args.versions, task)))
    compact = scorer.compact
    scorer.compact = lambda spec, stay, problems, served=(): problems  # type: ignore[assignment]
    try:
        describe("row by row", asyncio.run(answer(body, args.versions, task)))
    finally:
        scorer.compact = compact


if __name__ == "__main__":
    main()
