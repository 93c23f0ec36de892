"""Export a run to `models/<task>/<version>/`: ONNX graph, manifest, model card; validated.

Every export is checked: `onnx.checker`, then ONNX Runtime against PyTorch within
`PARITY_ATOL` for batch sizes 1, 7 and 256 and several lengths; a failure raises and nothing
is registered in `models/index.json`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from schemas.contract import CONTRACT_VERSION, GRAPH
from schemas.manifest import (
    Calibration,
    ClassCard,
    EncoderSpec,
    Histogram,
    LossSpec,
    Manifest,
    MarginReference,
    NamedOperatingPoint,
    OnnxSpec,
    OperatingPoint,
    PointStats,
    PrototypeSpec,
    Provenance,
    SplitInfo,
    sha256_file,
)
from schemas.model_index import add_model, entry_for, refuse_existing
from schemas.profile import Bins, bin_index, decile_edges, value_counts
from schemas.run_artifacts import EXPORT_NEEDS, RunArtifacts, require_keys
from schemas.tasks import task_spec
from training import fairness
from training.calibration import (
    IsotonicCalibrator,
    PlattCalibrator,
    TemperatureCalibrator,
    brier,
    choose_named_points,
    expected_calibration_error,
    operating_points,
    point_stats,
)
from training.config import TrainConfig
from training.fit import load_checkpoint
from training.losses import POSITIVE_ANCHOR_ONLY
from training.metrics import auroc
from training.model_card import MIN_POSITIVES, write_model_card
from training.onnx_graph import ScoringModel, export_onnx, validate_parity

MIN_PROTOTYPE = 20


def code_version() -> str:
    """`git describe --always --dirty` of this checkout: the commit a model was built from."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=5)
        if out.returncode == 0:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def prototypes(z: np.ndarray, y: np.ndarray, seed: int = 0, k_max: int = 4) -> list[dict]:
    """Class-conditional k-means centres of training embeddings, with what they stand for.

    Centres are fitted within each outcome (k <= k_max); every training stay is then assigned
    to its nearest centre by cosine similarity, as the service does at request time, giving each
    prototype a count and an observed outcome rate. A prototype nearest to fewer than 20 stays
    is dropped (and its stays reassigned), so no prototype can stand for one patient.
    """
    from sklearn.cluster import KMeans

    centres: list[tuple[int, np.ndarray]] = []
    for label in (0, 1):
        zs = z[y == label]
        k = min(k_max, len(zs) // (2 * MIN_PROTOTYPE))
        if k >= 1:
            km = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(zs)
            # 5 decimals keep manifests small; counts below use the rounded centres.
            centres += [(label, np.round(c, 5)) for c in km.cluster_centers_]
    zn = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    while centres:
        c = np.stack([v for _, v in centres])
        cn = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
        nearest = (zn @ cn.T).argmax(axis=1)
        counts = np.bincount(nearest, minlength=len(centres))
        if counts.min() >= MIN_PROTOTYPE:
            return [{"label": lab, "centroid": v.tolist(), "count": int(counts[i]),
                     "outcome_rate": float(y[nearest == i].mean())}
                    for i, (lab, v) in enumerate(centres)]
        centres.pop(int(counts.argmin()))
    return []


NO_HOLDOUT = ("not calibrated: the run has no calibration split held out of training and "
              "early stopping (calibration_fraction = 0 or too few stays)")


def fit_calibration(cal: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                    val: tuple[np.ndarray, np.ndarray, np.ndarray], where: str,
                    logistic_input: Literal["margin", "probability"] = "margin"
                    ) -> Calibration:
    """Fit temperature, Platt and isotonic maps on `cal`; keep the best of them and none on
    `val`.

    Each triple is (y, p, margin). The choice and the reported ECE use the validation split,
    which the maps never saw, so neither number is an in-sample figure. With no held-out `cal`
    (None) nothing is fitted: validation chose the epoch, so it cannot also fit the map and
    measure its effect. The temperature map is σ(m / T) and the Platt map σ(a·m + b), m the
    margin, or logit(p) with `logistic_input="probability"`; the isotonic map interpolates p.
    """
    yv, pv, mv = val
    before = expected_calibration_error(yv, pv)
    if cal is None:
        return Calibration(method="none", fitted_on=NO_HOLDOUT, ece_before=before,
                           ece_after=before)
    yc, pc, mc = cal
    if len(np.unique(yc)) < 2:
        return Calibration(method="none", fitted_on=where, ece_before=before, ece_after=before)
    x = mc if logistic_input == "margin" else pc  # what the two logistic maps read
    temp = TemperatureCalibrator(input=logistic_input).fit(x, yc)
    platt = PlattCalibrator(input=logistic_input).fit(x, yc)
    iso = IsotonicCalibrator().fit(pc, yc).to_dict()
    candidates = [  # in order of preference on a tie: no map first
        Calibration(method="none", fitted_on=f"{where}; no map beat the model's own "
                    "probability (validation Brier)"),
        Calibration(method="temperature", input=logistic_input,
                    temperature=float(temp.to_dict()["temperature"]), fitted_on=where),
        Calibration(method="platt", input=logistic_input, slope=float(platt.slope),
                    intercept=float(platt.intercept), fitted_on=where),
        Calibration(method="isotonic", input="probability", x=list(map(float, iso["x"])),
                    y=list(map(float, iso["y"])), fitted_on=where),
    ]
    scored = [(brier(yv, c.apply(pv, mv)), i) for i, c in enumerate(candidates)]
    best = candidates[min(scored)[1]]
    return best.model_copy(update={
        "ece_before": before, "ece_after": expected_calibration_error(yv, best.apply(pv, mv))})


def _points(y: np.ndarray, p: np.ndarray,
            policy: str) -> tuple[list[OperatingPoint], float]:
    """The operating points on validation; the default threshold is the `policy` point's."""
    rows = operating_points(y, p, thresholds=[0.1, 0.2, 0.3, 0.5])
    pts = []
    for r in rows:
        if r.get("sensitivity") is None:
            continue
        name = (f"sensitivity>={r['target_sensitivity']:g}" if r.get("target_sensitivity")
                else f"threshold={r['threshold']:g}")
        pts.append(OperatingPoint(threshold=float(r["threshold"]),
                                  sensitivity=float(r["sensitivity"]),
                                  ppv=float(r["ppv"] or 0.0),
                                  specificity=float(r["specificity"] or 0.0),
                                  alert_rate=float(r["alert_rate"]), name=name))
    target = [o for o in pts if o.name == policy]
    return pts, (target[0].threshold if target else 0.5)


def named_points(val: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray] | None
                 ) -> list[NamedOperatingPoint]:
    """Operating points on the risk, chosen on validation (y, risk); test figures beside."""
    yv, rv = val
    out = []
    for name, (t, rule) in choose_named_points(yv, rv).items():
        out.append(NamedOperatingPoint(
            name=name, rule=rule, threshold=t, validation=PointStats(**point_stats(yv, rv, t)),
            test=None if test is None else PointStats(**point_stats(test[0], test[1], t))))
    return out


#: Stays of one outcome needed before its margin percentiles are stored.
MIN_REFERENCE = 20
PERCENTILES = list(range(1, 100))


def margin_reference(y: np.ndarray, margin: np.ndarray, split: str) -> MarginReference:
    """Margin percentiles 1..99 per outcome (None for an outcome with < MIN_REFERENCE stays)."""
    def q(m: np.ndarray) -> list[float] | None:
        return (np.round(np.percentile(m, PERCENTILES), 5).tolist()
                if len(m) >= MIN_REFERENCE else None)
    neg, pos = margin[y < 0.5], margin[y >= 0.5]
    return MarginReference(split=split, percentiles=[float(p) for p in PERCENTILES],
                           without_outcome=q(neg), with_outcome=q(pos),
                           n_without=len(neg), n_with=len(pos))


def histogram(values: np.ndarray, edges: list[float]) -> Histogram:
    counts = np.bincount(bin_index(values, np.asarray(edges)), minlength=len(edges) + 1)
    return Histogram(edges=edges, fractions=(counts / max(len(values), 1)).round(6).tolist(),
                     n=len(values))


def risk_reference(risk: np.ndarray) -> Histogram:
    """Validation risks in bins cut at their deciles (the served-risk drift baseline)."""
    edges = np.unique(np.round(np.quantile(risk, np.linspace(0, 1, 11)[1:-1]), 6)).tolist()
    return histogram(risk, edges)


def value_reference(cfg: dict[str, Any], data: Any = None) -> dict[str, Histogram]:
    """The training split's observed hourly values per variable in fixed bins (the PSI
    baseline), counted with `schemas.profile` exactly as the service counts served stays.

    Reads `data` (`training.fit.prepare` of the run's config), else re-reads the run's data
    folder (cached arrays) with the run's own split rules; empty when that folder is gone."""
    data = data if data is not None else prepared_data(cfg)
    if data is None:
        return {}
    train = data.raw["train"]
    fs = TrainConfig(**cfg).features()
    bins = Bins.of(fs, decile_edges(train.x, train.lengths, fs))
    counts = value_counts(train.x, train.lengths, fs, bins).sum(axis=0)  # [V, width]
    out = {}
    for k, var in enumerate(fs.variables):
        nb = bins.n_bins(fs, k)
        c = counts[k, :nb]
        if c.sum() == 0:
            continue
        edges = bins.edges[k]
        out[var.id] = Histogram(edges=[] if edges is None else edges.tolist(),
                                fractions=(c / c.sum()).round(6).tolist(), n=int(c.sum()))
    return out


def prepared_data(cfg: dict[str, Any]) -> Any:
    """The run's splits as training prepared them (`training.fit.prepare`); None when its data
    folder is gone."""
    from training.fit import prepare

    return prepare(TrainConfig(**cfg)) if Path(cfg["data"]).is_dir() else None


#: The point used when a request names none: the same rule as contract 1.0's single threshold
#: (sensitivity >= 0.8), now on the risk; a request picks another by name.
DEFAULT_POINT = "high_sensitivity"


def _default_point(named: list[NamedOperatingPoint]) -> str | None:
    names = [p.name for p in named]
    return DEFAULT_POINT if DEFAULT_POINT in names else (names[0] if names else None)


def subgroup_auroc(y: np.ndarray, p: np.ndarray, static_raw: np.ndarray) -> dict[str, Any]:
    """Test AUROC by sex and age band (the fairness audit's groups), with counts; None where
    undefined."""
    out = {}
    for name, m in fairness.groups(static_raw).items():
        if name == "all":
            continue
        a = auroc(y[m], p[m]) if m.sum() > 1 else float("nan")
        out[name] = {"n": int(m.sum()), "positives": int(y[m].sum()),
                     "auroc": None if np.isnan(a) else float(a)}
    return out


def fairness_at_export(model: Any, crit: Any, data: Any, preds: dict[str, np.ndarray],
                       card: ClassCard) -> dict[str, Any] | None:
    """The fairness audit of a binary model on its test split (training.fairness).

    Alerts are the risk at or above the default named operating point. The sex flip re-scores
    the test stays, so it needs the run's data folder (`data`, from `training.fit.prepare`);
    None when that is gone or no operating point was reachable.
    """
    from training.fit import predict

    point = {p.name: p for p in card.named_points}.get(card.default_operating_point or "")
    if data is None or point is None:
        return None
    test = data.test
    if list(test.stays) != [str(s) for s in preds["test_stays"]]:
        raise ValueError("the run's data folder no longer holds the test stays it was "
                         "trained with: cannot audit the model on them")
    raw = preds["test_static_raw"]

    def risk(split: Any) -> np.ndarray:
        out = predict(model, crit, split)
        lg = out["anchor_logits"][:, 0]
        return card.calibration.apply(out["probability"][:, 0], lg[:, 0] - lg[:, 1])

    flipped_static = torch.from_numpy(data.static_imputer.transform(fairness.flip_sex(raw)))
    r = risk(test)
    rf = risk(dataclasses.replace(test, static=flipped_static))
    t = point.threshold
    return fairness.audit(preds["test_y"][:, 0], r, r >= t, raw, rf, rf >= t,
                          where=f"the test split ({len(r)} stays)",
                          alert_rule=f"risk >= {t:.4f} (operating point `{point.name}`, "
                          "chosen on validation)")


def float32_lists(a: np.ndarray) -> list:
    """Nested lists of the shortest decimals that read back as the same float32 values."""
    a = np.asarray(a, dtype=np.float32)
    flat = [float(np.format_float_scientific(x, unique=True)) for x in a.ravel()]
    return np.array(flat, dtype=np.float64).reshape(a.shape).tolist()


_NUMBER_LIST = re.compile(r"\[\s+(-?[\d.eE+-]+(?:,\s+-?[\d.eE+-]+)*)\s+\]")


def manifest_json(manifest: Manifest) -> str:
    """Indented JSON with every list of numbers on one line: readable, and about half the size."""
    text = manifest.model_dump_json(indent=2)
    return _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text) + "\n"


def too_rare(test: dict[str, Any]) -> list[str]:
    """Labels with fewer than MIN_POSITIVES positive test stays: flagged, not evaluated."""
    n = int(test.get("n", 0))
    return [k for k, p in test.get("prevalence", {}).items() if round(p * n) < MIN_POSITIVES]


def export_run(run_dir: Path, out: Path, *, version: str | None = None, name: str | None = None,
               set_default: bool = False, reproduce: str | None = None,
               limitations: list[str] | None = None, data_description: str | None = None
               ) -> tuple[Path, list[str]]:
    """Export, validate and register one run; returns the model folder and what changed.

    Refuses an existing version (in the index or on disk) before doing any work; the task's
    default moves only with `set_default` (or when the task has no default yet).
    """
    files = RunArtifacts(run_dir)
    files.require(files.checkpoint, files.predictions, files.metrics)
    model, crit, ck = load_checkpoint(files.checkpoint)
    cfg = ck["config"]
    task = cfg["task"]
    fs = TrainConfig(**cfg).features()
    refuse_existing(out.parent.parent, task, version or out.name, out)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / "model.onnx"
    scoring = ScoringModel(model.encoder, model.head, crit.probability).eval()
    uses_static = bool(ck["encoder"]["uses_static"])
    spec = task_spec(task)
    dynamic = spec.dynamic_length
    export_onnx(scoring, onnx_path, n_features=ck["n_features"],
                n_static=ck["n_static"] if uses_static else 0,
                seq_len=int(fs.n_bins(fs.window_hours)) if fs.window_hours else 48,
                dynamic_length=dynamic, opset=GRAPH.opset)
    parity = validate_parity(scoring, onnx_path, atol=GRAPH.parity_atol)

    preds = dict(np.load(files.predictions))
    require_keys(preds, EXPORT_NEEDS, str(files.predictions))
    metrics = json.loads(files.metrics.read_text())
    labels = ck["label_names"]
    u, v = model.head.anchors()
    has_calib = "calib_y" in preds and len(preds["calib_y"]) > 0
    classes = []
    where = (f"calibration split ({cfg.get('calibration_fraction', 0.1):.0%} of training stays, "
             "held out of training and early stopping); chosen and scored on validation")
    logistic_input: Literal["margin", "probability"] = (
        "probability" if cfg["loss"] in POSITIVE_ANCHOR_ONLY else "margin")

    def triple(split: str, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lg = preds[f"{split}_anchor_logits"][:, c]
        return preds[f"{split}_y"][:, c], preds[f"{split}_probability"][:, c], lg[:, 0] - lg[:, 1]

    def risk(cal: Calibration, split: str, c: int) -> tuple[np.ndarray, np.ndarray]:
        y, p, m = triple(split, c)
        return y, cal.apply(p, m)

    for c, label in enumerate(labels):
        calib = fit_calibration(triple("calib", c) if has_calib else None, triple("val", c),
                                where, logistic_input)
        pts, thr = _points(preds["val_y"][:, c], preds["val_probability"][:, c],
                           spec.default_operating_point)
        protos = prototypes(preds["train_z"], preds["train_y"][:, c])
        val_risk = risk(calib, "val", c)
        named = named_points(val_risk, risk(calib, "test", c))
        ref_split = "calib" if has_calib else "val"
        yr, _, mr = triple(ref_split, c)
        classes.append(ClassCard(
            label=label, calibration=calib, operating_points=pts, default_threshold=thr,
            prototypes=[PrototypeSpec(**p) for p in protos], named_points=named,
            default_operating_point=_default_point(named),
            margin_reference=margin_reference(
                yr, mr, "calibration split (held out of training and early stopping)"
                if has_calib else "validation split"),
            risk_reference=risk_reference(val_risk[1])))
    prov = _provenance(Path(cfg["data"]), metrics, preds, data_description or "")
    data = prepared_data(cfg)
    audit = fairness_at_export(model, crit, data, preds, classes[0]) if spec.binary else None
    version = version or out.name
    manifest = Manifest(
        contract_version=CONTRACT_VERSION,
        name=name or f"scehr-{task}-{cfg['encoder']}-{cfg['loss']}",
        version=version, task=task, label_names=labels,
        loss=LossSpec(name=cfg["loss"], lam=cfg["lam"], temperature=cfg["temperature"],
                      params=cfg["loss_params"]),
        encoder=EncoderSpec(**ck["encoder"]),
        feature_set=fs.manifest_dict(), normalizer=ck["normalizer"],
        static=ck["static"] if uses_static else None,
        coverage=ck["coverage"],
        anchors={"u": float32_lists(u.numpy()), "v": float32_lists(v.numpy())},
        classes=classes,
        metrics={"test": metrics["test"], "test_ci": metrics["test_ci"],
                 "val": metrics["val"],
                 **({"too_rare_to_evaluate": too_rare(metrics["test"])}
                    if spec.multi_label else {}),
                 **({"subgroups": subgroup_auroc(preds["test_y"][:, 0],
                                                 preds["test_probability"][:, 0],
                                                 preds["test_static_raw"])}
                    if spec.binary else {}),
                 **({"fairness": audit} if audit else {})},
        provenance=prov,
        onnx=OnnxSpec(sha256=sha256_file(onnx_path), opset=GRAPH.opset,
                      inputs=GRAPH.input_names(uses_static),
                      outputs=list(GRAPH.output_names), dynamic_length=dynamic,
                      parity_max_abs_error={k: float(e) for k, e in parity.items()}),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        code_version=code_version(),
        notes=[f"trained by: scehr train --config {run_dir}/config.json",
               "not for clinical use without local validation"],
        value_reference=value_reference(cfg, data),
    )
    (out / "manifest.json").write_text(manifest_json(manifest))
    command = reproduce or (f"scehr train --config {run_dir / 'config.json'}\n"
                            f"scehr export {run_dir} --out {out}")
    write_model_card(out, manifest, command, limitations)
    changes = register(out, manifest, set_default)
    return out, changes


def _provenance(data: Path, metrics: dict, preds: dict[str, np.ndarray], description: str
                ) -> Provenance:
    info: dict[str, Any] = {}
    for candidate in (data / "provenance.json", data.parent / "provenance.json"):
        if candidate.is_file():
            info = json.loads(candidate.read_text())
            break
    splits = {}
    for s in ("val", "test", "calib"):
        if f"{s}_y" in preds:
            splits[s] = SplitInfo(n=len(preds[f"{s}_y"]),
                                  prevalence=preds[f"{s}_y"].mean(axis=0).round(4).tolist())
    splits["train"] = SplitInfo(n=int(metrics["n"]["train"]),
                                prevalence=[round(float(x), 4)
                                            for x in metrics["train_prevalence"]])
    return Provenance(dataset=str(info.get("source", data.name)),
                      description=description,
                      splits=splits, source=str(info.get("converter", "")))


def register(folder: Path, manifest: Manifest, set_default: bool) -> list[str]:
    """Add the model to `<models>/index.json` (schemas.model_index); returns what changed."""
    root = folder.parent.parent
    return add_model(root, entry_for(folder, root, manifest), set_default=set_default)
