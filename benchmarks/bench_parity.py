"""In-process pipeline vs the batch endpoint over loopback HTTP: same stays, one run each.

    .venv/bin/python benchmarks/bench_parity.py [--stays 1024] [--batch 64] [--task mortality]
        [--device cpu]

In-process = json.loads + per-stay pydantic validation + ingest/tensorize + ORT + read-outs
(the exact functions the route calls, without HTTP or response serialization). HTTP = the same
request bodies POSTed one after another to a real `scehr serve` process. Target: ratio >= 0.7.
Both paths must give the same predictions (every stay, field by field) or the script exits
non-zero; timings are only printed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time

from common import Conn, describe, dumps, loadavg, model_dir, post, server
from payloads import default_model_stays

from scehr.service.batcher import run_chunked
from scehr.service.pipeline import parse_stays, prepare
from scehr.service.registry import load_model, read_index, resolve
from scehr.service.responses import predictions
from scehr.service.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stays", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--task", default="mortality")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                    help="SCEHR_DEVICE of the server and of the in-process session")
    args = ap.parse_args()
    load = loadavg()
    models, which = model_dir()
    stays, _ = default_model_stays(args.task, args.stays, models, real=False)
    bodies = [dumps({"stays": stays[i : i + args.batch]})
              for i in range(0, len(stays), args.batch)]
    n_obs, n_stays = sum(len(s["observations"]) for s in stays) / len(stays), len(stays)
    # Only the encoded bodies stay alive: a million observation dicts kept in this process would
    # make every full garbage collection of the in-process path slow, and the server's heap has
    # no such thing.
    del stays
    gc.collect()

    settings = Settings(model_dir=models, device=args.device)
    folder = resolve(models, read_index(models), args.task)
    model = load_model(folder, args.task, settings)

    def in_process(body: bytes) -> list:
        parsed = parse_stays(json.loads(body)["stays"])
        good = [s for s in parsed if not isinstance(s, list)]
        prep = prepare(model.spec, good, max_observations=settings.max_observations)
        out = run_chunked(model.run, prep.inputs, settings.max_batch_size)
        preds = predictions(model.spec, prep, out)
        return [preds[i] for i in range(len(good))]

    in_process(bodies[0])  # warm
    t0 = time.perf_counter()
    for b in bodies:  # results dropped, as the server drops them once sent
        in_process(b)
    t_in = time.perf_counter() - t0
    local = [p for b in bodies for p in in_process(b)]  # again, untimed, to compare

    async def over_http(port: int) -> tuple[float, list[bytes]]:
        conn = await Conn.open(port)
        path = f"/predict/{args.task}/batch"
        status, _ = await conn.send(post(path, bodies[0]))  # warm
        assert status == 200
        replies = []
        t0 = time.perf_counter()
        for b in bodies:
            status, reply = await conn.send(post(path, b))
            assert status == 200
            replies.append(reply)
        conn.close()
        return time.perf_counter() - t0, replies

    with server(models, device=args.device) as srv:
        t_http, replies = asyncio.run(over_http(srv.port))

    remote = [item["prediction"] for r in replies for item in json.loads(r)["items"]]
    same = len(remote) == len(local) == n_stays and all(
        json.loads(p.model_dump_json()) == r for p, r in zip(local, remote, strict=True))

    rate_in, rate_http = n_stays / t_in, n_stays / t_http
    print(f"models: {which}; {describe(model)}; {os.cpu_count()} cores; "
          f"load average before: {load}")
    print(f"{n_stays} stays (~{n_obs:.0f} observations each) in {len(bodies)} requests of "
          f"{args.batch}; request body {len(bodies[0]) / 1e6:.2f} MB")
    print(f"in-process pipeline : {rate_in:8.1f} stays/s  ({t_in:.2f} s)")
    print(f"batch endpoint HTTP : {rate_http:8.1f} stays/s  ({t_http:.2f} s)")
    print(f"ratio HTTP / in-process = {rate_http / rate_in:.2f} (target >= 0.7)")
    print(f"predictions identical on both paths (every stay, every field): {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
