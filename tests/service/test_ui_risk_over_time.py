"""The stay page's risk over time (no browser): `POST /ui/stay/{task}/trajectory` draws what
`POST /predict/{task}/trajectory` answers for the same stay, from the trajectory tests' landmark
fixture model; without a landmark model the stay's answer says so in one line.

The browser's view is tested in test_ui_browser.py."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from scehr.service.settings import Settings, default_model_dir
from tests.service import test_svc_trajectory
from tests.service.conftest import serve
from tests.service.fhir_writer import bundle, groups_from_stay
from tests.service.test_svc_trajectory import ADMISSION, hourly_stay

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The trajectory tests' models: a 48-hour mortality fixture and a landmark one.
landmark_dir = test_svc_trajectory.landmark_dir
#: Hours 1-5 before the first landmark, 6-40 scored, an alert at hour 6.
STAY = hourly_stay(40, late_from=20.0)
#: Hours 1-5 before the first landmark, 6-8 below the data minimum, 9-14 scored, no alert.
SPARSE = hourly_stay(14, others_from=8.5)


def shown_hours(html: str) -> list[dict[str, Any]]:
    """The hours table of the drawn trajectory: hour, status, risk and interval."""
    rows = re.findall(r"<tr (data-hour=[^>]*)>", html)
    out = []
    for row in rows:
        attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', row))
        out.append({"hour": int(attrs["hour"]), "status": attrs["status"],
                    "risk": float(attrs["risk"]) if "risk" in attrs else None,
                    "interval": ({"low": float(attrs["low"]), "high": float(attrs["high"])}
                                 if "low" in attrs else None)})
    return out


def abstained_runs(hours: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(first hour, last hour, reason) of each run of abstained hours with one reason."""
    runs: list[list[Any]] = []
    for h in hours:
        code = h["reasons"][0]["code"] if h["reasons"] else None
        if h["status"] == "abstained" and runs and runs[-1][1] == h["hour"] - 1 \
                and runs[-1][2] == code:
            runs[-1][1] = h["hour"]
        elif h["status"] == "abstained":
            runs.append([h["hour"], h["hour"], code])
    return [tuple(r) for r in runs]


@pytest.mark.parametrize(("stay", "expected_runs", "hours"), [
    (STAY, [(1, 5, "before_first_landmark")], 40),
    (SPARSE, [(1, 5, "before_first_landmark"), (6, 8, "below_data_minimum")], 14)])
async def test_the_risk_over_time_equals_the_trajectory_route(
        landmark_dir: Path, stay: dict[str, Any], expected_runs: list[tuple[int, int, str]],
        hours: int) -> None:
    async with serve(Settings(model_dir=landmark_dir, device="cpu")) as c:
        answer = (await c.post("/ui/stay/mortality", json=stay)).text
        drawn = await c.post("/ui/stay/mortality/trajectory", json=stay)
        api = (await c.post("/predict/mortality/trajectory", json=stay)).json()
    # the stay's answer leaves the slot the page's script fills
    assert 'id="trajectory"' in answer and 'data-task="mortality-landmark"' in answer
    assert 'id="trajectory-none"' not in answer
    assert drawn.status_code == 200 and drawn.headers["content-type"].startswith("text/html")
    html = drawn.text
    shown = shown_hours(html)
    assert shown == [{"hour": h["hour"], "status": h["status"], "risk": h["risk"],
                      "interval": h["interval"] and {k: h["interval"][k] for k in ("low", "high")}}
                     for h in api["hours"]]
    assert [h["hour"] for h in api["hours"]] == list(range(1, hours + 1))
    alerts = re.findall(r'<li data-hour="(\d+)" data-risk="([^"]+)"', html)
    assert [(int(h), float(r)) for h, r in alerts] == \
        [(a["hour"], a["risk"]) for a in api["alerts"]]
    assert bool(alerts) == (stay is STAY)  # the case with an alert has one
    # the figure: one triangle per alert event, one grey column per run of abstained hours,
    # the band where the hours have an interval, the threshold
    svg = re.search(r'<svg[^>]*id="trajectory-chart".*?</svg>', html, re.S).group(0)
    assert svg.count("<polygon points=") - svg.count("<title>interval") == len(api["alerts"])
    runs = abstained_runs(api["hours"])
    assert runs == expected_runs
    for first, last, _ in runs:
        assert f"no risk at hours {first}-{last}:" in svg
    assert "<title>interval" in svg
    policy = api["alert_policy"]["threshold"]
    assert f"alert threshold {policy:.3f}" in unescape(svg)
    desc = unescape(re.search(r"<desc[^>]*>(.*?)</desc>", svg, re.S).group(1))
    scored = [h["risk"] for h in api["hours"] if h["status"] == "scored"]
    assert f"at {len(scored)} of {hours} hours, from {min(scored):.3f} to {max(scored):.3f}" in desc
    assert "alerts at hours " + ", ".join(str(a["hour"]) for a in api["alerts"]) in desc


async def test_a_bundle_gets_the_risk_over_time_of_its_stay(landmark_dir: Path) -> None:
    """A FHIR Bundle of the stay: the hours of `/fhir/predict/{task}/trajectory`'s
    RiskAssessments, drawn."""
    body = bundle(groups_from_stay(STAY), admission=ADMISSION)
    async with serve(Settings(model_dir=landmark_dir, device="cpu")) as c:
        drawn = await c.post("/ui/stay/mortality/trajectory", json=body,
                             headers={"content-type": "application/fhir+json"})
        fhir = (await c.post("/fhir/predict/mortality/trajectory", json=body,
                             headers={"content-type": "application/fhir+json"})).json()
    assert drawn.status_code == 200, drawn.text[:300]
    risks = [e["resource"]["prediction"][0]["probabilityDecimal"] for e in fhir["entry"]
             if e["resource"]["resourceType"] == "RiskAssessment"]
    shown = [h["risk"] for h in shown_hours(drawn.text) if h["status"] == "scored"]
    assert shown == pytest.approx(risks, abs=1e-9) and len(shown) == 35


async def test_without_a_landmark_model_one_line_says_so() -> None:
    settings = Settings(model_dir=default_model_dir(), device="cpu",
                        tasks=["mortality", "phenotypes"])
    stay = json.loads((EXAMPLES / "mortality_stay.json").read_text())
    phenotypes = json.loads((EXAMPLES / "phenotypes_stay.json").read_text())
    async with serve(settings) as c:
        answer = (await c.post("/ui/stay/mortality", json=stay)).text
        drawn = await c.post("/ui/stay/mortality/trajectory", json=stay)
        pheno = (await c.post("/ui/stay/phenotypes", json=phenotypes)).text
    line = re.findall(r'<p id="trajectory-none">(.*?)</p>', answer)
    assert line == ["Risk over time: no mortality-landmark model is served here."]
    assert 'id="trajectory"' not in answer and "trajectory-chart" not in answer
    assert drawn.status_code == 404
    assert "no mortality-landmark model is served here" in drawn.json()["detail"][0]["message"]
    assert re.findall(r'<p id="trajectory-none">(.*?)</p>', pheno) == [
        "Risk over time: no landmark task gives the phenotypes risk at every hour."]


async def test_the_risk_over_time_needs_the_key_as_the_api(landmark_dir: Path) -> None:
    settings = Settings(model_dir=landmark_dir, device="cpu", api_keys="k")
    async with serve(settings) as c:
        no_key = await c.post("/ui/stay/mortality/trajectory", json=STAY)
        api = await c.post("/predict/mortality/trajectory", json=STAY)
        bad = await c.post("/ui/stay/mortality/trajectory", headers={"X-API-Key": "k"},
                           json={"observations": [{"variable": "heart_rat", "time": 1,
                                                   "value": 80}]})
        form = await c.post("/ui/stay/mortality/trajectory", content=b"stay=1",
                            headers={"content-type": "application/x-www-form-urlencoded",
                                     "X-API-Key": "k"})
    assert no_key.status_code == api.status_code == 401
    assert bad.status_code == 422 and bad.json()["detail"][0]["rule"]
    assert form.status_code == 415
