"""Raw ORT against served figures on one device (the CUDA mode of the serving benchmarks).

    .venv/bin/python benchmarks/bench_device.py --device cuda [--task mortality]
        [--batches 1 8 32 128 256] [--clients 64] [--seconds 6] [--io-binding auto]

In process: for each batch size, the median time of a plain `session.run` and of the served
ORT path (`LoadedModel.run`: on CUDA the reused I/O binding with pinned staging buffers and
power-of-two padding of `service/device_io.py`), with rows per second and the largest output
difference between the two (must be below 1e-6). Served: `scehr serve --device DEVICE`,
single-stay p50 over sequential requests and throughput with `--clients` concurrent clients.
The model is loaded with `SCEHR_DEVICE=DEVICE` and exits non-zero if it did not get the
provider asked for. On CPU (`--device cpu --io-binding on`) it runs the same code paths, which
is how it is tested without a GPU; on a GPU it verifies the GPU serving path.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np
from bench_batcher import load
from common import describe, dumps, loadavg, model_dir, pct, server
from compare_servers import single_client
from payloads import default_model_stays

from scehr.schemas.contract import GRAPH
from scehr.schemas.payloads import StayPayload
from scehr.service.batcher import ModelInputs
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.runtime import CPU, CUDA
from scehr.service.settings import Settings


def timed(run: object, reps: int) -> float:
    """Median seconds of `run()` over `reps` calls after 3 warm-up calls."""
    for _ in range(3):
        run()  # type: ignore[operator]
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()  # type: ignore[operator]
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--io-binding", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--single", type=int, default=300)
    args = ap.parse_args()
    load_before = loadavg()
    models, which = model_dir()
    m = load_model(resolve(models, read_index(models), args.task), args.task,
                   Settings(model_dir=models, device=args.device, io_binding=args.io_binding))
    want = CUDA if args.device == "cuda" else CPU
    if m.provider != want:
        raise SystemExit(f"asked for {want}, the session got {m.provider}")
    stays, what = default_model_stays(args.task, max(args.batches), models)
    inputs = prepare(m.spec, [StayPayload.model_validate(s) for s in stays]).inputs
    assert inputs is not None
    print(f"models: {which}; {describe(m)}; {what}; io binding: {m.io_binding} (pinned: "
          f"{m.bound.pinned if m.bound else False}); max rows per run {m.max_batch_size}; "
          f"{os.cpu_count()} cores; load average before: {load_before}")
    print(f"{'rows':>5} {'raw run ms':>11} {'served run ms':>14} {'raw rows/s':>11} "
          f"{'served rows/s':>14} {'max |diff|':>11}")
    worst = 0.0
    names = list(GRAPH.output_names)
    for n in args.batches:
        part = ModelInputs(inputs.x[:n], inputs.lengths[:n],
                           None if inputs.static is None else inputs.static[:n])
        feeds = m.feeds(part)
        raw = timed(lambda f=feeds: m.session.run(names, f), args.reps)
        served = timed(lambda p=part: m.run(p), args.reps)
        a, b = m.session.run(names, feeds)[2], m.run(part).probability
        diff = float(np.abs(a - b).max())
        worst = max(worst, diff)
        print(f"{n:5d} {raw * 1e3:11.3f} {served * 1e3:14.3f} {n / raw:11,.0f} "
              f"{n / served:14,.0f} {diff:11.2e}")
    bodies = [dumps(s) for s in stays[:200]]
    path = f"/predict/{args.task}?explain=basic"
    with server(models, device=args.device, io_binding=args.io_binding) as srv:
        lat1 = asyncio.run(single_client(srv.port, bodies, path, args.single))
        asyncio.run(load(srv.port, bodies, args.clients, 1.0, path))  # warm-up under load
        lat, errors, wall, _ = asyncio.run(load(srv.port, bodies, args.clients, args.seconds,
                                                path))
    print(f"served over HTTP ({args.device}): single-stay p50 {pct(lat1, 50) * 1e3:.2f} ms, "
          f"p99 {pct(lat1, 99) * 1e3:.2f} ms; {args.clients} clients: {len(lat) / wall:,.0f} "
          f"stays/s, p99 {pct(lat, 99) * 1e3:.1f} ms, errors {errors}")
    print(f"load average after: {loadavg()}")
    if worst > 1e-6:
        raise SystemExit(f"served and raw outputs differ by {worst:.2e} (> 1e-6)")


if __name__ == "__main__":
    main()
