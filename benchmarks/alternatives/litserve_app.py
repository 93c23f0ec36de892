"""The same model behind LitServe with dynamic batching (needs the `bench` extra: litserve).

    python benchmarks/alternatives/litserve_app.py --port 8002 --task mortality [--model-dir D]

Identical preprocessing and read-outs to scehr: `decode_request` validates and tensorizes one
stay (`service.pipeline.prepare`), `batch` pads and concatenates (`service.batcher.batch`),
`predict` is one ORT run, `encode_response` builds the Prediction (`predictions`). LitServe's
defaults otherwise: one inference worker on the CPU, max batch 32, a 2 ms batch timeout.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # also in LitServe's spawned workers

import litserve as ls  # noqa: E402
from fastapi import Request, Response  # noqa: E402

from schemas.payloads import StayPayload  # noqa: E402
from service.batcher import ModelOutputs, batch, unbatch  # noqa: E402
from service.pipeline import PreparedStays, predictions, prepare  # noqa: E402


class ScehrAPI(ls.LitAPI):  # type: ignore[misc]
    def __init__(self, model_dir: Path, task: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.model_dir, self.task = model_dir, task

    def setup(self, device: str) -> None:
        from alternatives.plain_fastapi import load

        self.model = load(self.model_dir, self.task)

    # LitServe reads the annotation: `Request` makes it parse the body as JSON and pass the dict
    def decode_request(self, request: Request) -> PreparedStays:
        prep = prepare(self.model.spec, [StayPayload.model_validate(request)])
        if prep.problems:
            raise ValueError("invalid stay")
        return prep

    def batch(self, preps: list[PreparedStays]) -> tuple[list[PreparedStays], Any]:
        return preps, batch([p.inputs for p in preps])

    def predict(self, x: tuple[list[PreparedStays], Any]
                ) -> list[tuple[PreparedStays, ModelOutputs]]:
        preps, joined = x
        outs = unbatch(self.model.run(joined), [p.inputs.rows for p in preps])
        return list(zip(preps, outs, strict=True))

    def unbatch(self, output: list[tuple[PreparedStays, ModelOutputs]]) -> list[Any]:
        return output

    def encode_response(self, output: tuple[PreparedStays, ModelOutputs]) -> Response:  # type: ignore[override]
        # (annotated `Response` so LitServe adds no response model; it returns the dict as JSON)
        prep, out = output
        return predictions(self.model.spec, prep, out)[0].model_dump(mode="json")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--model-dir", type=Path, default=REPO / "models")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--batch-timeout", type=float, default=0.002)
    args = ap.parse_args()
    api = ScehrAPI(args.model_dir, args.task, max_batch_size=args.max_batch_size,
                   batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(port=args.port, host="127.0.0.1", generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main()
