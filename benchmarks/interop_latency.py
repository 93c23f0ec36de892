"""What each interface costs on top of the model: one stay, sequential, in-process (no HTTP).

    .venv/bin/python benchmarks/interop_latency.py [--repeats 30] [--real 50 --calls 5]

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
(<= 2x) and the median of the per-round ratios (each round calls every route once, so it is
less sensitive to other jobs), and the load average before and after.

`--real N` then sends the first N real test stays of the default model's converted data
(`benchmarks/payloads.py`; skipped, and said so, when `data/` lacks it) both ways, `--calls`
times each, interleaved: as a long-form JSON stay and as the FHIR Bundle a hospital would send
of the same observations (`tests/service/fhir_writer.py`: LOINC codes, UCUM units, blood-pressure
panels, the ICU unit as a Location and ventilation as Procedures), and prints the distribution
over stays of each stay's FHIR / JSON ratio of medians, the Bundle's size, and the largest
difference between the two routes' risks (0 when both read the same stay). Only prints.
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

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from scehr.service.gc_pauses import tune_collector  # noqa: E402
from scehr.service.settings import Settings  # noqa: E402
from tests.service.conftest import serve  # noqa: E402
from tests.service.fhir_writer import bundle_of_stay, long_from_wide  # noqa: E402

#: Target of the FHIR route's latency over the JSON route's, for the same stay.
TARGET = 2.0

JSON = "JSON  POST /predict/mortality (basic)"
FHIR = "FHIR  POST /fhir/predict/mortality"


def risks(route: str, answer: bytes) -> list[float]:
    """The risks of an answer of the JSON or the FHIR route."""
    doc = json.loads(answer)
    if route == "fhir":
        return [e["resource"]["prediction"][0]["probabilityDecimal"] for e in doc["entry"]
                if e["resource"]["resourceType"] == "RiskAssessment"]
    return [r["risk"] for r in doc["results"]]


async def real(client: httpx.AsyncClient, n: int, per_stay: int) -> list[str]:
    """Each of `n` real stays sent as JSON and as FHIR, `per_stay` times, interleaved: the
    lines to print."""
    from payloads import real_stays

    found = real_stays("mortality", n, REPO / "models")
    if found is None:
        return ["real stays: the converted data is not under data/ (docs/data.md); skipped"]
    stays, what = found
    ratios, sizes, diffs = [], [], []
    load_before = os.getloadavg()[0]
    for wide in stays:
        stay = long_from_wide(wide)
        calls = [("json", "/predict/mortality?explain=basic", json.dumps(stay).encode()),
                 ("fhir", "/fhir/predict/mortality", json.dumps(bundle_of_stay(stay)).encode())]
        times: dict[str, list[float]] = {"json": [], "fhir": []}
        answers = {}
        for _ in range(per_stay):
            for route, path, content in calls:
                t0 = time.perf_counter()
                r = await client.post(path, content=content,
                                      headers={"content-type": "application/json"})
                times[route].append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                answers[route] = r.content
        ratios.append(statistics.median(times["fhir"]) / statistics.median(times["json"]))
        sizes.append(len(calls[1][2]) / 1e3)
        diffs.append(max((abs(a - b) for a, b in zip(  # none: both abstain (data minimum)
            risks("json", answers["json"]), risks("fhir", answers["fhir"]), strict=True)),
            default=0.0))
    q = statistics.quantiles(ratios, n=10, method="inclusive")
    return [f"{what}, sent as long-form JSON and as FHIR Bundles "
            f"({statistics.median(sizes):.0f} kB median), {per_stay} calls each; load average "
            f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
            f"FHIR / JSON per stay (medians): median {statistics.median(ratios):.2f}x, "
            f"p10 {q[0]:.2f}x, p90 {q[-1]:.2f}x, max {max(ratios):.2f}x (target <= "
            f"{TARGET:g}x: {'met' if statistics.median(ratios) <= TARGET else 'missed'}); "
            f"largest risk difference between the routes {max(diffs):.1e}"]


async def main(repeats: int, n_real: int, per_stay: int) -> None:
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
        real_lines = await real(client, n_real, per_stay) if n_real else []
    print(f"{observations} Observations, {repeats} calls each, load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    paired = statistics.median(f / j for f, j in zip(times[FHIR], times[JSON], strict=True))
    for name, ts in times.items():
        ts = sorted(ts)
        print(f"{name:45s} median {statistics.median(ts):7.1f} ms   "
              f"p90 {ts[int(0.9 * (len(ts) - 1))]:7.1f} ms")
    ratio = statistics.median(times[FHIR]) / statistics.median(times[JSON])
    print(f"FHIR / JSON at explain=basic (medians): {ratio:.2f}x (target <= {TARGET:g}x: "
          f"{'met' if ratio <= TARGET else 'missed'}); median of the per-round ratios: "
          f"{paired:.2f}x; with full validation: "
          f"{statistics.median(times[full_name]) / statistics.median(times[JSON]):.1f}x")
    print(*real_lines, sep="\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--real", type=int, default=0, metavar="N",
                    help="also N real test stays, each as JSON and as FHIR (default: none)")
    ap.add_argument("--calls", type=int, default=5, help="calls of each route per real stay")
    args = ap.parse_args()
    asyncio.run(main(args.repeats, args.real, args.calls))
