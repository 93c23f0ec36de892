"""Train -> export -> serve, end to end on tiny synthetic models of both tasks.

The exported folder must hold a valid manifest (contract, sha256, calibration, prototypes of
at least 20 stays, operating points), a model card and an index entry; and the service must
score the example payloads with exactly PyTorch's probabilities for the same tensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.featureset import TASK_FEATURE_SETS
from scehr.schemas.ingest import ingest
from scehr.schemas.manifest import load_manifest, sha256_file
from scehr.schemas.payloads import StayPayload
from scehr.schemas.tensorize import Normalizer, StaticImputer, discretize
from scehr.service.settings import Settings
from scehr.training.config import TrainConfig
from scehr.training.data.synthetic import write_synthetic
from scehr.training.export import export_run, prototypes
from scehr.training.fit import load_checkpoint
from scehr.training.reissue import SplitMismatch, held_out_uncertainty
from scehr.training.reissue import main as reissue_main
from scehr.training.run import train_run
from tests.service.conftest import serve

REPO = Path(__file__).resolve().parents[2]
TINY = {"units": 4, "depth": 1, "bidirectional": False, "dropout": 0.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    data = write_synthetic(root / "data", "both", n_train=240, n_test=80, prevalence=0.3, seed=1)
    out = root / "models"
    # mortality: an LSTM that also reads demographics (the `static` input); phenotypes: without.
    for task, loss, static in (("mortality", "cbce", True), ("phenotypes", "csce", False)):
        cfg = TrainConfig(task=task, data=str(data), out=str(root / f"run-{task}"),
                          encoder="lstm", encoder_hparams={**TINY, "static": static},
                          loss=loss, lam=0.01,
                          batch_size=32, epochs=2, seed=0, threads=1, n_boot=20, tsne=False,
                          progress=False)
        train_run(cfg)
        export_run(root / f"run-{task}", out / task / "0.1.0")
    return out


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
def test_export_writes_a_valid_manifest_card_and_index(models: Path, task: str) -> None:
    folder = models / task / "0.1.0"
    m = load_manifest(folder / "manifest.json")
    assert m.task == task and m.onnx.sha256 == sha256_file(folder / "model.onnx")
    assert max(m.onnx.parity_max_abs_error.values()) <= 1e-5
    assert m.onnx.dynamic_length == (task == "phenotypes")
    assert ("static" in m.onnx.inputs) == m.encoder.uses_static == (task == "mortality")
    assert len(m.classes) == len(m.label_names) == (1 if task == "mortality" else 25)
    assert np.array(m.anchors["u"]).shape == (len(m.label_names), 4)
    assert all(p.count >= 20 for c in m.classes for p in c.prototypes)
    assert m.classes[0].operating_points and m.metrics["test_ci"]
    assert m.provenance.splits["train"].n > 0 and "calib" in m.provenance.splits
    card = (folder / "MODEL_CARD.md").read_text()
    assert "not for clinical use" in card.lower() and "scehr export" in card
    # contract 1.1 serving assets: points on the risk, margin percentiles, drift references
    assert m.contract_version == CONTRACT_VERSION
    for c in m.classes:
        for pt in c.named_points:
            assert pt.name in ("high_sensitivity", "balanced", "high_ppv")
            assert 0 < pt.threshold < 1 and pt.test is not None
            assert pt.validation.n == m.provenance.splits["val"].n
        assert c.default_operating_point in {pt.name for pt in c.named_points} | {None}
        assert c.risk_reference is not None and sum(c.risk_reference.fractions) == (
            pytest.approx(1.0, abs=1e-4))
        ref = c.margin_reference
        assert ref is not None and ref.percentiles[0] == 1 and ref.percentiles[-1] == 99
        assert ref.n_without + ref.n_with == m.provenance.splits["calib"].n
        # contract 1.4: every class carries its uncertainty map, fitted on the held-out split
        u = c.uncertainty
        assert u is not None and u.n == m.provenance.splits["calib"].n
        assert u.validation is not None and u.validation.n == m.provenance.splits["val"].n
    assert any(c.named_points for c in m.classes)
    assert "## Operating points (thresholds on the risk)" in card
    assert m.value_reference and all(
        sum(h.fractions) == pytest.approx(1.0, abs=1e-4) for h in m.value_reference.values())
    index = json.loads((models / "index.json").read_text())
    assert index["defaults"][task] == "0.1.0"


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
def test_reissue_fits_the_exported_uncertainty_map_from_the_onnx_graph(models: Path, task: str
                                                                       ) -> None:
    """Re-issue rebuilds the held-out splits and scores them with the ONNX graph: the same
    map as export's (fitted on PyTorch's predictions), and a wrong split is refused."""
    folder = models / task / "0.1.0"
    run = models.parent / f"run-{task}"
    data = models.parent / "data"
    maps = held_out_uncertainty(folder, run / "config.json", data)
    shipped = load_manifest(folder / "manifest.json").classes
    assert len(maps) == len(shipped)
    for got, card in zip(maps, shipped, strict=True):
        want = card.uncertainty
        assert want is not None and got.level == want.level and got.n == want.n
        assert got.event_from == pytest.approx(want.event_from, abs=1e-5)
        assert got.no_event_up_to == pytest.approx(want.no_event_up_to, abs=1e-5)
        assert got.validation is not None and want.validation is not None
        assert got.validation.coverage == pytest.approx(want.validation.coverage, abs=0.02)
    cfg = json.loads((run / "config.json").read_text())
    wrong = models.parent / f"wrong-{task}.json"
    wrong.write_text(json.dumps({**cfg, "seed": cfg["seed"] + 5}))
    with pytest.raises(SplitMismatch, match="not the"):
        held_out_uncertainty(folder, wrong, data)


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
def test_reissue_chooses_the_points_again_in_order_on_the_same_graph_and_maps(
        models: Path, task: str) -> None:
    """--points: every class's points are chosen again on the rebuilt validation split (the
    order rule) and screened; the graph, the calibration and the uncertainty map stay."""
    from scehr.training.calibration import named_point_rules
    from scehr.training.reissue import held_out_outputs, served_risks

    folder, run, data = models / task / "0.1.0", models.parent / f"run-{task}", \
        models.parent / "data"
    out = models.parent / "reissued" / task / "0.1.1"
    assert reissue_main([str(folder), str(out), "--points", str(run / "config.json"),
                         "--data", str(data)]) == 0
    old, new = (load_manifest(f / "manifest.json") for f in (folder, out))
    assert new.onnx.sha256 == old.onnx.sha256 and "chosen again" in new.notes[-1]
    # the note says what was done: neither the uncertainty map nor the figures were refitted
    assert "uncertainty map" not in new.notes[-1] and "served risk" not in new.notes[-1]
    yv, rv = served_risks(old, held_out_outputs(folder, run / "config.json", data))["val"]
    for c, (was, card) in enumerate(zip(old.classes, new.classes, strict=True)):
        # the fields (the maps' private caches fill as the maps are applied)
        assert card.calibration.model_dump() == was.calibration.model_dump()
        assert card.uncertainty == was.uncertainty
        chosen, _ = named_point_rules(yv[:, c], rv[:, c])
        served = {p.name: p for p in card.named_points}
        assert {p.name for p in card.withheld_points} | set(served) == {
            "high_sensitivity", "balanced", "high_ppv"}
        for name, p in served.items():
            assert p.threshold == chosen[name][0] and p.rule == chosen[name][1]
        thresholds = [p.threshold for p in card.named_points]  # stored in the names' order
        ppv = [p.validation.ppv for p in card.named_points]
        assert thresholds == sorted(thresholds) and ppv == sorted(ppv), card.label
        if card.levels is not None:
            assert {card.levels.warning, card.levels.critical} - {None} <= set(served)


def _served(folder: Path, run: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, score, risk) [N, C] of a run's saved predictions, the risk through the manifest's
    maps (the service's read-out)."""
    saved = np.load(run / "predictions.npz")
    y, p = saved[f"{split}_y"], saved[f"{split}_probability"]
    lg = saved[f"{split}_anchor_logits"]
    margin = lg[..., 0] - lg[..., 1]
    cards = load_manifest(folder / "manifest.json").classes
    risk = np.stack([k.calibration.apply(p[:, c], margin[:, c]) for c, k in enumerate(cards)],
                    axis=1)
    return y, p, risk


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
def test_the_served_risk_ranks_stays_as_the_score_does(models: Path, task: str) -> None:
    """Every class's map keeps its score's ranking (the CBCE model's too, whose score is not a
    function of the anchor margin that its maps used to read): same order, no ties where the
    scores differ, so the risk's AUROC is the score's."""
    from scehr.training.metrics import auroc

    y, p, risk = _served(models / task / "0.1.0", models.parent / f"run-{task}", "test")
    for c in range(p.shape[1]):
        order = np.argsort(p[:, c], kind="stable")
        ps, rs = p[order, c], risk[order, c]
        distinct = np.diff(ps) > 0
        assert np.all(np.diff(rs)[distinct] > 0) and np.all(np.diff(rs)[~distinct] == 0), c
        if 0 < y[:, c].sum() < len(y):
            assert auroc(y[:, c], risk[:, c]) == pytest.approx(auroc(y[:, c], p[:, c]),
                                                               abs=1e-12)


@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
def test_the_card_figures_are_the_served_risks(models: Path, task: str) -> None:
    """The manifest's (and so the card's and the index's) test figures are those of the risk
    the service serves, the uncalibrated score's beside them."""
    from scehr.training.metrics import task_metrics

    folder = models / task / "0.1.0"
    m = load_manifest(folder / "manifest.json")
    y, _, risk = _served(folder, models.parent / f"run-{task}", "test")
    want = task_metrics(task, y, risk, m.label_names)
    assert m.metrics["computed_on"] == "risk"
    head = want["headline"]
    assert m.metrics["test"][head] == pytest.approx(want[head], abs=1e-9)
    assert m.metrics["test_ci"][head]["value"] == pytest.approx(want[head], abs=1e-9)
    trained = json.loads((models.parent / f"run-{task}" / "metrics.json").read_text())
    assert m.metrics["score"]["test"] == trained["test"]
    if task == "mortality":  # the calibration changes the ECE, not the ranking
        assert m.metrics["test"]["ece"] == pytest.approx(want["ece"], abs=1e-12)
    card = (folder / "MODEL_CARD.md").read_text()
    assert "Computed on the served `risk`" in card
    assert f"| {head} | {want[head]:.3f} [" in card


def test_a_recalibrated_reissue_serves_and_states_the_figures_of_its_risk(
        models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m scehr.training.reissue --recalibrate` refits the maps on the held-out split
    rebuilt from the run's config, scored by the ONNX graph: the new card's figures are of its
    served risk, the score's beside them, and the graph is the shipped one."""
    from scehr.training.metrics import task_metrics
    from scehr.training.reissue import held_out_outputs, main

    folder, run, data = models / "phenotypes" / "0.1.0", models.parent / "run-phenotypes", (
        models.parent / "data")
    out = models / "phenotypes" / "0.1.1"
    assert main([str(folder), str(out), "--recalibrate", str(run / "config.json"),
                 "--data", str(data)]) == 0
    assert "wrote" in capsys.readouterr().out
    m = load_manifest(out / "manifest.json")
    assert (out / "model.onnx").read_bytes() == (folder / "model.onnx").read_bytes()
    y, p, mg = held_out_outputs(out, run / "config.json", data)["test"]
    risk = np.stack([k.calibration.apply(p[:, c], mg[:, c]) for c, k in enumerate(m.classes)],
                    axis=1)
    for key, values in (("test", risk), ("score", p)):
        got = m.metrics["test"] if key == "test" else m.metrics["score"]["test"]
        want = task_metrics("phenotypes", y, values, m.label_names)
        assert got["micro_auroc"] == pytest.approx(want["micro_auroc"], abs=1e-9)
        assert got["macro_auroc"] == pytest.approx(want["macro_auroc"], abs=1e-9)
    assert all(k.uncertainty is not None for k in m.classes)
    assert "refitted" in (out / "MODEL_CARD.md").read_text()


def test_prototypes_never_stand_for_fewer_than_20_stays() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 3))
    y = (rng.random(300) < 0.1).astype(float)  # ~30 positives
    protos = prototypes(z, y)
    assert protos and all(p["count"] >= 20 for p in protos)
    assert sum(p["count"] for p in protos) == 300
    rates = [p["outcome_rate"] for p in protos]
    assert all(0.0 <= r <= 1.0 for r in rates)


def torch_probability(run_dir: Path, payload: dict) -> np.ndarray:
    """PyTorch's probability for one payload, tensorized the way the service does it."""
    model, crit, ck = load_checkpoint(run_dir / "model.pt")
    fs = TASK_FEATURE_SETS[ck["config"]["task"]]
    r = ingest([StayPayload.model_validate(payload)], fs)
    x, lengths = discretize(r.observations, fs, r.end_hours)
    x = Normalizer.from_dict(ck["normalizer"]).transform(x, lengths)
    static = StaticImputer.from_dict(ck["static"]).transform(r.static_raw)
    with torch.no_grad():
        _, logits = model(torch.from_numpy(x), torch.from_numpy(lengths),
                          torch.from_numpy(static))
        return crit.probability(logits).numpy()[0]


@pytest.mark.anyio
@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
async def test_service_scores_exported_models_like_pytorch(models: Path, task: str) -> None:
    # these models read the task's benchmark feature set: its example, not the default's
    name = {"mortality": "mortality_stay_benchmark17.json"}.get(task, f"{task}_stay.json")
    payload = json.loads((REPO / "examples" / name).read_text())
    expected = torch_probability(models.parent / f"run-{task}", payload)
    async with serve(Settings(model_dir=models, device="cpu")) as client:
        r = await client.post(f"/predict/{task}", json=payload)
    assert r.status_code == 200, r.text
    got = np.array([c["score"] for c in r.json()["results"]])
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_no_held_out_split_means_no_calibration(tmp_path: Path) -> None:
    """Validation chose the epoch, so it may not also fit the calibration map (nor score it)."""
    data = write_synthetic(tmp_path / "data", "mortality", n_train=160, n_test=60,
                           prevalence=0.3, seed=2)
    cfg = TrainConfig(task="mortality", data=str(data), out=str(tmp_path / "run"),
                      encoder="lstm", encoder_hparams=dict(TINY), loss="bce", lam=0.0,
                      batch_size=32, epochs=1, seed=0, threads=1, n_boot=10, tsne=False,
                      progress=False, calibration_fraction=0.0)
    train_run(cfg)
    export_run(tmp_path / "run", tmp_path / "models" / "mortality" / "0.0.1")
    m = load_manifest(tmp_path / "models" / "mortality" / "0.0.1" / "manifest.json")
    cal = m.classes[0].calibration
    assert cal.method == "none" and "no calibration split" in cal.fitted_on
    assert cal.ece_after == cal.ece_before and "calib" not in m.provenance.splits


def test_temperature_of_a_positive_anchor_loss_ignores_the_untrained_negative_anchor() -> None:
    """For BCE/focal p = σ(uᵀz) and v is never trained: the map must rank stays as p does."""
    from scehr.training.export import fit_calibration
    from scehr.training.losses import POSITIVE_ANCHOR_ONLY

    assert {"bce", "focal"} <= POSITIVE_ANCHOR_ONLY and "cbce" not in POSITIVE_ANCHOR_ONLY
    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u, v = rng.normal(0, 2, n), rng.normal(0, 0.5, n)  # v: an untrained anchor's logit
        y = (rng.random(n) < 1 / (1 + np.exp(-u / 2))).astype(float)  # over-confident p
        return y, 1 / (1 + np.exp(-u)), u - v

    cal, val = split(60), split(4000)
    c = fit_calibration(cal, val, "test", logistic_input="probability")
    assert c.method == "temperature" and c.input == "probability"
    assert c.temperature == pytest.approx(2.0, rel=0.5)
    out = c.apply(val[1], val[2])  # the read-out the service serves
    order = np.argsort(val[1])
    assert np.all(np.diff(out[order]) >= 0)  # same ranking as the model's probability


def wide_payload(csv: Path, end_hours: float, age: float, sex_male: float) -> dict:
    """A benchmark timeseries CSV as the API's wide form, with the stay's length."""
    import pandas as pd

    from scehr.schemas.variables import VARIABLES

    table = pd.read_csv(csv, dtype=str, keep_default_na=False)
    columns: dict[str, list] = {}
    for v in VARIABLES:
        cells = table[v.benchmark_name].tolist()
        if v.is_categorical:
            columns[v.benchmark_name] = [c or None for c in cells]
        else:
            columns[v.benchmark_name] = [float(c) if c else None for c in cells]
    units = {v.benchmark_name: v.unit for v in VARIABLES if v.unit_required}
    demo: dict = {}
    if not np.isnan(age):
        demo["age"] = age
    if not np.isnan(sex_male):
        demo["sex"] = "male" if sex_male == 1 else "female"
    return {"end_hours": end_hours, "demographics": demo,
            "wide": {"hours": table["Hours"].astype(float).tolist(), "columns": columns,
                     "units": units}}


@pytest.mark.anyio
@pytest.mark.parametrize("task", ["mortality", "phenotypes"])
async def test_served_probabilities_equal_the_evaluated_ones(models: Path, task: str) -> None:
    """Test stays sent as the API's wide form score exactly as training evaluated them."""
    import pandas as pd

    folder = "in-hospital-mortality" if task == "mortality" else "phenotyping"
    split = models.parent / "data" / folder / "test"
    listing = pd.read_csv(split / "listfile.csv").head(12)
    demo = pd.read_csv(split / "demographics.csv").set_index("stay")
    ends = listing["period_length"] if task == "phenotypes" else [48.0] * len(listing)
    stays = [wide_payload(split / s, float(e), *demo.loc[s, ["age", "sex_male"]])
             for s, e in zip(listing["stay"], ends, strict=True)]
    saved = np.load(models.parent / f"run-{task}" / "predictions.npz")
    row = {s: i for i, s in enumerate(saved["test_stays"].tolist())}
    expected = saved["test_probability"][[row[s] for s in listing["stay"]]]
    async with serve(Settings(model_dir=models, device="cpu")) as client:
        r = await client.post(f"/predict/{task}/batch", json={"stays": stays})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    got = np.array([[c["score"] for c in it["prediction"]["results"]] for it in items])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_export_refuses_an_existing_version_and_keeps_the_default(
        models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`scehr export` never overwrites a version, and moves the default only when asked."""
    from scehr.cli import build_parser, main
    from scehr.schemas.model_index import ModelIndexError

    run = models.parent / "run-mortality"
    before = (models / "mortality" / "0.1.0" / "model.onnx").read_bytes()
    with pytest.raises(ModelIndexError, match="immutable"):
        export_run(run, models / "mortality" / "0.1.0", set_default=True)
    assert (models / "mortality" / "0.1.0" / "model.onnx").read_bytes() == before
    assert main(["export", str(run), "--out", str(models / "mortality" / "0.2.0")]) == 0
    out = capsys.readouterr().out
    assert "added mortality 0.2.0" in out and "default mortality stays 0.1.0" in out
    assert json.loads((models / "index.json").read_text())["defaults"]["mortality"] == "0.1.0"
    parser, _ = build_parser("export")
    assert parser.parse_args(["export", str(run), "--out", "x", "--set-default"]).set_default
    assert main(["models", "set-default", "mortality", "0.2.0", "--model-dir", str(models)]) == 0
    assert "default mortality: 0.1.0 -> 0.2.0" in capsys.readouterr().out
    assert main(["models", "set-default", "mortality", "0.1.0", "--model-dir", str(models)]) == 0


def test_mortality_card_carries_the_fairness_audit(models: Path) -> None:
    folder = models / "mortality" / "0.1.0"
    m = load_manifest(folder / "manifest.json")
    audit = m.metrics["fairness"]
    groups = audit["groups"]
    assert groups["all"]["n"] == m.provenance.splits["test"].n
    assert groups["sex=female"]["n"] + groups["sex=male"]["n"] <= groups["all"]["n"]
    assert set(groups["all"]) >= {"auroc", "calibration_slope", "calibration_intercept",
                                  "alert_rate"}
    flip = audit["sex_flip"]  # the model reads demographics, so a flip moves some risk
    assert flip["n"] > 0 and flip["max"] > 0 and flip["median"] <= flip["max"]
    card = (folder / "MODEL_CARD.md").read_text()
    assert "## Fairness audit" in card and "What it means" in card
    assert "fairness" not in load_manifest(models / "phenotypes" / "0.1.0" / "manifest.json"
                                           ).metrics


def test_scehr_export_prints_no_torchvision_warnings(models: Path, tmp_path: Path) -> None:
    """torch's exporter logs "torchvision is not installed. Skipping torchvision::nms" (and
    three more detection ops) on every export; no scehr graph uses them: `scehr export` says
    nothing of them. A process of its own: torch's log handler writes to the stderr it found
    at import."""
    out = tmp_path / "models" / "mortality" / "0.2.0"
    res = subprocess.run([sys.executable, "-m", "scehr.cli", "export",
                          str(models.parent / "run-mortality"), "--out", str(out)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert (out / "model.onnx").is_file()
    assert "torchvision" not in res.stderr + res.stdout, res.stderr
