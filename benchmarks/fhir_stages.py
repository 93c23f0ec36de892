"""Where a FHIR request's time goes: the route's steps called in-process, stage by stage.

    .venv/bin/python benchmarks/fhir_stages.py [--repeats 30] [--bundle examples/fhir_bundle.json]
        [--real K]

The steps of `POST /fhir/predict/mortality` without HTTP, threads or admission, on the default
mortality model: decoding the body with its size limits, the lean validation and reading of
the Bundle into a stay, tensorizing, the ONNX Runtime run, the read-outs at `explain=basic`
(the FHIR route's default), and building and serialising the RiskAssessment Bundle, on
`--bundle` or (`--real K`) the Bundle of the K-th real set-C stay as `interop_latency.py --real`
sends it. Prints the median ms of each over `--repeats` runs (after 5 warm-up runs): wall time,
and the CPU time of the calling thread (less sensitive to other jobs on the machine; ONNX
Runtime computes in threads of its own, so its CPU column is only the call's overhead), with the
load average.
Only prints.
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
sys.path.insert(0, str(REPO / "benchmarks"))

from scehr.service.interfaces.fhir import read_body  # noqa: E402
from scehr.service.interop.fhir_in import read_bundle  # noqa: E402
from scehr.service.interop.fhir_limits import FhirLimits  # noqa: E402
from scehr.service.interop.fhir_out import risk_bundle, to_json  # noqa: E402
from scehr.service.pipeline import prepare  # noqa: E402
from scehr.service.registry import load_model, read_index, resolve  # noqa: E402
from scehr.service.responses import predictions  # noqa: E402
from scehr.service.settings import Settings  # noqa: E402

STAGES = ("decode + limits", "lean validation + reading", "tensorize", "ONNX Runtime",
          "read-outs", "response Bundle + JSON")


def body_of(bundle: Path, k: int) -> tuple[bytes, str]:
    """The body timed and its name: the K-th real stay's Bundle when `k`, else `bundle`."""
    if not k:
        return bundle.read_bytes(), bundle.name
    from payloads import real_bundle

    found = real_bundle(k, REPO / "models")
    if found is None:
        sys.exit("--real: the converted data is not under data/ (docs/data.md)")
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--bundle", type=Path, default=REPO / "examples" / "fhir_bundle.json")
    ap.add_argument("--real", type=int, default=0, metavar="K",
                    help="the K-th real set-C stay's Bundle instead of --bundle")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    models = REPO / "models"
    settings = Settings(model_dir=models, device="cpu")
    m = load_model(resolve(models, read_index(models), "mortality"), "mortality", settings)
    raw, name = body_of(args.bundle, args.real)
    limits = FhirLimits(settings.max_observations)

    def now() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def once() -> list[tuple[float, float]]:
        t = [now()]
        bundle = read_body(raw, limits)
        t.append(now())
        stay = read_bundle(bundle, admission_time=None, end_hours=None,
                           variables=m.spec.fs.variables, full=False)
        t.append(now())
        prep = prepare(m.spec, [stay.payload])
        t.append(now())
        out = m.run(prep.inputs)
        t.append(now())
        pred = predictions(m.spec, prep, out)[0]
        t.append(now())
        to_json(risk_bundle(pred, m.spec.manifest, stay))
        t.append(now())
        return [((b[0] - a[0]) * 1e3, (b[1] - a[1]) * 1e3) for a, b in itertools.pairwise(t)]

    for _ in range(5):
        once()
    med = np.median([once() for _ in range(args.repeats)], axis=0)
    print(f"{name}, model mortality {m.spec.manifest.version}, {args.repeats} runs; "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"  {'median per stage':28s} {'wall':>7s}    {'CPU':>7s}")
    for name, (wall, cpu) in zip(STAGES, med, strict=True):
        print(f"  {name:28s} {wall:7.2f} ms {cpu:7.2f} ms")
    print(f"  {'total':28s} {med[:, 0].sum():7.2f} ms {med[:, 1].sum():7.2f} ms")

if __name__ == "__main__":
    main()
