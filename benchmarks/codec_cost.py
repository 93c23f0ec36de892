"""CPU per body byte of each codec's `decode`, relative to the JSON stay's: the `byte_cost`
the offload rule weighs a body by (`scehr.service.offload.heavy`, `Codec.byte_cost`).

    .venv/bin/python benchmarks/codec_cost.py [--repeats 50]

The example stay (`examples/mortality_stay.json`) through the JSON codec, the example
Bundle (`examples/fhir_bundle.json`) through the FHIR codec with lean and with full
validation; thread CPU, medians. Only prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from common import REPO

from scehr.service.interfaces.fhir import Fhir
from scehr.service.interfaces.json_single import JsonSingle
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.settings import Settings


def cpu_ns_per_byte(decode: Callable[[Any], Any], call: Any, repeats: int) -> float:
    decode(call)
    times = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        decode(call)
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / len(call.raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    models = REPO / "models"
    m = load_model(resolve(models, read_index(models), "mortality"), "mortality",
                   Settings(model_dir=models, device="cpu"))
    handle = SimpleNamespace(model=m)
    rows = []

    def call(path: str, **settings: Any) -> SimpleNamespace:
        return SimpleNamespace(raw=(REPO / path).read_bytes(), handle=handle, spec=m.spec,
                               settings=Settings(model_dir=models, **settings),
                               values={"admission_time": None, "end_hours": None})

    json_call = call("examples/mortality_stay.json")
    base = cpu_ns_per_byte(JsonSingle("mortality").decode, json_call, args.repeats)
    rows.append(("JSON single (example stay)", len(json_call.raw), base))
    for mode in ("lean", "full"):
        c = call("examples/fhir_bundle.json", fhir_validation=mode)
        rows.append((f"FHIR, {mode} validation (example Bundle)", len(c.raw),
                     cpu_ns_per_byte(Fhir().decode, c, max(5, args.repeats // 5))))
    print(f"decode CPU per byte, medians; load average {os.getloadavg()}")
    print("| codec | body bytes | ns per byte | relative to JSON |")
    print("|---|---|---|---|")
    for name, size, ns in rows:
        print(f"| {name} | {size} | {ns:.1f} | {ns / base:.1f} |")


if __name__ == "__main__":
    main()
