"""The pages under /ui/ (no browser): routes, security headers, openness and keys as the API's,
and the figures they show equal to the API's for the same model and stay.

The browser's view of the same pages is tested in test_ui_browser.py."""

from __future__ import annotations

import json
import re
from html import escape, unescape
from pathlib import Path
from typing import Any

import pytest

from scehr.schemas.manifest import Manifest
from scehr.service.pages import facts as facts_module
from scehr.service.pages.facts import FactsCache, build_facts
from scehr.service.pages.monitor_view import histogram_quantile
from scehr.service.pages.render import CSP, render
from scehr.service.settings import Settings, default_model_dir
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
#: the shipped default mortality version (the pages below are its)
DEFAULT = json.loads((default_model_dir() / "index.json").read_text())["defaults"]["mortality"]
FACTS = f"/ui/models/mortality/{DEFAULT}"
PAGES = ("/ui/", FACTS, "/ui/stay", "/ui/monitoring")
MAX_PAGE_BYTES = 300_000


def shipped(**kw: Any) -> Settings:
    """The shipped default mortality model (it has a data minimum, fairness audit, points)."""
    return Settings(model_dir=default_model_dir(), device="cpu", tasks="mortality", **kw)


def example_stay() -> dict[str, Any]:
    return json.loads((EXAMPLES / "mortality_stay.json").read_text())


def attr(html: str, selector_attr: str, value: str, wanted: str) -> str:
    """The `wanted` attribute of the first element carrying selector_attr="value"."""
    m = re.search(rf'{selector_attr}="{re.escape(value)}"(?:(?!</tr>)[\s\S])*?{wanted}="([^"]*)"',
                  html)
    assert m, f"no {selector_attr}={value} with {wanted}"
    return unescape(m.group(1))


async def test_every_page_has_the_strict_policy_and_stays_light() -> None:
    async with serve(shipped()) as c:
        for path in PAGES:
            r = await c.get(path)
            assert r.status_code == 200, (path, r.text[:300])
            assert r.headers["content-security-policy"] == CSP
            assert "'unsafe-inline'" not in CSP and "default-src 'none'" in CSP
            assert r.headers["x-content-type-options"] == "nosniff"
            assert len(r.content) <= MAX_PAGE_BYTES, (path, len(r.content))
            # nothing from elsewhere: no absolute URL in a src or href
            assert not re.search(r'(src|href)="(https?:)?//', r.text), path
            assert "<script>" not in r.text and " style=" not in r.text, path
        for name, kind in (("stay.js", "javascript"), ("pages.css", "css")):
            r = await c.get(f"/ui/static/{name}")
            assert r.status_code == 200 and kind in r.headers["content-type"]
        assert (await c.get("/ui/static/..%2Fstay.py")).status_code == 404
        assert (await c.get("/ui/static/render.py")).status_code == 404


async def test_facts_show_the_manifest_figures() -> None:
    """AUROC and its CI as the API's model metadata has them; abstention and fairness rows as
    the manifest's."""
    async with serve(shipped()) as c:
        html = (await c.get(FACTS)).text
        info = (await c.get("/models/mortality", params={"version": DEFAULT})).json()
    ci = info["metrics"]["test_ci"]["auroc"]
    assert float(attr(html, "data-metric", "auroc", "data-value")) == ci["value"]
    row = re.search(r'data-metric="auroc".*?</tr>', html, re.S).group(0)
    assert f"[{ci['low']:.3f}, {ci['high']:.3f}]" in row and f"{ci['value']:.3f}" in row
    m = Manifest.model_validate_json(
        (default_model_dir() / "mortality" / DEFAULT / "manifest.json").read_text())
    test = m.data_minimum.test
    assert f"{(1 - test.kept / test.n) * 100:.1f}%" in html
    for group in m.metrics["fairness"]["groups"]:
        assert f'data-group="{escape(group)}"' in html
    for p in m.classes[0].named_points:
        assert float(attr(html, "data-point", p.name, "data-value")) == p.threshold
    assert f"/models/mortality/{DEFAULT}/transparency/hti1" in html
    assert html.count("<svg") >= 2 and html.count("<title id=") >= 2  # calibration, points


def hti1_rows(html: str) -> list[dict[str, Any]]:
    """The HTI-1 table's rows as the page shows them: number, attribute, status, text."""
    table = re.search(r'<table id="hti1-table">.*?</table>', html, re.S)
    assert table, "no HTI-1 table"
    rows = re.findall(r'<tr data-attribute="(\d+)" data-status="([a-z_]+)"><td>(\d+)</td>'
                      r'<th scope="row">(.*?)</th><td class="status">(.*?)</td>'
                      r'<td class="answer">(.*?)</td></tr>', table.group(0), re.S)
    return [{"number": int(n), "status": status, "shown_number": int(shown),
             "attribute": unescape(name), "status_text": unescape(word),
             "text": unescape(text)} for n, status, shown, name, word, text in rows]


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
async def test_facts_show_the_31_hti1_attributes_as_the_route(task: str) -> None:
    """Every HTI-1 attribute on the facts page, equal to the transparency route's JSON; the
    TRIPOD+AI counts equal its checklist's; the documents linked; the page still light."""
    settings = Settings(model_dir=default_model_dir(), device="cpu", tasks=task)
    async with serve(settings) as c:
        version = (await c.get(f"/models/{task}")).json()["version"]
        page = await c.get(f"/ui/models/{task}/{version}")
        docs = f"/models/{task}/{version}/transparency/"
        hti1 = (await c.get(docs + "hti1")).json()["attributes"]
        tripod = (await c.get(docs + "tripod-ai")).json()["items"]
        linked = [(await c.get(docs + d)).status_code
                  for d in ("hti1", "chai-model-card", "tripod-ai", "markdown")]
    assert page.status_code == 200 and len(page.content) <= MAX_PAGE_BYTES, len(page.content)
    html = page.text
    rows = hti1_rows(html)
    assert len(rows) == len(hti1) == 31
    for row, a in zip(rows, hti1, strict=True):
        assert row["number"] == row["shown_number"] == a["number"]
        assert row["attribute"] == a["attribute"] and row["status"] == a["status"]
        assert row["status_text"] == a["status"].replace("_", " ")
        assert row["text"] == (a["answer"] if a["status"] == "answered" else a["reason"])
        assert row["text"], a["number"]
    for d in ("hti1", "chai-model-card", "tripod-ai", "markdown"):
        assert f'href="{docs}{d}"' in html
    assert linked == [200] * 4
    summary = re.search(r'<p id="tripod-summary">.*?</p>', html, re.S).group(0)
    shown = {s: int(n) for s, n in re.findall(r'data-status="([a-z_]+)" data-value="(\d+)"',
                                               summary)}
    counts: dict[str, int] = {}
    for item in tripod:
        counts[item["status"]] = counts.get(item["status"], 0) + 1
    assert shown == counts and sum(shown.values()) == len(tripod)
    assert f'href="{docs}tripod-ai"' in summary


async def test_facts_are_rendered_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = facts_module.build_facts

    def counting(*a: Any, **kw: Any) -> Any:
        calls.append(a[1])
        return real(*a, **kw)

    monkeypatch.setattr("scehr.service.pages.routes.build_facts", counting)
    async with serve(shipped()) as c:
        first = (await c.get(FACTS)).text
        second = (await c.get(FACTS)).text
        missing = await c.get("/ui/models/mortality/9.9.9")
    assert first == second and len(calls) == 1
    assert missing.status_code == 404 and missing.json()["detail"][0]["rule"] == \
        "version_not_served"


def test_facts_cache_is_bounded() -> None:
    cache = FactsCache(size=3)
    for k in range(10):
        cache.get((k,), lambda k=k: f"page {k}")
    assert len(cache._pages) == 3 and cache.get((9,), lambda: "new") == "page 9"


def test_a_site_model_shows_the_site_figures() -> None:
    """A site model's page shows its own figures and its parent's, from `metrics.site`."""
    m = Manifest.model_validate_json(
        (default_model_dir() / "mortality" / DEFAULT / "manifest.json").read_text())

    def iv(x: float) -> dict[str, float]:
        return {"value": x, "low": x - 0.02, "high": x + 0.02}

    def figs(model: str, auroc: float) -> dict[str, Any]:
        return {"model": model, "on": "the held-out 30% of site-data", "n": 300,
                "scored": 280, "positives": 40, "abstention_rate": iv(0.07),
                "auroc": iv(auroc), "auprc": iv(0.4), "ece": iv(0.03),
                "alert_rates": {"high_sensitivity": iv(0.3)}}

    part = {"n": 100, "positives": 10, "scored": 95, "scored_positives": 9}
    site = {"figures": figs("site 1.3.2-site", 0.812), "parent_figures": figs("1.3.2", 0.79),
            "provenance": {"parent": "scehr-mortality-ensemble-csce 1.3.2",
                           "parent_manifest_sha256": "0" * 64, "data": "site-data",
                           "data_sha256": "1" * 64, "stays": 400, "positives": 50,
                           "below_minimum": 20,
                           "split": {"rule": "70/30 stratified", "seed": 0,
                                     "holdout_fraction": 0.3, "file": "split.csv",
                                     "fit": part, "held_out": part}},
            "changes": ["calibration map refitted"]}
    own = m.metrics
    m.metrics = {"site": site, "parent": own}  # as scehr recalibrate writes them
    html = render("facts.html", f=build_facts(m, "x" * 64, True), base="",
                  open_models=True, open_docs=True, contract="1.4")
    assert float(attr(html, "data-metric", "site-auroc", "data-value")) == 0.812
    assert "0.790 [0.770, 0.810]" in html and "calibration map refitted" in html
    # the parent's own test figures, said to be the parent's
    assert float(attr(html, "data-metric", "auroc", "data-value")) == \
        own["test_ci"]["auroc"]["value"]
    assert "The parent model's own test figures" in html
    assert 'data-group="all"' in html  # the parent's fairness audit
    plain = render("facts.html", f=build_facts(m.model_copy(update={"metrics": own}), "x",
                                               True),
                   base="", open_models=True, open_docs=True, contract="1.4")
    assert "not a site model" in plain and "site-auroc" not in plain
    assert "parent model's own" not in plain


async def test_the_stay_route_answers_the_api_risk_json_and_fhir() -> None:
    """The risk, interval and alert shown equal `/predict`'s for the JSON stay and
    `/fhir/predict`'s for the Bundle of the same stay."""
    async with serve(shipped()) as c:
        api = (await c.post("/predict/mortality", params={"explain": "full"},
                            json=example_stay())).json()["results"][0]
        page = await c.post("/ui/stay/mortality", json=example_stay())
        bundle = (EXAMPLES / "fhir_bundle.json").read_bytes()
        fhir_page = await c.post("/ui/stay/mortality", content=bundle,
                                 headers={"content-type": "application/fhir+json"})
        fhir = (await c.post("/fhir/predict/mortality", content=bundle,
                             headers={"content-type": "application/fhir+json"})).json()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert float(attr(html, "class", "risk-value", "data-value")) == api["risk"]
    iv = api["risk_interval"]
    assert float(attr(html, "class", "interval", "data-low")) == iv["low"]
    assert float(attr(html, "class", "interval", "data-high")) == iv["high"]
    assert attr(html, "class", "alert", "data-alert") == str(api["alert"]).lower()
    assert api["explanation"]["margin_percentile"]["summary"][1:] in html
    top = max(api["contributions"], key=lambda x: abs(x["delta"]))
    assert f"{top['variable']} {top['delta']:+.3f}" in html
    for p in api["prototypes"]:
        assert f"{p['outcome_rate'] * 100:.1f}%" in html
    assessment = next(e["resource"] for e in fhir["entry"]
                      if e["resource"]["resourceType"] == "RiskAssessment")
    shown = float(attr(fhir_page.text, "class", "risk-value", "data-value"))
    assert shown == pytest.approx(assessment["prediction"][0]["probabilityDecimal"], abs=1e-9)
    assert "FHIR Bundle" in fhir_page.text


async def test_cleaning_marks_in_the_series() -> None:
    """A value outside the outlier bounds is a cross at its hour; a value between an outlier
    and a valid bound is clipped and drawn as a triangle at the bound."""
    s = example_stay()
    hr = [o for o in s["observations"] if o["variable"] == "heart_rate"]
    hr[0]["value"], hr[1]["value"] = 400, 370  # outlier bound 390, valid bound 350
    async with serve(shipped()) as c:
        api = (await c.post("/predict/mortality", json=s)).json()
        html = (await c.post("/ui/stay/mortality", json=s)).text
    codes = {w["code"] for w in api["warnings"]}
    assert {"value_dropped", "value_clipped"} <= codes, codes
    panel = re.search(r'data-variable="heart_rate".*?</figure>', html, re.S).group(0)
    assert f"value removed at {hr[0]['time']:g} h" in panel
    assert f"clipped to 350 at {hr[1]['time']:g} h" in panel
    assert "1 clipped" in panel and "1 removed" in panel


async def test_an_abstained_stay_shows_its_reasons_and_counts_in_monitoring() -> None:
    few = {"observations": [{"variable": "heart_rate", "time": 1, "value": 80}]}
    async with serve(shipped()) as c:
        api = (await c.post("/predict/mortality", json=few)).json()
        html = (await c.post("/ui/stay/mortality", json=few)).text
        await c.post("/predict/mortality", json=example_stay())
        await c.post("/predict/mortality", json=example_stay())
        summary = (await c.get("/models/mortality/monitoring")).json()
        page = (await c.get("/ui/monitoring")).text
    assert api["status"] == "insufficient_data"
    assert 'data-status="insufficient_data"' in html
    for reason in api["sufficiency"]["reasons"]:
        assert unescape(reason) in unescape(html)
    assert summary["answered"] == 4 and summary["abstention_rate"] == 0.5
    assert summary["stays"] == 2
    assert float(attr(page, "class", "abstention-rate", "data-value")) == 0.5
    assert "50.0% of the last 4 stays answered" in page


async def test_a_malformed_stay_gets_the_api_problems() -> None:
    bad = {"observations": [{"variable": "heart_rat", "time": 1, "value": 80}]}
    async with serve(shipped()) as c:
        api = await c.post("/predict/mortality", json=bad)
        ui = await c.post("/ui/stay/mortality", json=bad)
        xml = await c.post("/ui/stay/mortality", content=b"<Bundle/>",
                           headers={"content-type": "application/fhir+json"})
        form = await c.post("/ui/stay/mortality", content=b"stay=1",
                            headers={"content-type": "application/x-www-form-urlencoded"})
    assert ui.status_code == api.status_code == 422
    drop = ("request_id",)
    assert {k: v for k, v in ui.json().items() if k not in drop} == \
        {k: v for k, v in api.json().items() if k not in drop}
    assert xml.status_code == 415 and xml.json()["detail"][0]["rule"] == "fhir_json_only"
    assert form.status_code == 415  # a cross-site form cannot score: JSON only


async def test_keys_and_openness_follow_the_api() -> None:
    async with serve(shipped(api_keys="s3cret", open_models=False, open_metrics=False)) as c:
        no_key = await c.post("/ui/stay/mortality", json=example_stay())
        api_no_key = await c.post("/predict/mortality", json=example_stay())
        unparsed = await c.post("/ui/stay/mortality", content=b"{not json",
                                headers={"content-type": "application/json"})
        with_key = await c.post("/ui/stay/mortality", json=example_stay(),
                                headers={"X-API-Key": "s3cret"})
        form = (await c.get("/ui/stay")).text
        closed = [(await c.get(p)).status_code for p in
                  (FACTS, "/ui/monitoring")]
        root = await c.get("/ui/", follow_redirects=True)
    assert no_key.status_code == api_no_key.status_code == 401
    assert unparsed.status_code == 401  # the key is checked before the body is read
    assert with_key.status_code == 200 and "risk-value" in with_key.text
    assert 'id="key"' in form and 'href="/ui/monitoring"' not in form
    assert closed == [404, 404] and root.url.path == "/ui/stay"
    async with serve(shipped(open_metrics=False)) as c:
        page = (await c.get("/ui/monitoring")).text
        form = (await c.get("/ui/stay")).text
    assert "Latency is not public here" in page and 'id="key"' not in form


async def test_latency_percentiles_come_from_the_histogram() -> None:
    async with serve(shipped()) as c:
        for _ in range(3):
            await c.post("/predict/mortality", json=example_stay())
        for _ in range(5):  # not scoring: not counted
            await c.get("/models/mortality")
            await c.get(FACTS)
        page = (await c.get("/ui/monitoring")).text
    row = re.search(r'<tr data-task="mortality">.*?</tr>', page, re.S).group(0)
    assert "<td>3</td>" in row and row.count(" ms") == 3


def test_histogram_quantile_interpolates_within_buckets() -> None:
    buckets = [(0.1, 0.0), (0.2, 10.0), (0.5, 20.0), (float("inf"), 20.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.2)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.35)
    assert histogram_quantile(0.5, [(float("inf"), 0.0)]) is None
    assert histogram_quantile(0.99, [(0.1, 1.0), (float("inf"), 5.0)]) == 0.1


async def test_the_abstention_rate_covers_the_last_window_of_answers() -> None:
    """Answered stays, scored or abstained, are counted in a ring of the monitor's window:
    memory fixed, the oldest forgotten."""
    few = {"observations": [{"variable": "heart_rate", "time": 1, "value": 80}]}
    async with serve(shipped(monitor_window=10)) as c:
        for _ in range(12):
            await c.post("/predict/mortality", json=few)
        for _ in range(4):
            await c.post("/predict/mortality", json=example_stay())
        summary = (await c.get("/models/mortality/monitoring")).json()
    assert summary["answered"] == 10 and summary["abstention_rate"] == pytest.approx(0.6)
    assert summary["stays"] == 4


async def test_a_phenotype_answer_stays_under_the_page_weight() -> None:
    """25 classes, each with its risk scale and contributions, and the stay's series."""
    settings = Settings(model_dir=default_model_dir(), device="cpu", tasks="phenotypes")
    stay = json.loads((EXAMPLES / "phenotypes_stay.json").read_text())
    async with serve(settings) as c:
        page = await c.get("/ui/stay")
        answer = await c.post("/ui/stay/phenotypes", json=stay)
        static = [await c.get(f"/ui/static/{n}") for n in ("pages.css", "stay.js")]
    assert answer.status_code == 200 and answer.text.count('class="class-result"') == 25
    total = len(page.content) + len(answer.content) + sum(len(s.content) for s in static)
    assert total <= MAX_PAGE_BYTES, total


async def test_the_form_sends_nothing_without_its_script() -> None:
    """Without the script a browser would submit the form itself: its fields have no name, so
    such a submission carries no stay (and never in a URL: the method is POST)."""
    async with serve(shipped(api_keys="k")) as c:
        html = (await c.get("/ui/stay")).text
    form = re.search(r"<form[^>]*>.*?</form>", html, re.S).group(0)
    assert 'method="post"' in form and " name=" not in form
    assert all(f'id="{i}"' in form for i in ("task", "file", "stay", "key", "score"))
