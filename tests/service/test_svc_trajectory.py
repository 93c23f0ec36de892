"""The risk at every hour of a stay, served from a landmark model (the causal fixture graph of
`fixture_landmark`, run by ONNX Runtime): JSON, batch, FHIR and CDS Hooks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from scehr.schemas.alert_policy import AlertPolicy, alert_hours
from scehr.schemas.manifest import Calibration
from scehr.service.settings import Settings
from tests.service.conftest import serve
from tests.service.fhir_writer import bundle, cds_request, groups_from_stay
from tests.service.fixture_landmark import FIXTURE_TRAJECTORY
from tests.service.fixture_model import write_index, write_model
from tests.service.test_svc_fhir_out import round_trip

pytestmark = pytest.mark.anyio
ADMISSION = datetime.fromisoformat("2026-03-01T06:00:00+00:00")
ROUTE = "/predict/mortality/trajectory"


@pytest.fixture(scope="module")
def landmark_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mortality v1 (the 48-hour model) and mortality-landmark v1."""
    root = tmp_path_factory.mktemp("landmark-models")
    write_model(root, "mortality", "v1", seed=1)
    write_model(root, "mortality-landmark", "v1", seed=7)
    write_index(root, [("mortality", "v1"), ("mortality-landmark", "v1")])
    return root


@pytest.fixture
async def client(landmark_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(Settings(model_dir=landmark_dir, device="cpu")) as c:
        yield c


def hourly_stay(until: float, *, others_from: float = 0.0, late_from: float | None = None,
                **extra: Any) -> dict[str, Any]:
    """A heart rate every hour (at h + 0.5) up to `until`; systolic pressure and temperature
    from `others_from` on; from `late_from` on, every value is changed (+40 bpm, ...)."""
    obs: list[dict[str, Any]] = []
    for k in range(int(until)):
        t = k + 0.5
        late = late_from is not None and t > late_from
        obs.append({"variable": "heart_rate", "time": t, "unit": "bpm",
                    "value": 80.0 + 2 * (k % 7) + (40.0 if late else 0.0)})
        if t >= others_from:
            obs += [{"variable": "systolic_bp", "time": t, "unit": "mmHg",
                     "value": 115.0 - (k % 5) - (30.0 if late else 0.0)},
                    {"variable": "temperature", "time": t, "unit": "Cel",
                     "value": 37.0 + 0.1 * (k % 3) + (1.5 if late else 0.0)}]
    return {"observations": obs, **extra}


def statuses(traj: dict[str, Any]) -> list[tuple[int, str, str | None]]:
    """(hour, status, first reason code) per hour."""
    return [(h["hour"], h["status"], h["reasons"][0]["code"] if h["reasons"] else None)
            for h in traj["hours"]]


#: A stay whose second and third variables start at 8.5 h: hours 1-5 are before the first
#: landmark, 6-8 below the first band's data minimum (3 variables), 9 on scored.
SPARSE_EARLY = hourly_stay(14, others_from=8.5)
EXPECTED_SPARSE = ([(h, "abstained", "before_first_landmark") for h in range(1, 6)]
                   + [(h, "abstained", "below_data_minimum") for h in range(6, 9)]
                   + [(h, "scored", None) for h in range(9, 15)])


async def test_the_last_hour_is_the_full_stay_risk_of_the_same_graph(
        client: httpx.AsyncClient) -> None:
    stay = hourly_stay(48, end_hours=48.0)
    r = await client.post(ROUTE, json=stay)
    assert r.status_code == 200, r.text
    traj = r.json()
    assert [h["hour"] for h in traj["hours"]] == list(range(1, 49))
    assert traj["model"]["task"] == "mortality-landmark" and traj["status"] == "scored"
    assert r.headers["x-scehr-response-version"] == traj["response_version"] == "1.2"
    full = (await client.post("/predict/mortality-landmark", json=stay)).json()["results"][0]
    last = traj["hours"][-1]
    # the graph's last-step output (probability) is its hour-48 output
    assert last["score"] == pytest.approx(full["score"], abs=1e-6)
    band = Calibration.model_validate(FIXTURE_TRAJECTORY["bands"][-1]["calibration"])
    margin = np.array([full["explanation"]["margin"]])
    assert last["risk"] == pytest.approx(
        float(band.apply(np.array([full["score"]]), margin)[0]), abs=1e-6)


async def test_later_data_never_changes_an_earlier_hour(client: httpx.AsyncClient) -> None:
    base = (await client.post(ROUTE, json=hourly_stay(40))).json()
    changed = (await client.post(ROUTE, json=hourly_stay(40, late_from=20.0))).json()
    cut = (await client.post(ROUTE, json=hourly_stay(20))).json()
    risks = [h["risk"] for h in base["hours"]]
    assert [h["risk"] for h in changed["hours"][:20]] == risks[:20]
    assert [h["risk"] for h in cut["hours"]] == risks[:20]  # the stay as known at hour 20
    # ... and the change does reach the later hours (the test can fail)
    assert [h["risk"] for h in changed["hours"][20:]] != risks[20:]
    assert len(cut["hours"]) == 20 and len(base["hours"]) == 40


async def test_each_hour_abstains_or_is_scored_with_its_bands_maps(
        client: httpx.AsyncClient) -> None:
    traj = (await client.post(ROUTE, json=SPARSE_EARLY)).json()
    assert statuses(traj) == EXPECTED_SPARSE
    hours = {h["hour"]: h for h in traj["hours"]}
    assert all(h["risk"] is None and h["interval"] is None and not h["alert"]
               for h in traj["hours"] if h["status"] == "abstained")
    assert "this model needs at least 3 different ones" in hours[7]["reasons"][0]["message"]
    # the first band (6-11) serves an interval, the second (12-23) none
    assert hours[9]["interval"] is not None and hours[12]["interval"] is None
    assert all(0 < h["risk"] < 1 for h in traj["hours"] if h["status"] == "scored")


async def test_alerts_follow_the_policy_on_the_scored_hours(client: httpx.AsyncClient) -> None:
    traj = (await client.post(ROUTE, json=hourly_stay(40, late_from=20.0))).json()
    policy = AlertPolicy.model_validate(FIXTURE_TRAJECTORY["alert_policy"])
    assert traj["alert_policy"]["threshold"] == policy.threshold
    risks = [h["risk"] for h in traj["hours"]]
    expected = alert_hours(policy, [h["hour"] for h in traj["hours"]], risks)
    assert [a["hour"] for a in traj["alerts"]] == expected and expected
    assert [h["alert"] for h in traj["hours"]] == [r is not None and r >= policy.threshold
                                                   for r in risks]
    # abstained hours never alert, however the policy is set
    assert all(a["hour"] >= FIXTURE_TRAJECTORY["first_hour"] for a in traj["alerts"])


async def test_the_batch_answers_each_stay_as_the_single_route(
        client: httpx.AsyncClient) -> None:
    single = (await client.post(ROUTE, json=SPARSE_EARLY)).json()
    r = await client.post(f"{ROUTE}/batch", json={"stays": [
        {**SPARSE_EARLY, "id": "a"}, {"id": "b", "observations": [
            {"variable": "heart_rate", "time": 1.0, "value": 900.0, "unit": "kg"}]},
        hourly_stay(3, id="c")]})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert statuses(items[0]["trajectory"]) == EXPECTED_SPARSE
    assert [h["risk"] for h in items[0]["trajectory"]["hours"]] == [
        h["risk"] for h in single["hours"]]
    assert items[1]["trajectory"] is None and items[1]["errors"][0]["loc"][:3] == [
        "body", "stays", 1]
    assert items[2]["trajectory"]["status"] == "insufficient_data"
    assert statuses(items[2]["trajectory"]) == [
        (h, "abstained", "before_first_landmark") for h in (1, 2, 3)]


async def test_fhir_gives_a_risk_assessment_per_scored_hour(client: httpx.AsyncClient) -> None:
    b = bundle(groups_from_stay(SPARSE_EARLY), admission=ADMISSION)
    r = await client.post("/fhir/predict/mortality/trajectory", json=b)
    assert r.status_code == 200, r.text
    # FHIR R4's own model reads every element of it and writes it back the same
    assert round_trip(r.json()) == r.json()
    entries = [e["resource"] for e in r.json()["entry"]]
    assessments = [e for e in entries if e["resourceType"] == "RiskAssessment"]
    json_traj = (await client.post(ROUTE, json=SPARSE_EARLY)).json()
    scored = [h for h in json_traj["hours"] if h["status"] == "scored"]
    assert [datetime.fromisoformat(a["occurrenceDateTime"].replace("Z", "+00:00"))
            for a in assessments] == [ADMISSION + timedelta(hours=h["hour"]) for h in scored]
    assert [a["prediction"][0]["probabilityDecimal"] for a in assessments] == pytest.approx(
        [h["risk"] for h in scored], abs=1e-9)
    # the basis of hour h: the Observations up to h only (one heart rate an hour, and from
    # 8.5 h a systolic pressure and a temperature)
    by_ref = {f"Observation/{e['resource']['id']}": e["resource"]
              for e in b["entry"] if e["resource"]["resourceType"] == "Observation"}
    for a, h in zip(assessments, scored, strict=True):
        times = [datetime.fromisoformat(by_ref[ref["reference"]]["effectiveDateTime"]
                                        .replace("Z", "+00:00")) for ref in a["basis"]]
        assert max(times) <= ADMISSION + timedelta(hours=h["hour"])
        assert len(a["basis"]) == h["hour"] + 2 * (h["hour"] - 8)
    outcome = next(e for e in entries if e["resourceType"] == "OperationOutcome")
    codes = [(i["details"]["text"], i["diagnostics"].split(" with ")[0]) for i in
             outcome["issue"] if i["code"] == "incomplete"]
    assert codes == [("before_first_landmark", "no risk at hours 1-5"),
                     ("below_data_minimum", "no risk at hours 6-8")]


async def test_cds_hooks_shows_the_trend_or_why_there_is_no_risk_yet(
        client: httpx.AsyncClient) -> None:
    services = (await client.get("/cds-services")).json()["services"]
    assert {"scehr-mortality", "scehr-mortality-landmark"} <= {s["id"] for s in services}
    stay = hourly_stay(20, late_from=14.0)
    req = cds_request(bundle(groups_from_stay(stay), admission=ADMISSION))
    r = await client.post("/cds-services/scehr-mortality-landmark", json=req)
    assert r.status_code == 200, r.text
    (card,) = r.json()["cards"]
    traj = (await client.post(ROUTE, json=stay)).json()
    ext = card["extension"]["dev.scehr.result"]
    risk = {h["hour"]: h["risk"] for h in traj["hours"]}
    assert (ext["hour"], ext["risk_6h_ago"]) == (20, pytest.approx(risk[14], abs=1e-9))
    assert ext["risk"] == pytest.approx(risk[20], abs=1e-9)
    assert f"{risk[14]:.0%} 6 h ago" in card["summary"]
    early = cds_request(bundle(groups_from_stay(hourly_stay(4)), admission=ADMISSION))
    (card,) = (await client.post("/cds-services/scehr-mortality-landmark",
                                 json=early)).json()["cards"]
    assert card["indicator"] == "info" and card["summary"].endswith("at hour 4 yet")
    assert card["extension"]["dev.scehr.result"]["reasons"][0].startswith(
        "no risk before hour 6")
    # the 48-hour task's service is unchanged: its usual card
    (card,) = (await client.post("/cds-services/scehr-mortality", json=req)).json()["cards"]
    assert "hour" not in card["extension"]["dev.scehr.result"]


async def test_without_a_landmark_model_the_route_says_which_task_it_needs(
        model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, device="cpu")) as c:
        r = await c.post(ROUTE, json=hourly_stay(10))
        assert r.status_code == 404
        assert "no mortality-landmark model is served here" in r.json()["detail"][0]["message"]
        r = await c.post("/predict/phenotypes/trajectory/batch", json={"stays": []})
        assert r.status_code == 404 and "served for: mortality" in r.text
        r = await c.post("/fhir/predict/mortality/trajectory",
                         json=bundle(groups_from_stay(hourly_stay(10)), admission=ADMISSION))
        assert r.status_code == 404


async def test_bad_input_is_a_problem_naming_the_field(client: httpx.AsyncClient) -> None:
    r = await client.post(ROUTE, json={"observations": [
        {"variable": "heart_rate", "time": 1.0, "value": 80.0, "unit": "kg"}]})
    assert r.status_code == 422
    assert r.json()["detail"][-1]["loc"][:3] == ["body", "observations", 0]
    r = await client.post(ROUTE, json=hourly_stay(10), params={"version": "../x"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "version"]
    spec = (await client.get("/openapi.json")).json()
    ok = spec["paths"][ROUTE]["post"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"]["$ref"].endswith("/TrajectoryPrediction")
    assert {"hours", "alerts", "alert_policy"} <= set(
        spec["components"]["schemas"]["TrajectoryPrediction"]["properties"])


async def test_scehr_score_every_hour_writes_the_routes_trajectories(
        client: httpx.AsyncClient, landmark_dir: Path, tmp_path: Path) -> None:
    """`scehr score mortality --every 1h`: one row per stay, the hours as the route answers
    them (its abstentions included)."""
    import json

    from scehr.service.offline_scoring import score

    stays = [{**SPARSE_EARLY, "id": "sparse"}, hourly_stay(3, id="early"),
             hourly_stay(30, id="long", late_from=20.0)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stays))
    out = tmp_path / "out.jsonl"
    summary = score("mortality", tmp_path / "in.jsonl", out, model_dir=landmark_dir,
                    device="cpu", every="1h", progress=False)
    assert (summary.scored, summary.abstained, summary.errors) == (2, 1, 0)
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert [(h["hour"], h["status"], (h["reasons"] or [None])[0])
            for h in rows["sparse"]["hours"]] == EXPECTED_SPARSE
    assert rows["early"]["status"] == "insufficient_data"
    assert rows["early"]["errors"][0]["rule"] == "before_first_landmark"
    served = (await client.post(ROUTE, json=stays[2])).json()
    assert [h["risk"] for h in rows["long"]["hours"]] == [h["risk"] for h in served["hours"]]
    assert rows["long"]["alerts"] == served["alerts"] and served["alerts"]
    with pytest.raises(ValueError, match="writes JSON Lines"):
        score("mortality", tmp_path / "in.jsonl", tmp_path / "o.csv", model_dir=landmark_dir,
              device="cpu", every="1h", progress=False)
    with pytest.raises(ValueError, match="no landmark task gives the phenotypes risk"):
        score("phenotypes", tmp_path / "in.jsonl", tmp_path / "p.jsonl",
              model_dir=landmark_dir, device="cpu", every="1h", progress=False)


async def test_stays_batched_together_get_the_trajectories_they_get_alone(
        client: httpx.AsyncClient) -> None:
    """Concurrent requests share the model's runs (the micro-batcher): each stay's per-hour
    outputs are its own."""
    import asyncio

    stays = [hourly_stay(n, late_from=float(n % 7) + 8.0) for n in (9, 17, 30, 48, 12, 25)]
    alone = [(await client.post(ROUTE, json=s)).json()["hours"] for s in stays]
    together = await asyncio.gather(*(client.post(ROUTE, json=s) for s in stays))
    assert [r.json()["hours"] for r in together] == alone


def test_runs_of_other_lengths_are_joined_step_by_step() -> None:
    """Outputs of runs padded to different lengths: per-step outputs are padded to the
    longest, each row's own steps kept."""
    from scehr.service.batcher import ModelOutputs, concat_outputs

    def run(rows: int, steps: int, fill: float) -> ModelOutputs:
        return ModelOutputs(np.zeros((rows, 2)), np.zeros((rows, 1, 2)), np.zeros((rows, 1)),
                            np.full((rows, steps, 1, 2), fill), np.full((rows, steps, 1), fill))

    out = concat_outputs([run(2, 5, 1.0), run(1, 8, 2.0)])
    assert out.probability_by_hour is not None and out.anchor_logits_by_hour is not None
    assert out.probability_by_hour.shape == (3, 8, 1)
    assert out.anchor_logits_by_hour.shape == (3, 8, 1, 2)
    assert (out.probability_by_hour[:2, :5] == 1.0).all()
    assert (out.probability_by_hour[2] == 2.0).all()
    assert out.take(2, 3).probability_by_hour.shape == (1, 8, 1)
    plain = concat_outputs([ModelOutputs(np.zeros((1, 2)), np.zeros((1, 1, 2)),
                                         np.zeros((1, 1)))] * 2)
    assert plain.probability_by_hour is None and plain.z.shape == (2, 2)


async def test_an_io_binding_fetches_the_same_hours(landmark_dir: Path) -> None:
    """SCEHR_IO_BINDING=on (the GPU path, here on the CPU) binds the per-hour outputs too."""
    stay = hourly_stay(30, late_from=12.0)
    async with serve(Settings(model_dir=landmark_dir, device="cpu", io_binding="on")) as c:
        bound = (await c.post(ROUTE, json=stay)).json()
    async with serve(Settings(model_dir=landmark_dir, device="cpu")) as c:
        plain = (await c.post(ROUTE, json=stay)).json()
    assert bound["hours"] == plain["hours"] and len(bound["hours"]) == 30


@pytest.mark.parametrize(("risks", "expected"), [
    # the silence ends exactly `silence_hours` after the last alert
    ([0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4], [1, 7]),
    # a rise counts from the last alert's risk, not from the hour before
    ([0.3, 0.33, 0.36, 0.39, 0.2, 0.41], [1, 6]),
    # abstained hours (None) inside a silence neither alert nor end it
    ([0.5, None, None, None, None, None, 0.5], [1, 7]),
    # below the threshold, however it rises
    ([0.05, 0.15, 0.25, 0.29], []),
    # a fall below the threshold and back within the silence: no new alert
    ([0.35, 0.1, 0.36], [1]),
])
def test_alert_policy_cases(risks: list[float | None], expected: list[int]) -> None:
    """The served policy (threshold 0.3, silence 6 h, re-alert on a rise of 0.1)."""
    policy = AlertPolicy.model_validate(FIXTURE_TRAJECTORY["alert_policy"])
    assert alert_hours(policy, list(range(1, len(risks) + 1)), risks) == expected
