"""An earlier revision's whole scoring route against this checkout's, request by request, in
one process: `POST /predict/mortality` (the default request: explain=basic, the example stay)
and `POST /fhir/predict/mortality` (the example Bundle).

    .venv/bin/python benchmarks/route_ab.py --before main [--requests 300] [--passes 3]
        [--real 200] [--log-level INFO 2>/dev/null]

Both apps run in this process, each behind `httpx.ASGITransport` (no sockets), with their
lifespans and middleware, ORT at one intra-op thread. The revision's `schemas/` and `service/`
are copied as the package `oldscehr` (their imports rewritten) so both load side by side;
the two alternate per request (which goes first alternates too), so a busy neighbour slows
both alike. Per request: the CPU time of the whole process (every thread: the event loop's,
the worker threads a heavy request uses, ORT's) and of the event loop's thread alone. The JSON
answers must be the same bytes from both, the FHIR ones the same risks (else exit 1).
Medians per route and the median of the paired differences. `--real N`: the JSON route is
sent N real set-C stays of the default model's data as LOINC-coded long form
(`payloads.default_model_stays`, the bodies `compare_servers.py` sends) in turn, instead of the
example stay. `--log-level INFO`: both apps write their access and audit lines, as a server
does (send stderr to /dev/null). Only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import REPO, dumps
from payloads import default_model_stays

ROUTES = {
    "POST /predict/mortality": ("/predict/mortality", REPO / "examples" / "mortality_stay.json",
                                "application/json"),
    "POST /fhir/predict/mortality": ("/fhir/predict/mortality",
                                     REPO / "examples" / "fhir_bundle.json",
                                     "application/fhir+json"),
}


def checkout(rev: str) -> Path:
    """The revision's schemas/ and service/ in a temporary folder."""
    archive = subprocess.run(["git", "archive", rev, "schemas", "service"], cwd=REPO,
                             check=True, capture_output=True).stdout
    root = Path(tempfile.mkdtemp(prefix="scehr-route-ab-src-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


#: The revision's imports of its own packages (namespaced, or from before the namespace).
_OURS = re.compile(r"\bscehr\.(service|schemas)\b|\b(from|import) (service|schemas)\b")


def _renamed(m: re.Match[str]) -> str:
    if m.group(1):
        return f"oldscehr.{m.group(1)}"
    return f"{m.group(2)} oldscehr.{m.group(3)}"


def renamed_copy(source: Path, into: Path) -> None:
    """`source`'s schemas/ and service/ as the package oldscehr under `into`."""
    package = into / "oldscehr"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("schemas", "service"):
        shutil.copytree(source / name, package / name)
    for f in package.rglob("*.py"):
        f.write_text(_OURS.sub(_renamed, f.read_text()))


def app_of(package: str, models: Path, log_level: str = "WARNING") -> Any:
    app_module = importlib.import_module(f"{package}.service.app")
    settings = importlib.import_module(f"{package}.service.settings")
    return app_module.create_app(settings.Settings(
        model_dir=models, device="cpu", intra_op_threads=1, log_level=log_level))


def bodies_of(args: argparse.Namespace) -> tuple[dict[str, list[bytes]], str]:
    """Each route's bodies, sent in turn: its example, or (`--real`) real LOINC-coded stays
    for the JSON route."""
    out = {name: [body_path.read_bytes()] for name, (_, body_path, _) in ROUTES.items()}
    about = "the examples"
    if args.real:
        stays, about = default_model_stays("mortality", args.real, REPO / "models", form="loinc")
        out["POST /predict/mortality"] = [dumps(s) for s in stays]
    return out, about


def risks(answer: httpx.Response) -> list[float]:
    """The FHIR answer's risks (its ids and timestamps differ per request)."""
    return [e["resource"]["prediction"][0]["probabilityDecimal"]
            for e in answer.json().get("entry", [])
            if e["resource"]["resourceType"] == "RiskAssessment"]


async def run(args: argparse.Namespace, apps: dict[str, Any], bodies: dict[str, list[bytes]]
              ) -> dict[str, dict[str, list]]:
    times: dict[str, dict[str, list]] = {r: {f"{v} {k}": [] for v in apps
                                             for k in ("process", "loop")} for r in ROUTES}
    async with apps["old"].router.lifespan_context(apps["old"]), \
            apps["new"].router.lifespan_context(apps["new"]):
        clients = {v: httpx.AsyncClient(transport=httpx.ASGITransport(app=a),
                                        base_url="http://ab") for v, a in apps.items()}
        for c in clients.values():
            while (await c.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.1)
        for name, (url, _, media) in ROUTES.items():
            sent = bodies[name]
            headers = {v: {"content-type": media} for v in clients}
            if args.new_response_version:  # the shape the old revision answers in
                headers["new"]["x-scehr-response-version"] = args.new_response_version
            for v, c in clients.items():  # warm-up
                for body in sent[:20] * (20 // len(sent[:20])):
                    assert (await c.post(url, content=body, headers=headers[v])).status_code == 200
            gc.collect()
            for p in range(args.passes):
                for i in range(args.requests):
                    body = sent[i % len(sent)]
                    order = ["old", "new"] if (i + p) % 2 else ["new", "old"]
                    answers = {}
                    for v in order:
                        p0, t0 = time.process_time(), time.thread_time()
                        r = await clients[v].post(url, content=body, headers=headers[v])
                        t1, p1 = time.thread_time(), time.process_time()
                        assert r.status_code == 200, r.text[:300]
                        times[name][f"{v} process"].append(p1 - p0)
                        times[name][f"{v} loop"].append(t1 - t0)
                        answers[v] = r.content if "fhir" not in url else risks(r)
                    if answers["old"] != answers["new"]:
                        sys.exit(f"{name}, request {i}: the two revisions answer differently")
        for c in clients.values():
            await c.aclose()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--requests", type=int, default=300, help="requests per route and pass")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--real", type=int, default=0, metavar="N",
                    help="send the JSON route N real set-C stays as LOINC-coded long form")
    ap.add_argument("--log-level", default="WARNING", choices=["WARNING", "INFO"],
                    help="INFO: the access and audit lines are written, as by a server")
    ap.add_argument("--new-response-version", default=None, metavar="V",
                    help="ask this checkout for response version V (X-Scehr-Response-Version), "
                    "e.g. 1.1 against a revision from before response 1.2, so that the answers "
                    "can be compared byte for byte")
    args = ap.parse_args()
    models = REPO / "models"
    src, tmp = checkout(args.before), Path(tempfile.mkdtemp(prefix="scehr-route-ab-"))
    try:
        renamed_copy(src, tmp)
        sys.path.insert(0, str(tmp))
        apps = {v: app_of(package, models, args.log_level)
                for v, package in (("old", "oldscehr"), ("new", "scehr"))}
        bodies, about = bodies_of(args)
        load_before = os.getloadavg()
        times = asyncio.run(run(args, apps, bodies))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
    print(f"{args.passes} passes of {args.requests} requests per route, old ({args.before}) and "
          f"new (this checkout) alternated per request; bodies: {about}; log level "
          f"{args.log_level}; same answers; load average "
          f"{load_before} before, {os.getloadavg()} after")
    print("| route | CPU | old ms | new ms | new - old (median of pairs) | new / old |")
    print("|---|---|---|---|---|---|")
    for name, t in times.items():
        for kind in ("process", "loop"):
            old, new = np.array(t[f"old {kind}"]), np.array(t[f"new {kind}"])
            print(f"| {name} | {kind} | {np.median(old) * 1e3:.3f} | "
                  f"{np.median(new) * 1e3:.3f} | {np.median(new - old) * 1e3:+.3f} | "
                  f"{np.median(new) / np.median(old):.3f} |")


if __name__ == "__main__":
    main()
