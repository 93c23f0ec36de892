"""The same model behind LitServe (needs the `bench` extra: litserve 0.2.19).

    python benchmarks/alternatives/litserve_app.py --port 8002 --task mortality [--model-dir D]
        [--max-batch-size 1] [--batch-timeout 0.0] [--session default|tuned] [--workers 1]

The defaults are LitServe 0.2.19's own (read from its source, `LitAPI.__init__` and
`LitServer.__init__`): max_batch_size 1 (no batching), batch_timeout 0.0, one inference worker
per device, as many API server processes as inference workers; with ONNX Runtime's default
session. `decode_request` validates and tensorizes one stay (`StayPayload`,
`scehr.service.pipeline.prepare`), `predict` is one ORT run (with batching on: `batch` pads and
concatenates, `scehr.service.batcher.batch`), `encode_response` returns only the calibrated risk per
class, `{"risk": [...]}`, like the plain FastAPI app.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # also in LitServe's spawned workers

import litserve as ls  # noqa: E402
from fastapi import Request, Response  # noqa: E402

from alternatives.plain_fastapi import SESSIONS, Scorer, load  # noqa: E402
from scehr.schemas.payloads import StayPayload  # noqa: E402
from scehr.service.batcher import ModelOutputs, batch, unbatch  # noqa: E402
from scehr.service.pipeline import PreparedStays, prepare  # noqa: E402

Scored = tuple[PreparedStays, ModelOutputs]


class ScehrAPI(ls.LitAPI):  # type: ignore[misc]
    def __init__(self, model_dir: Path, task: str, session: str = "default", workers: int = 1,
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.model_dir, self.task, self.session, self.workers = model_dir, task, session, workers

    def setup(self, device: str) -> None:
        self.scorer: Scorer = load(self.model_dir, self.task, self.session, self.workers)

    # LitServe reads the annotation: `Request` makes it parse the body as JSON and pass the dict
    def decode_request(self, request: Request) -> PreparedStays:
        prep = prepare(self.scorer.spec, [StayPayload.model_validate(request)])
        if prep.problems:
            raise ValueError("invalid stay")
        return prep

    def batch(self, preps: list[PreparedStays]) -> tuple[list[PreparedStays], Any]:
        return preps, batch([p.inputs for p in preps])

    def predict(self, x: PreparedStays | tuple[list[PreparedStays], Any]
                ) -> Scored | list[Scored]:
        if isinstance(x, PreparedStays):  # max_batch_size 1: LitServe calls no batch/unbatch
            return x, self.scorer.run(x.inputs)
        preps, joined = x
        outs = unbatch(self.scorer.run(joined), [p.inputs.rows for p in preps])
        return list(zip(preps, outs, strict=True))

    def unbatch(self, output: list[Scored]) -> list[Scored]:
        return output

    def encode_response(self, output: Scored) -> Response:  # type: ignore[override]
        # (annotated `Response` so LitServe adds no response model; it returns the dict as JSON)
        return {"risk": self.scorer.risks(output[1])[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    ap.add_argument("--max-batch-size", type=int, default=1)
    ap.add_argument("--batch-timeout", type=float, default=0.0)
    ap.add_argument("--session", choices=SESSIONS, default="default")
    ap.add_argument("--workers", type=int, default=1, help="inference workers (per device)")
    args = ap.parse_args()
    api = ScehrAPI(args.model_dir, args.task, args.session, args.workers,
                   max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers)
    server.run(port=args.port, host="127.0.0.1", generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main()
