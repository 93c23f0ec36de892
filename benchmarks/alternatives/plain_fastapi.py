"""The plain FastAPI + ONNX Runtime app a competent user would write: one ORT run per request.

    python benchmarks/alternatives/plain_fastapi.py --port 8001 --task mortality [--model-dir D]
        [--session default|tuned] [--workers N]

The stay is validated by the contract's pydantic model (`StayPayload`, a body parameter) and
tensorized by the contract's own code (`scehr.service.pipeline.prepare`, no explanation rows): the
preprocessing anyone serving this model must reproduce. Then one `session.run` at batch 1 and
the only output such an app returns, the calibrated risk per class: `{"risk": [...]}` as a
plain dict (no `response_model` to serialise). A sync predict route (blocking work: FastAPI
runs it in its thread pool) and an async `/health` (no thread hop). uvicorn with `--workers`.

`--session default` is `InferenceSession(path)` with ONNX Runtime's own defaults (all cores,
spinning threads); `--session tuned` uses scehr's session options
(`scehr.service.runtime.session_options`: cores // workers threads, no spinning).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # also in uvicorn's spawned workers

import onnxruntime as ort  # noqa: E402
from fastapi import FastAPI, HTTPException  # noqa: E402

from scehr.schemas.contract import GRAPH  # noqa: E402
from scehr.schemas.payloads import StayPayload  # noqa: E402
from scehr.service.batcher import ModelInputs, ModelOutputs  # noqa: E402
from scehr.service.model import ModelSpec, read_out  # noqa: E402
from scehr.service.model_store import read_index, resolve  # noqa: E402
from scehr.service.runtime import session_options  # noqa: E402
from scehr.service.settings import available_cores  # noqa: E402
from scehr.service.validation import check_graph, inspect  # noqa: E402

SESSIONS = ("default", "tuned")
_ENV = "PLAIN_FASTAPI_ARGS"  # model dir, task, session, workers: for uvicorn's workers


@dataclass
class Scorer:
    """A model's contract (features, calibration) and one ORT session on its graph."""

    spec: ModelSpec
    session: ort.InferenceSession
    input_names: list[str]

    def run(self, inputs: ModelInputs) -> ModelOutputs:
        feeds = {GRAPH.x.name: inputs.x, GRAPH.lengths.name: inputs.lengths}
        if GRAPH.static.name in self.input_names:
            feeds[GRAPH.static.name] = inputs.static
        return ModelOutputs(*self.session.run(list(GRAPH.output_names), feeds))

    def risks(self, out: ModelOutputs) -> list[list[float]]:
        """The calibrated risk per class of every row."""
        return read_out(self.spec, out).risk.tolist()


def load(model_dir: Path, task: str, session: str = "tuned", workers: int = 1) -> Scorer:
    if session not in SESSIONS:
        raise ValueError(f"session must be one of {SESSIONS}, not {session!r}")
    folder = resolve(model_dir, read_index(model_dir), task)
    manifest, sha = inspect(folder, task)
    onnx = str(folder / manifest.onnx.file)
    if session == "default":
        sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    else:
        threads = max(1, available_cores() // workers)
        sess = ort.InferenceSession(onnx, session_options(threads),
                                    providers=["CPUExecutionProvider"])
    names, fixed_t = check_graph(sess, manifest)
    return Scorer(ModelSpec.from_manifest(manifest, sha, fixed_t), sess, names)


def build(scorer: Scorer) -> FastAPI:
    from scehr.service.pipeline import prepare

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/predict")
    def predict(stay: StayPayload) -> dict[str, list[float]]:
        prep = prepare(scorer.spec, [stay])
        if prep.problems:
            raise HTTPException(422, [p.model_dump() for p in prep.problems[0]])
        return {"risk": scorer.risks(scorer.run(prep.inputs))[0]}

    return app


def app_from_env() -> FastAPI:
    """The app of one uvicorn worker, from the arguments `main` put in the environment."""
    model_dir, task, session, workers = os.environ[_ENV].split(os.pathsep)
    return build(load(Path(model_dir), task, session, int(workers)))


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    ap.add_argument("--session", choices=SESSIONS, default="tuned")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    os.environ[_ENV] = os.pathsep.join(
        [str(args.model_dir.resolve()), args.task, args.session, str(args.workers)])
    uvicorn.run("alternatives.plain_fastapi:app_from_env", factory=True, host="127.0.0.1",
                port=args.port, workers=args.workers, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
