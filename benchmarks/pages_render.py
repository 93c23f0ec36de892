"""How long the facts page of the default mortality model takes to render, and what each page
under /ui/ weighs.

    .venv/bin/python benchmarks/pages_render.py [--repeats 30] [--servers 3]
    .venv/bin/python benchmarks/pages_render.py --repeats 2 --servers 1   # a smoke run

Render time of `GET /ui/models/mortality/{default version}`, in ms:
- in process (`fastapi.testclient.TestClient`, no sockets): the first request of the process
  (templates compiled, facts built and rendered), then with a cold cache (the rendered pages
  dropped before each request: facts built and rendered again) and warm (the kept page);
- through a real server (`scehr serve`, one worker, HTTP on loopback): the first request after
  the server is ready (a cold cache; one per server started) and warm requests after it.
Weight, in kB: each page's HTML, and with the style sheet, script and icon it loads (the stay
page's answer to the example stay counted with the stay page). The target: a first render of
the facts page <= 200 ms, every page <= 300 kB.

Prints the load average first and last: a busy machine makes every time longer, so figures
count only from a quiet one. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from common import REPO, loadavg, real_models, server

STAY = REPO / "examples" / "mortality_stay.json"
STATIC = {"pages.css": "every page", "favicon.svg": "every page", "stay.js": "the stay page"}


def settings() -> Any:
    from scehr.service.settings import Settings

    return Settings(model_dir=real_models(), device="cpu", tasks="mortality",
                    log_level="WARNING")


def timed_get(client: Any, path: str) -> float:
    """Milliseconds of one GET (200 expected)."""
    start = time.perf_counter()
    r = client.get(path)
    ms = (time.perf_counter() - start) * 1000
    assert r.status_code == 200, (path, r.status_code, r.text[:200])
    return ms


def wait_ready(client: Any) -> None:
    deadline = time.monotonic() + 120
    while client.get("/readyz").status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit("the model did not load")
        time.sleep(0.05)


def summary(xs: list[float]) -> str:
    return (f"median {statistics.median(xs):7.2f} ms, min {min(xs):7.2f}, max {max(xs):7.2f} "
            f"({len(xs)} requests)")


def in_process(repeats: int) -> tuple[str, list[str]]:
    """The facts page's times behind TestClient, and every page's weight."""
    from fastapi.testclient import TestClient

    from scehr.service.app import create_app

    app = create_app(settings())
    with TestClient(app) as c:
        wait_ready(c)
        version = c.get("/models/mortality").json()["version"]
        facts = f"/ui/models/mortality/{version}"
        first = timed_get(c, facts)
        cold = []
        for _ in range(repeats):
            app.state.facts_cache = None  # the rendered pages dropped: built again
            cold.append(timed_get(c, facts))
        warm = [timed_get(c, facts) for _ in range(repeats)]
        lines = [f"facts page of mortality {version}, in process (TestClient):",
                 f"  first request of the process: {first:7.2f} ms",
                 f"  cold cache: {summary(cold)}", f"  warm:       {summary(warm)}"]
        return facts, [*lines, *weights(c, facts)]


def weights(c: Any, facts: str) -> list[str]:
    """Each page's HTML in kB, and with what it loads."""
    static = {name: len(c.get(f"/ui/static/{name}").content) for name in STATIC}
    common = static["pages.css"] + static["favicon.svg"]
    answer = c.post("/ui/stay/mortality", content=STAY.read_bytes(),
                    headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text[:200]
    pages = {"/ui/": 0, facts: 0, "/ui/stay": static["stay.js"] + len(answer.content),
             "/ui/monitoring": 0}
    lines = ["page weight (kB): HTML, and with the style sheet, icon, script and answer it loads"]
    for path, extra in pages.items():
        html = len(c.get(path).content)
        note = " (+ stay.js and the example stay's answer)" if extra else ""
        lines.append(f"  {path:32s} {html / 1000:7.1f} {(html + common + extra) / 1000:7.1f}"
                     f"{note}")
    return lines


def through_server(facts: str, repeats: int, servers: int) -> list[str]:
    """The facts page's first (cold) and warm times through `scehr serve`."""
    cold, warm = [], []
    for _ in range(servers):
        with server(real_models(), tasks="mortality", log_level="WARNING") as s, \
                httpx.Client(base_url=f"http://127.0.0.1:{s.port}") as c:
            cold.append(timed_get(c, facts))
            warm += [timed_get(c, facts) for _ in range(repeats)]
    return ["facts page through a real server (scehr serve, 1 worker, loopback HTTP):",
            f"  first request (cold cache): {summary(cold)}", f"  warm: {summary(warm)}"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30, help="requests per measure")
    ap.add_argument("--servers", type=int, default=3, help="servers started (cold requests)")
    args = ap.parse_args(argv)
    print(f"load average at start: {loadavg()}")
    print(f"models: {Path(real_models())}")
    facts, lines = in_process(args.repeats)
    print("\n".join(lines))
    print("\n".join(through_server(facts, args.repeats, args.servers)))
    print(f"load average at end: {loadavg()}")


if __name__ == "__main__":
    main()
