"""The pages under /ui/ in a real browser: Debian's headless Chromium, driven by Playwright,
against a real uvicorn server with the shipped default mortality model.

Each page loads without console errors, failed requests or Content-Security-Policy
violations and weighs at most 300 kB with everything it loads; the figures it shows equal the
API's for the same model and stay; the stay form works for a JSON stay, a FHIR Bundle file and
a malformed stay (the API's problems listed); the keyboard reaches the form; print hides the
navigation. Skipped only where no chromium binary exists (`./scripts/test` installs Debian's
`chromium` when it runs as root)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scehr.service.settings import Settings
from tests.service import test_svc_trajectory
from tests.service.test_svc_trajectory import hourly_stay
from tests.service.ui_live import (
    EXAMPLES,
    abstained_stay,
    browser,
    chromium_path,
    live_server,
    score_in_page,
    shipped_settings,
)

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on this machine (apt-get install chromium, "
    "or set SCEHR_CHROMIUM); ./scripts/test installs it when run as root")
MAX_PAGE_BYTES = 300_000
#: The trajectory tests' models: a 48-hour mortality fixture and a landmark one.
landmark_dir = test_svc_trajectory.landmark_dir


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with live_server(shipped_settings()) as url:
        yield url


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    assert CHROMIUM is not None
    with browser(CHROMIUM) as b:
        yield b


class Watched:
    """A page and everything that went wrong on it: console errors (CSP violations are
    console errors in Chromium), uncaught exceptions, failed requests, error answers; and the
    bytes of every answer it loaded."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.bytes = 0
        self.allowed_status: set[int] = set()
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(f"exception: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"failed: {r.url}"))
        page.on("response", self._response)

    def _response(self, r: Any) -> None:
        if r.status >= 400 and r.status not in self.allowed_status:
            self.errors.append(f"{r.status}: {r.url}")
        with contextlib.suppress(Exception):  # a redirect has no body
            self.bytes += len(r.body())

    def clean(self) -> list[str]:
        """The errors, less the console line Chromium writes for an allowed error answer."""
        allowed = [f"status of {s}" for s in self.allowed_status]
        return [e for e in self.errors if not any(a in e for a in allowed)]


@pytest.fixture
def watched(chromium: Any) -> Iterator[Watched]:
    context = chromium.new_context(viewport={"width": 1100, "height": 900})
    w = Watched(context.new_page())
    yield w
    context.close()


def model_version(base: str) -> str:
    return httpx.get(f"{base}/models/mortality").json()["version"]


@pytest.mark.parametrize("path", ["/ui/", "/ui/models/mortality/{v}", "/ui/stay",
                                  "/ui/monitoring"])
def test_each_page_loads_clean_and_light(base: str, watched: Watched, path: str) -> None:
    page = watched.page
    response = page.goto(base + path.format(v=model_version(base)))
    page.wait_for_load_state("networkidle")
    assert response.status == 200
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert watched.clean() == [], watched.errors
    assert 0 < watched.bytes <= MAX_PAGE_BYTES, watched.bytes
    assert page.locator("h1").count() == 1
    # every figure is labelled for a screen reader
    assert page.evaluate("[...document.querySelectorAll('svg')].every("
                         "s => s.querySelector('title') && s.getAttribute('role') === 'img')")
    # printed: the navigation is left out, the content kept
    page.emulate_media(media="print")
    assert not page.locator("header").is_visible() and page.locator("main").is_visible()


def test_the_facts_show_the_api_figures(base: str, watched: Watched) -> None:
    version = model_version(base)
    info = httpx.get(f"{base}/models/mortality", params={"version": version}).json()
    watched.page.goto(f"{base}/ui/models/mortality/{version}")
    row = watched.page.locator('tr[data-metric="auroc"]')
    ci = info["metrics"]["test_ci"]["auroc"]
    assert row.locator("td.value").inner_text() == f"{ci['value']:.3f}"
    assert row.locator("td.ci").inner_text() == f"[{ci['low']:.3f}, {ci['high']:.3f}]"
    assert watched.page.locator("#calibration ~ figure svg, section svg#calibration").count()
    assert watched.clean() == []


@pytest.fixture(scope="module")
def phenotypes_base() -> Iterator[str]:
    with live_server(shipped_settings(tasks="phenotypes")) as url:
        yield url


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
def test_the_facts_show_the_hti1_attributes(base: str, phenotypes_base: str,
                                            watched: Watched, task: str) -> None:
    """The HTI-1 table is there and visible, as the route's JSON; the page loads clean and
    light with it (the phenotype model's page has 25 classes)."""
    url = base if task == "mortality" else phenotypes_base
    version = httpx.get(f"{url}/models/{task}").json()["version"]
    hti1 = httpx.get(f"{url}/models/{task}/{version}/transparency/hti1").json()["attributes"]
    page = watched.page
    page.goto(f"{url}/ui/models/{task}/{version}")
    page.wait_for_load_state("networkidle")
    table = page.locator("#hti1-table")
    table.scroll_into_view_if_needed()
    assert table.is_visible()
    rows = table.locator("tbody tr")
    assert rows.count() == len(hti1) == 31
    for k in (0, 1, 20, 30):
        a = hti1[k]
        cells = rows.nth(k).locator("td").all_inner_texts()
        assert cells[0] == str(a["number"])
        assert cells[1] == a["status"].replace("_", " ")
        assert cells[2] == (a["answer"] or a["reason"]).strip()
    assert watched.clean() == [], watched.errors
    assert 0 < watched.bytes <= MAX_PAGE_BYTES, watched.bytes


def _api(base: str, path: str, body: bytes, media: str) -> dict[str, Any]:
    r = httpx.post(f"{base}{path}", content=body, headers={"content-type": media},
                   params={"explain": "full"} if path.startswith("/predict") else None)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def test_the_stay_form_scores_a_json_stay_as_the_api(base: str, watched: Watched) -> None:
    text = (EXAMPLES / "mortality_stay.json").read_text()
    api = _api(base, "/predict/mortality", text.encode(), "application/json")["results"][0]
    page = watched.page
    page.goto(f"{base}/ui/stay")
    score_in_page(page, text)
    assert page.locator(".risk-value").inner_text() == f"{api['risk']:.3f}"
    iv = api["risk_interval"]
    assert page.locator(".interval").inner_text() == \
        f"interval {iv['low']:.3f} to {iv['high']:.3f}"
    assert ("alert" if api["alert"] else "no alert") in page.locator(".alert").inner_text()
    assert page.locator(".alert code").inner_text() == api["operating_point"]["name"]
    assert page.locator("table.prototypes tbody tr").count() == len(api["prototypes"])
    bars = page.locator('svg[id^="contrib-"] rect').count()
    assert bars == min(15, len(api["contributions"]))
    assert page.locator(".multiples figure").count() >= 30  # the example's variables
    assert page.evaluate("document.activeElement.id") == "result-title"
    assert watched.clean() == [], watched.errors


def test_the_stay_form_scores_a_fhir_bundle_file(base: str, watched: Watched) -> None:
    bundle = EXAMPLES / "fhir_bundle.json"
    fhir = _api(base, "/fhir/predict/mortality", bundle.read_bytes(), "application/fhir+json")
    risk = next(e["resource"] for e in fhir["entry"]
                if e["resource"]["resourceType"] == "RiskAssessment")
    page = watched.page
    page.goto(f"{base}/ui/stay")
    page.set_input_files("#file", str(bundle))
    page.click("#score")
    page.wait_for_selector("#stay-result")
    shown = page.locator(".risk-value").inner_text()
    assert shown == f"{risk['prediction'][0]['probabilityDecimal']:.3f}"
    assert "FHIR Bundle" in page.locator("#stay-result").inner_text()
    assert watched.clean() == [], watched.errors


def test_a_malformed_stay_lists_the_api_problems(base: str, watched: Watched) -> None:
    bad = {"observations": [{"variable": "heart_rat", "time": 1, "value": 80},
                            {"variable": "heart_rate", "time": -2, "value": 80}]}
    api = httpx.post(f"{base}/predict/mortality", json=bad).json()["detail"]
    watched.allowed_status = {422}
    page = watched.page
    page.goto(f"{base}/ui/stay")
    score_in_page(page, json.dumps(bad))
    assert page.locator("#problems").is_visible()
    rows = page.locator("#problems-rows tr")
    assert rows.count() == len(api) >= 2
    for k, p in enumerate(api):
        cells = rows.nth(k).locator("td").all_inner_texts()
        assert cells[0] == ".".join(map(str, p["loc"])) and cells[1] == p["rule"]
        assert cells[3] == (p["allowed"] or "")
    assert "heart_rate" in rows.nth(0).locator("td").nth(3).inner_text()
    assert page.evaluate("document.activeElement.id") == "problems-title"
    score_in_page(page, "{not json")
    assert page.locator("#problems-summary").inner_text().startswith("HTTP 4")
    assert page.locator("#problems-rows tr").count() >= 1
    watched.allowed_status = {400, 422}
    assert watched.clean() == [], watched.errors


def test_an_abstained_stay_says_why(base: str, watched: Watched) -> None:
    stay = abstained_stay()
    api = httpx.post(f"{base}/predict/mortality", json=stay).json()
    page = watched.page
    page.goto(f"{base}/ui/stay")
    score_in_page(page, json.dumps(stay))
    assert api["status"] == "insufficient_data"
    items = page.locator("#abstention li").all_inner_texts()
    assert items == api["sufficiency"]["reasons"]
    assert page.locator(".risk-value").count() == 0


def test_the_keyboard_reaches_the_form_and_sends_it(base: str, watched: Watched) -> None:
    page = watched.page
    page.goto(f"{base}/ui/stay")
    # the stay set without focusing anything: the keyboard starts at the top of the page
    page.eval_on_selector("#stay", "(e, text) => { e.value = text; }",
                          (EXAMPLES / "mortality_stay.json").read_text())
    seen = []
    for _ in range(15):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("document.activeElement.id"))
        if seen[-1] == "score":
            break
    assert {"task", "file", "stay", "score"} <= set(seen), seen
    page.keyboard.press("Enter")
    page.wait_for_selector("#stay-result")
    assert page.locator(".risk-value").is_visible()


@pytest.fixture(scope="module")
def landmark_base(landmark_dir: Path) -> Iterator[str]:
    with live_server(Settings(model_dir=landmark_dir, device="cpu", log_level="WARNING")) as url:
        yield url


def test_the_stay_shows_its_risk_over_time(landmark_base: str, base: str,
                                           watched: Watched) -> None:
    """With a landmark model served, the stay's risk over time is drawn under its risk: the
    hours, their risks and intervals and the alert events as the trajectory route's JSON.
    Without one, one line says so."""
    stay = hourly_stay(40, late_from=20.0)
    api = httpx.post(f"{landmark_base}/predict/mortality/trajectory", json=stay).json()
    page = watched.page
    page.goto(f"{landmark_base}/ui/stay")
    page.select_option("#task", "mortality")
    score_in_page(page, json.dumps(stay))
    page.wait_for_selector("#trajectory svg#trajectory-chart")
    chart = page.locator("#trajectory-chart")
    chart.scroll_into_view_if_needed()
    assert chart.is_visible()
    rows = page.eval_on_selector_all("#trajectory-hours tbody tr", "rs => rs.map(r => ({"
                                     "hour: +r.dataset.hour, status: r.dataset.status, "
                                     "risk: r.dataset.risk === undefined ? null : "
                                     "+r.dataset.risk}))")
    assert rows == [{k: h[k] for k in ("hour", "status", "risk")} for h in api["hours"]]
    alerts = page.eval_on_selector_all("#trajectory-alerts li[data-hour]",
                                       "ls => ls.map(l => +l.dataset.hour)")
    assert alerts == [a["hour"] for a in api["alerts"]] and alerts
    assert page.locator("#trajectory-chart polygon").count() >= len(alerts)
    assert page.locator(".no-risk li").first.inner_text().startswith("Hours 1–5")
    assert watched.clean() == [], watched.errors
    assert 0 < watched.bytes <= MAX_PAGE_BYTES, watched.bytes

    page.goto(f"{base}/ui/stay")  # the shipped models: no landmark model
    score_in_page(page, (EXAMPLES / "mortality_stay.json").read_text())
    assert page.locator("#trajectory-none").inner_text() == \
        "Risk over time: no mortality-landmark model is served here."
    assert page.locator("#trajectory").count() == 0
    assert watched.clean() == [], watched.errors


def test_monitoring_shows_the_monitor(base: str, watched: Watched) -> None:
    httpx.post(f"{base}/predict/mortality", json=abstained_stay())
    summary = httpx.get(f"{base}/models/mortality/monitoring").json()
    page = watched.page
    page.goto(f"{base}/ui/monitoring")
    section = page.locator(f'section[data-version="{summary["model_version"]}"]')
    assert section.locator(".stays").get_attribute("data-value") == str(summary["stays"])
    assert float(section.locator(".abstention-rate").get_attribute("data-value")) == \
        pytest.approx(summary["abstention_rate"])
    refresh = page.locator('meta[http-equiv="refresh"]').get_attribute("content")
    assert int(refresh) > 0
    assert page.locator("#latency-table tr[data-task='mortality']").count() == 1
    assert watched.clean() == []
