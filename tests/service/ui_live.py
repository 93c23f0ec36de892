"""A real uvicorn server on 127.0.0.1 and Debian's headless Chromium driven by Playwright:
shared by the browser tests (test_ui_browser.py) and the screenshots in docs/
(`./scripts/screenshots`, which runs `python -m tests.service.ui_live docs`).

No browser is ever downloaded: Playwright drives the `chromium` package's binary
(SCEHR_CHROMIUM to point at another)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from scehr.service.app import create_app
from scehr.service.settings import Settings, default_model_dir

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def chromium_path() -> str | None:
    """Debian's Chromium (or SCEHR_CHROMIUM), None when this machine has none."""
    given = os.environ.get("SCEHR_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


def shipped_settings(**kw: Any) -> Settings:
    """The shipped default mortality model (or the `tasks` given), on the CPU, quiet."""
    kw.setdefault("log_level", "WARNING")
    kw.setdefault("tasks", "mortality")
    return Settings(model_dir=default_model_dir(), device="cpu", **kw)


@contextmanager
def live_server(settings: Settings) -> Iterator[str]:
    """The app under a real uvicorn on a free port of 127.0.0.1, ready; yields its base URL."""
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        while httpx.get(f"{base}/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the models did not load")
            time.sleep(0.05)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def browser(executable: str) -> Iterator[Any]:
    """Headless Chromium (the given binary) under Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True,
                              args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def score_in_page(page: Any, text: str) -> None:
    """Paste a stay into the stay page's form and send it; wait for the answer."""
    page.fill("#stay", text)
    page.click("#score")
    page.wait_for_selector("#stay-result, #problems:not([hidden])")


def abstained_stay() -> dict[str, Any]:
    """A stay far below the default model's data minimum: the service abstains."""
    return {"id": "example-short", "observations": [
        {"variable": "heart_rate", "time": t, "value": 88 + t} for t in (1.0, 2.0, 3.0)]}


def with_cleaned_values() -> dict[str, Any]:
    """The example stay with one heart rate beyond the outlier bound (removed) and one
    between it and the valid bound (clipped), so that the series show both marks."""
    stay = json.loads((EXAMPLES / "mortality_stay.json").read_text())
    rates = [o for o in stay["observations"] if o["variable"] == "heart_rate"]
    rates[3]["value"], rates[7]["value"] = 400, 370
    return stay


def shrink(path: Path) -> None:
    """Store a screenshot with an adaptive palette (a fraction of the bytes, same look)."""
    from PIL import Image

    with Image.open(path) as img:
        img.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(
            path, optimize=True)


def screenshots(out: Path) -> list[Path]:
    """The pages as docs/ shows them: the default mortality model's facts, the example
    stay's risk (with two heart rates the cleaning rules change) and its risk over time from
    the shipped landmark model, an abstained stay, and monitoring after those."""
    exe = chromium_path()
    if exe is None:
        raise SystemExit("no chromium binary: apt-get install chromium (or set SCEHR_CHROMIUM)")
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with live_server(shipped_settings(tasks="mortality,mortality-landmark")) as base, \
            browser(exe) as b:
        page = b.new_page(viewport={"width": 1100, "height": 900})
        version = httpx.get(f"{base}/models/mortality").json()["version"]
        page.goto(f"{base}/ui/models/mortality/{version}")
        shots.append(out / "pages-facts.png")
        page.screenshot(path=shots[-1], full_page=True)
        page.goto(f"{base}/ui/stay")
        score_in_page(page, json.dumps(with_cleaned_values(), indent=1))
        page.wait_for_selector("#trajectory svg")
        shots.append(out / "pages-stay.png")
        page.screenshot(path=shots[-1], full_page=True)
        shots.append(out / "pages-trajectory.png")
        page.locator("#trajectory").screenshot(path=shots[-1])
        page.goto(f"{base}/ui/stay")
        score_in_page(page, json.dumps(abstained_stay(), indent=1))
        shots.append(out / "pages-abstained.png")
        page.screenshot(path=shots[-1], full_page=True)
        page.goto(f"{base}/ui/monitoring")
        shots.append(out / "pages-monitoring.png")
        page.screenshot(path=shots[-1], full_page=True)
    for path in shots:
        shrink(path)
    return shots


if __name__ == "__main__":
    for path in screenshots(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        print(path)
