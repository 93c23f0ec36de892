"""The plain FastAPI + ONNX Runtime app a user would write: one ORT run per request.

    python benchmarks/alternatives/plain_fastapi.py --port 8001 --task mortality [--model-dir D]

Same preprocessing and read-outs as scehr (`service.pipeline.prepare` / `predictions`, the
shipped model's own session settings), no batching, no admission control, no metrics: a body
parameter validated by FastAPI, a sync route (FastAPI runs it in its thread pool), the
Prediction returned through `response_model`. One uvicorn worker, as `uvicorn app:app` starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from fastapi import FastAPI, HTTPException  # noqa: E402

from schemas.payloads import Prediction, StayPayload  # noqa: E402
from service.pipeline import predictions, prepare  # noqa: E402
from service.registry import LoadedModel, load_model, read_index, resolve  # noqa: E402
from service.settings import Settings  # noqa: E402


def build(model: LoadedModel) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/predict", response_model=Prediction)
    def predict(stay: StayPayload) -> Prediction:
        prep = prepare(model.spec, [stay])
        if prep.problems:
            raise HTTPException(422, [p.model_dump() for p in prep.problems[0]])
        out = model.run(prep.inputs)
        return predictions(model.spec, prep, out)[0]

    return app


def load(model_dir: Path, task: str) -> LoadedModel:
    settings = Settings(model_dir=model_dir, device="cpu", workers=1)
    return load_model(resolve(model_dir, read_index(model_dir), task), task, settings)


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    args = ap.parse_args()
    uvicorn.run(build(load(args.model_dir, args.task)), host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
