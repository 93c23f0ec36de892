"""What each interface costs on top of the model: one stay, sequential, in-process (no HTTP).

    .venv/bin/python benchmarks/interop_latency.py [--repeats 30]

Serves the shipped models (models/) through the app with httpx's ASGI transport and times
`POST /predict/mortality?explain=basic` (JSON), `/fhir/predict/mortality` (the same stay as a
FHIR Bundle: examples/fhir_bundle.json; explain=basic, its default), `/cds-services/
scehr-mortality` (the CDS Hooks example; it scores with explain=full) and
`/v2/models/mortality/infer` (the JSON stay as a BYTES tensor), the FHIR route again on a second
app with `fhir_validation="full"` (every element validated by `fhir.resources`), and, for
reference, the JSON route at explain=top. Each body is encoded once beforehand (the client's
JSON encoding is not the interface's cost) and the collector is tuned as in a served worker
(`scehr.service.gc_pauses.tune_collector`). Prints the median and the 90th percentile in ms, side
by side in one run, the FHIR / JSON ratio of medians (both at explain=basic) beside its target
(<= 3x) and the median of the per-round ratios (each round calls every route once, so it is
less sensitive to other jobs), and the load average before and after. Only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scehr.service.gc_pauses import tune_collector  # noqa: E402
from scehr.service.settings import Settings  # noqa: E402
from tests.service.conftest import serve  # noqa: E402

JSON = "JSON  POST /predict/mortality (basic)"
FHIR = "FHIR  POST /fhir/predict/mortality"


async def main(repeats: int) -> None:
    stay = json.loads((REPO / "examples" / "mortality_stay.json").read_text())
    stay["observations"] = [o for o in stay["observations"]
                            if o["variable"] != "capillary_refill_rate"]
    fhir = json.loads((REPO / "examples" / "fhir_bundle.json").read_text())
    cds = json.loads((REPO / "examples" / "cds_hooks_request.json").read_text())
    v2 = {"inputs": [{"name": "stay", "shape": [1], "datatype": "BYTES",
                      "data": [json.dumps(stay)]}], "outputs": [{"name": "risk"}]}
    calls = {
        JSON: ("/predict/mortality?explain=basic", stay),
        "JSON  POST /predict/mortality (top)": ("/predict/mortality?explain=top", stay),
        FHIR: ("/fhir/predict/mortality", fhir),
        "CDS   POST /cds-services/scehr-mortality": ("/cds-services/scehr-mortality", cds),
        "V2    POST /v2/models/mortality/infer": ("/v2/models/mortality/infer", v2),
    }
    full_name = "FHIR  POST /fhir/predict/mortality (full)"
    observations = sum(e["resource"]["resourceType"] == "Observation" for e in fhir["entry"])
    load_before = os.getloadavg()[0]
    settings = Settings(model_dir=REPO / "models", device="cpu", log_level="WARNING")
    async with serve(settings) as client, \
            serve(settings.model_copy(update={"fhir_validation": "full"})) as full:
        tune_collector()
        times: dict[str, list[float]] = {k: [] for k in [*calls, full_name]}
        encoded = [(name, path, json.dumps(body).encode())
                   for name, (path, body) in [*calls.items(), (full_name, calls[FHIR])]]
        for _ in range(repeats):  # interleaved, so load changes hit every interface alike
            for name, path, content in encoded:
                t0 = time.perf_counter()
                r = await (full if name == full_name else client).post(
                    path, content=content, headers={"content-type": "application/json"})
                times[name].append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200, r.text
    print(f"{observations} Observations, {repeats} calls each, load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    paired = statistics.median(f / j for f, j in zip(times[FHIR], times[JSON], strict=True))
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"{name:45s} median {statistics.median(ts):7.1f} ms   "
              f"p90 {ts[int(0.9 * (len(ts) - 1))]:7.1f} ms")
    ratio = statistics.median(times[FHIR]) / statistics.median(times[JSON])
    print(f"FHIR / JSON at explain=basic (medians): {ratio:.1f}x (target <= 3x: "
          f"{'met' if ratio <= 3 else 'missed'}); median of the per-round ratios: "
          f"{paired:.1f}x; with full validation: "
          f"{statistics.median(times[full_name]) / statistics.median(times[JSON]):.1f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=30)
    asyncio.run(main(ap.parse_args().repeats))
