"""Where a FHIR request's time goes: the route's steps called in-process, stage by stage.

    .venv/bin/python benchmarks/fhir_stages.py [--repeats 30] [--bundle examples/fhir_bundle.json]

The steps of `POST /fhir/predict/mortality` without HTTP, threads or admission, on the default
mortality model: decoding the body with its size limits, the lean validation and reading of
the Bundle into a stay, tensorizing, the ONNX Runtime run, the read-outs at `explain=basic`
(the FHIR route's default), and building and serialising the RiskAssessment Bundle. Prints the
median ms of each over `--repeats` runs (after 5 warm-up runs) and the load average. Only
prints.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.interop.fhir_in import read_bundle  # noqa: E402
from service.interop.fhir_limits import FhirLimits  # noqa: E402
from service.interop.fhir_out import risk_bundle, to_json  # noqa: E402
from service.pipeline import predictions, prepare  # noqa: E402
from service.registry import load_model, read_index, resolve  # noqa: E402
from service.routes.fhir import _bundle  # noqa: E402
from service.settings import Settings  # noqa: E402

STAGES = ("decode + limits", "lean validation + reading", "tensorize", "ONNX Runtime",
          "read-outs", "response Bundle + JSON")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--bundle", type=Path, default=REPO / "examples" / "fhir_bundle.json")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    models = REPO / "models"
    settings = Settings(model_dir=models, device="cpu")
    m = load_model(resolve(models, read_index(models), "mortality"), "mortality", settings)
    raw = args.bundle.read_bytes()
    limits = FhirLimits(settings.max_observations)

    def once() -> list[float]:
        t = [time.perf_counter()]
        bundle = _bundle(raw, limits)
        t.append(time.perf_counter())
        stay = read_bundle(bundle, admission_time=None, end_hours=None,
                           variables=m.spec.fs.variables, full=False)
        t.append(time.perf_counter())
        prep = prepare(m.spec, [stay.payload])
        t.append(time.perf_counter())
        out = m.run(prep.inputs)
        t.append(time.perf_counter())
        pred = predictions(m.spec, prep, out)[0]
        t.append(time.perf_counter())
        to_json(risk_bundle(pred, m.spec.manifest, stay))
        t.append(time.perf_counter())
        return [(b - a) * 1e3 for a, b in itertools.pairwise(t)]

    for _ in range(5):
        once()
    med = np.median([once() for _ in range(args.repeats)], axis=0)
    print(f"{args.bundle.name}, model mortality {m.spec.manifest.version}, {args.repeats} runs; "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for name, ms in zip(STAGES, med, strict=True):
        print(f"  {name:28s} {ms:7.2f} ms")
    print(f"  {'total':28s} {med.sum():7.2f} ms")


if __name__ == "__main__":
    main()
