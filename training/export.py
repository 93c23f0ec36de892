"""Export a run to `models/<task>/<version>/`: ONNX graph, manifest, model card; validated.

Every export is checked: `onnx.checker`, then ONNX Runtime against PyTorch within
`PARITY_ATOL` for batch sizes 1, 7 and 256 and several lengths; a failure raises and nothing
is registered in `models/index.json`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Literal

import numpy as np

from schemas.contract import CONTRACT_VERSION, GRAPH
from schemas.manifest import (
    Calibration,
    ClassCard,
    EncoderSpec,
    LossSpec,
    Manifest,
    OnnxSpec,
    OperatingPoint,
    PrototypeSpec,
    Provenance,
    SplitInfo,
    sha256_file,
)
from schemas.model_index import add_model, entry_for, refuse_existing
from schemas.run_artifacts import EXPORT_NEEDS, RunArtifacts, require_keys
from schemas.tasks import task_spec
from training.calibration import (
    IsotonicCalibrator,
    TemperatureCalibrator,
    brier,
    expected_calibration_error,
    operating_points,
)
from training.config import TrainConfig
from training.fit import load_checkpoint
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


#: Losses whose probability ignores the negative anchor (p = σ(uᵀz)): v is never trained, so
#: their temperature map is fitted on logit(p) = uᵀz instead of the margin uᵀz − vᵀz.
POSITIVE_ANCHOR_ONLY = frozenset({"bce", "focal"})
NO_HOLDOUT = ("not calibrated: the run has no calibration split held out of training and "
              "early stopping (calibration_fraction = 0 or too few stays)")


def fit_calibration(cal: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                    val: tuple[np.ndarray, np.ndarray, np.ndarray], where: str,
                    temperature_input: Literal["margin", "probability"] = "margin"
                    ) -> Calibration:
    """Fit temperature and isotonic maps on `cal`; keep the best of them and none on `val`.

    Each triple is (y, p, margin). The choice and the reported ECE use the validation split,
    which the maps never saw, so neither number is an in-sample figure. With no held-out `cal`
    (None) nothing is fitted: validation chose the epoch, so it cannot also fit the map and
    measure its effect. The temperature map is σ(margin / T), or σ(logit(p) / T) with
    `temperature_input="probability"`; the isotonic map interpolates p.
    """
    yv, pv, mv = val
    before = expected_calibration_error(yv, pv)
    if cal is None:
        return Calibration(method="none", fitted_on=NO_HOLDOUT, ece_before=before,
                           ece_after=before)
    yc, pc, mc = cal
    if len(np.unique(yc)) < 2:
        return Calibration(method="none", fitted_on=where, ece_before=before, ece_after=before)
    by_margin = temperature_input == "margin"
    temp = TemperatureCalibrator(input=temperature_input).fit(mc if by_margin else pc, yc)
    iso = IsotonicCalibrator().fit(pc, yc).to_dict()
    candidates = [  # in order of preference on a tie: no map first
        Calibration(method="none", fitted_on=f"{where}; no map beat the model's own "
                    "probability (validation Brier)"),
        Calibration(method="temperature", input=temperature_input,
                    temperature=float(temp.to_dict()["temperature"]), fitted_on=where),
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


def subgroup_auroc(y: np.ndarray, p: np.ndarray, static_raw: np.ndarray) -> dict[str, Any]:
    """Test AUROC by sex and age band (mortality), with counts; None where undefined."""
    age, male = static_raw[:, 0], static_raw[:, 1]
    groups = {
        "sex=female": male == 0, "sex=male": male == 1,
        "age<50": age < 50, "age 50-69": (age >= 50) & (age < 70),
        "age 70-79": (age >= 70) & (age < 80), "age>=80": age >= 80,
    }
    out = {}
    for name, m in groups.items():
        a = auroc(y[m], p[m]) if m.sum() > 1 else float("nan")
        out[name] = {"n": int(m.sum()), "positives": int(y[m].sum()),
                     "auroc": None if np.isnan(a) else float(a)}
    return out


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
    temperature_input: Literal["margin", "probability"] = (
        "probability" if cfg["loss"] in POSITIVE_ANCHOR_ONLY else "margin")

    def triple(split: str, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lg = preds[f"{split}_anchor_logits"][:, c]
        return preds[f"{split}_y"][:, c], preds[f"{split}_probability"][:, c], lg[:, 0] - lg[:, 1]

    for c, label in enumerate(labels):
        calib = fit_calibration(triple("calib", c) if has_calib else None, triple("val", c),
                                where, temperature_input)
        pts, thr = _points(preds["val_y"][:, c], preds["val_probability"][:, c],
                           spec.default_operating_point)
        protos = prototypes(preds["train_z"], preds["train_y"][:, c])
        classes.append(ClassCard(label=label, calibration=calib, operating_points=pts,
                                 default_threshold=thr,
                                 prototypes=[PrototypeSpec(**p) for p in protos]))
    prov = _provenance(Path(cfg["data"]), metrics, preds, data_description or "")
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
                    if spec.binary else {})},
        provenance=prov,
        onnx=OnnxSpec(sha256=sha256_file(onnx_path), opset=GRAPH.opset,
                      inputs=GRAPH.input_names(uses_static),
                      outputs=list(GRAPH.output_names), dynamic_length=dynamic,
                      parity_max_abs_error={k: float(e) for k, e in parity.items()}),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        code_version=code_version(),
        notes=[f"trained by: scehr train --config {run_dir}/config.json",
               "not for clinical use without local validation"],
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
