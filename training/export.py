"""Export a run to `models/<task>/<version>/`: ONNX graph, manifest, model card; validated.

This module assembles and registers; each asset has its own module: the per-class serving assets
(calibration, operating points, prototypes, margin reference) in `scehr.training.serving_assets`,
the drift references in `scehr.training.drift_reference`, the subgroup AUROC and fairness audit in
`scehr.training.fairness`, the graph in `scehr.training.onnx_graph` and the card in
`scehr.training.model_card`.

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
from typing import Any

import numpy as np

from scehr.schemas.contract import CONTRACT_VERSION, GRAPH
from scehr.schemas.manifest import (
    Calibration,
    ClassCard,
    EncoderSpec,
    LossSpec,
    Manifest,
    OnnxSpec,
    PrototypeSpec,
    Provenance,
    SplitInfo,
    sha256_file,
)
from scehr.schemas.model_index import add_model, entry_for, refuse_existing
from scehr.schemas.run_artifacts import EXPORT_NEEDS, RunArtifacts, require_keys
from scehr.schemas.tasks import task_spec
from scehr.training.config import TrainConfig
from scehr.training.distributed import manifest_note
from scehr.training.drift_reference import prepared_data, risk_reference, value_reference
from scehr.training.fairness import fairness_at_export, subgroup_auroc
from scehr.training.fit import load_checkpoint
from scehr.training.landmark_assets import from_prepared as landmark_trajectory
from scehr.training.losses import calibration_input
from scehr.training.model_card import MIN_POSITIVES, write_model_card
from scehr.training.onnx_graph import (
    LandmarkScoringModel,
    ScoringModel,
    export_onnx,
    validate_parity,
)
from scehr.training.serving_assets import (
    default_point,
    fit_calibration,
    margin_reference,
    named_points,
    prototypes,
    served_metrics,
    threshold_points,
)
from scehr.training.uncertainty import UNCERTAINTY_WHERE, fit_uncertainty


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
    spec = task_spec(task)
    # a landmark task's graph adds every hour's outputs (contract 1.5)
    graph = LandmarkScoringModel if spec.landmarks else ScoringModel
    scoring = graph(model.encoder, model.head, crit.probability).eval()
    uses_static = bool(ck["encoder"]["uses_static"])
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
    logistic_input = calibration_input(cfg["loss"])

    def triple(split: str, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lg = preds[f"{split}_anchor_logits"][:, c]
        return preds[f"{split}_y"][:, c], preds[f"{split}_probability"][:, c], lg[:, 0] - lg[:, 1]

    def risk(cal: Calibration, split: str, c: int) -> tuple[np.ndarray, np.ndarray]:
        y, p, m = triple(split, c)
        return y, cal.apply(p, m)

    for c, label in enumerate(labels):
        calib = fit_calibration(triple("calib", c) if has_calib else None, triple("val", c),
                                where, logistic_input)
        pts, thr = threshold_points(preds["val_y"][:, c], preds["val_probability"][:, c],
                           spec.default_operating_point)
        protos = prototypes(preds["train_z"], preds["train_y"][:, c])
        val_risk = risk(calib, "val", c)
        named = named_points(val_risk, risk(calib, "test", c))
        ref_split = "calib" if has_calib else "val"
        yr, _, mr = triple(ref_split, c)
        classes.append(ClassCard(
            label=label, calibration=calib, operating_points=pts, default_threshold=thr,
            prototypes=[PrototypeSpec(**p) for p in protos], named_points=named,
            default_operating_point=default_point(named),
            margin_reference=margin_reference(
                yr, mr, "calibration split (held out of training and early stopping)"
                if has_calib else "validation split"),
            risk_reference=risk_reference(val_risk[1]),
            uncertainty=fit_uncertainty(risk(calib, "calib", c), val_risk, UNCERTAINTY_WHERE,
                                        test=risk(calib, "test", c)) if has_calib else None))
    def served(split: str) -> np.ndarray:
        """[N, C] risks of a split, every class's map on its outputs."""
        return np.stack([risk(k.calibration, split, c)[1] for c, k in enumerate(classes)],
                        axis=1)

    prov = _provenance([Path(d) for d in (cfg["data"], *cfg.get("extra_data", []))], metrics,
                       preds, data_description or "")
    data = prepared_data(cfg)
    audit = fairness_at_export(model, crit, data, preds, classes[0]) if spec.binary else None
    roots = [Path(d) for d in (cfg["data"], *cfg.get("extra_data", []))]
    trajectory = (landmark_trajectory(model, crit, data, roots, logistic_input)
                  if spec.landmarks else None)
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
        metrics={**served_metrics(task, labels, {s: (preds[f"{s}_y"], served(s))
                                                  for s in ("val", "test")},
                                  {k: metrics[k] for k in ("test", "test_ci", "val")},
                                  n_boot=int(cfg.get("n_boot", 1000)), seed=cfg["seed"]),
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
                      outputs=list(scoring.output_names), dynamic_length=dynamic,
                      parity_max_abs_error={k: float(e) for k, e in parity.items()}),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        code_version=code_version(),
        notes=[f"trained by: scehr train --config {run_dir}/config.json",
               *training_notes(metrics), *robustness_notes(cfg),
               "not for clinical use without local validation"],
        value_reference=value_reference(cfg, data),
        trajectory=trajectory,
    )
    (out / "manifest.json").write_text(manifest_json(manifest))
    command = reproduce or (f"scehr train --config {run_dir / 'config.json'}\n"
                            f"scehr export {run_dir} --out {out}")
    write_model_card(out, manifest, command, limitations)
    changes = register(out, manifest, set_default)
    return out, changes


def training_notes(metrics: dict[str, Any]) -> list[str]:
    """The number of training processes and the global batch (runs that record them)."""
    if "world_size" not in metrics:
        return []
    return [manifest_note(int(metrics["world_size"]), int(metrics["batch_size"]))]


def robustness_notes(cfg: dict[str, Any]) -> list[str]:
    """Manifest notes for the training options a reader of the model should know about."""
    notes = []
    if cfg.get("channel_dropout"):
        notes.append(f"channel_dropout = {cfg['channel_dropout']}: each channel of each "
                     "training stay was made absent with this probability")
    if cfg.get("extra_data"):
        notes.append("multi-source training: train and val splits of "
                     + ", ".join([cfg["data"], *cfg["extra_data"]]) + f"; test split of "
                     f"{cfg['data']}")
    return notes


def _source_info(data: Path) -> dict[str, Any]:
    for candidate in (data / "provenance.json", data.parent / "provenance.json"):
        if candidate.is_file():
            return dict(json.loads(candidate.read_text()))
    return {}


def _provenance(sources: list[Path], metrics: dict, preds: dict[str, np.ndarray],
                description: str) -> Provenance:
    """Where the training data came from; several sources (multi-source training) are joined
    with " + ", the first being the one whose test split the metrics are on."""
    infos = [_source_info(d) for d in sources]
    splits = {}
    for s in ("val", "test", "calib"):
        if f"{s}_y" in preds:
            splits[s] = SplitInfo(n=len(preds[f"{s}_y"]),
                                  prevalence=preds[f"{s}_y"].mean(axis=0).round(4).tolist())
    splits["train"] = SplitInfo(n=int(metrics["n"]["train"]),
                                prevalence=[round(float(x), 4)
                                            for x in metrics["train_prevalence"]])
    return Provenance(dataset=" + ".join(str(i.get("source", d.name))
                                         for i, d in zip(infos, sources, strict=True)),
                      description=description, splits=splits,
                      source=" + ".join(str(i.get("converter", "")) for i in infos))


def register(folder: Path, manifest: Manifest, set_default: bool) -> list[str]:
    """Add the model to `<models>/index.json` (schemas.model_index); returns what changed."""
    root = folder.parent.parent
    return add_model(root, entry_for(folder, root, manifest), set_default=set_default)
