"""Tiny torch-free fixture models: an ONNX graph built with `onnx.helper` plus a valid manifest.

The graph follows the model contract: z = tanh(masked mean over valid steps of x [, static]) @ W,
anchor_logits = z @ [u_c, v_c] viewed as [B, C, 2], probability by the loss's own formula
(CBCE: σ(uᵀz) / (σ(uᵀz) + σ(vᵀz)); CSCE: softmax over (uᵀz, vᵀz)). Padding after `lengths` is
ignored by construction, so batched and unbatched runs must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from scehr.schemas.contract import (
    CONTRACT_VERSION,
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    ONNX_OPSET,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
    OUTPUT_Z,
)
from scehr.schemas.featureset import BENCHMARK_48H, BENCHMARK_STAY, FeatureSet
from scehr.schemas.manifest import Manifest, sha256_file
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import Normalizer, StaticImputer

PHENOTYPE_LABELS = [f"phenotype_{i:02d}" for i in range(25)]


def constants(n_classes: int) -> list[onnx.TensorProto]:
    """The fixture graphs' constant initializers (indices, axes, the logits' shape)."""
    return [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_s"),
        numpy_helper.from_array(np.array(1, np.int64), "one_s"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2"),
        numpy_helper.from_array(np.array([-1, n_classes, 2], np.int64), "shape_c2"),
        numpy_helper.from_array(np.array([1.0], np.float32), "onef"),
    ]


def valid_step_nodes() -> list[onnx.NodeProto]:
    """Nodes computing `steps2` [1, T] (step indices), `len2` [B, 1] (lengths) and `valid3`
    [B, T, 1] (1.0 on each stay's valid steps, 0.0 on its padding)."""
    n = helper.make_node
    return [
        n("Shape", [INPUT_X], ["xshape"]),
        n("Gather", ["xshape", "one_s"], ["T"], axis=0),
        n("Range", ["zero_s", "T", "one_s"], ["steps"]),  # [T]
        n("Unsqueeze", ["steps", "zero"], ["steps2"]),  # [1, T]
        n("Unsqueeze", [INPUT_LENGTHS, "ax1"], ["len2"]),  # [B, 1]
        n("Less", ["steps2", "len2"], ["valid"]),  # [B, T]
        n("Cast", ["valid"], ["validf"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["validf", "ax2"], ["valid3"]),  # [B, T, 1]
    ]


def build_graph(n_features: int, dim: int, n_classes: int, loss: str, *, uses_static: bool,
                n_static: int, fixed_t: int | None, seed: int, ignore_lengths: bool = False,
                lstm_hidden: int = 0) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """The ONNX model and its anchors (u [C, D], v [C, D]).

    `ignore_lengths` averages over padding too: a deliberately wrong export for batch > 1.
    `lstm_hidden` > 0 replaces the masked mean by an ONNX LSTM over the valid steps (its last
    hidden state per stay via `sequence_lens`): a heavier encoder for the benchmarks.
    """
    rng = np.random.default_rng(seed)
    enc_out = lstm_hidden or n_features
    d_in = enc_out + (n_static if uses_static else 0)
    w = (rng.normal(size=(d_in, dim)) / np.sqrt(d_in) * 2.0).astype(np.float32)
    u = rng.normal(size=(n_classes, dim)).astype(np.float32)
    v = rng.normal(size=(n_classes, dim)).astype(np.float32)
    head = np.stack([u, v], axis=1).reshape(2 * n_classes, dim).T.copy()  # [D, 2C]: u0 v0 u1 ..

    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(head, "H"),
             *constants(n_classes)]
    n = helper.make_node
    nodes = [
        *valid_step_nodes(),
        n("Mul", [INPUT_X, "valid3"], ["xm"]) if not ignore_lengths
        else n("Identity", [INPUT_X], ["xm"]),
        n("ReduceSum", ["xm", "ax1"], ["xsum"], keepdims=0),  # [B, F]
        n("Cast", ["len2"], ["lenf"], to=TensorProto.FLOAT) if not ignore_lengths
        else n("Cast", ["T"], ["lenf"], to=TensorProto.FLOAT),
        n("Max", ["lenf", "onef"], ["lenc"]),
        n("Div", ["xsum", "lenc"], ["xmean"]),
    ]
    feat = "xmean"
    if lstm_hidden:
        h4 = 4 * lstm_hidden
        inits += [
            numpy_helper.from_array((rng.normal(size=(1, h4, n_features)) * 0.1)
                                    .astype(np.float32), "LW"),
            numpy_helper.from_array((rng.normal(size=(1, h4, lstm_hidden)) * 0.1)
                                    .astype(np.float32), "LR"),
        ]
        nodes = [n for n in nodes if n.output[0] in ("xshape", "T")]  # keep the shape only
        nodes += [
            n("Transpose", [INPUT_X], ["xt"], perm=[1, 0, 2]),  # [T, B, F]
            n("Cast", [INPUT_LENGTHS], ["seq"], to=TensorProto.INT32),
            n("LSTM", ["xt", "LW", "LR", "", "seq"], ["", "hlast"], hidden_size=lstm_hidden),
            n("Squeeze", ["hlast", "zero"], ["xmean_l"]),  # [B, H]
        ]
        feat = "xmean_l"
    if uses_static:
        nodes.append(n("Concat", [feat, INPUT_STATIC], ["feat"], axis=1))
        feat = "feat"
    nodes += [
        n("MatMul", [feat, "W"], ["h"]),
        n("Tanh", ["h"], [OUTPUT_Z]),
        n("MatMul", [OUTPUT_Z, "H"], ["flat"]),
        n("Reshape", ["flat", "shape_c2"], [OUTPUT_ANCHOR_LOGITS]),
    ]
    if loss == "cbce":
        nodes += [
            n("Sigmoid", [OUTPUT_ANCHOR_LOGITS], ["sig"]),
            n("ReduceSum", ["sig", "ax2"], ["den"], keepdims=1),
            n("Div", ["sig", "den"], ["ratio"]),
        ]
    elif loss == "csce":
        nodes.append(n("Softmax", [OUTPUT_ANCHOR_LOGITS], ["ratio"], axis=-1))
    else:
        raise ValueError(loss)
    nodes += [
        n("Gather", ["ratio", "zero_s"], [OUTPUT_PROBABILITY], axis=2),  # [B, C]
    ]
    t_dim: int | str = fixed_t if fixed_t is not None else "T"
    inputs = [
        helper.make_tensor_value_info(INPUT_X, TensorProto.FLOAT, ["B", t_dim, n_features]),
        helper.make_tensor_value_info(INPUT_LENGTHS, TensorProto.INT64, ["B"]),
    ]
    if uses_static:
        inputs.append(helper.make_tensor_value_info(INPUT_STATIC, TensorProto.FLOAT,
                                                    ["B", n_static]))
    outputs = [
        helper.make_tensor_value_info(OUTPUT_Z, TensorProto.FLOAT, ["B", dim]),
        helper.make_tensor_value_info(OUTPUT_ANCHOR_LOGITS, TensorProto.FLOAT,
                                      ["B", n_classes, 2]),
        helper.make_tensor_value_info(OUTPUT_PROBABILITY, TensorProto.FLOAT, ["B", n_classes]),
    ]
    graph = helper.make_graph(nodes, "scehr_fixture", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="scehr-tests")
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    onnx.checker.check_model(model)
    return model, u, v


def _normalizer(fs: FeatureSet) -> Normalizer:
    cols = fs.continuous_columns
    means, stds = [], []
    for var, b in zip(fs.variables, fs.begins, strict=True):
        if var.is_categorical:
            continue
        r = var.ranges
        means.append(var.normal_float)
        stds.append(max((r.valid_high - r.valid_low) / 10.0, 1e-3) if r else 1.0)
        assert b in cols
    return Normalizer(cols, np.asarray(means), np.asarray(stds))


def _class_card(label: str, i: int, dim: int, rng: np.random.Generator,
                calibration: dict[str, Any]) -> dict[str, Any]:
    protos = []
    for lab in (0, 1):
        for _ in range(2):
            protos.append({
                "label": lab, "centroid": rng.normal(size=dim).tolist(),
                "count": int(rng.integers(20, 500)), "outcome_rate": float(rng.uniform(0, 1)),
            })
    return {
        "label": label,
        "calibration": calibration,
        "operating_points": [
            {"name": "default", "threshold": 0.5, "sensitivity": 0.7, "ppv": 0.4,
             "specificity": 0.8, "alert_rate": 0.2},
        ],
        "default_threshold": 0.5,
        "prototypes": protos,
    }


def write_model(root: Path, task: str, version: str = "v1", *, loss: str | None = None,
                seed: int = 0, dim: int = 16, uses_static: bool | None = None,
                unseen: tuple[str, ...] | None = None, corrupt_sha: bool = False,
                contract_version: str = CONTRACT_VERSION, ignore_lengths: bool = False,
                lstm_hidden: int = 0, mangle: dict[str, Any] | None = None,
                named: bool = False, feature_set: FeatureSet | None = None,
                uncertainty: bool = False) -> Path:
    """Write `root/<task>/<version>/{model.onnx, manifest.json, MODEL_CARD.md}`; return the dir.

    `named` adds the contract 1.1 serving assets: named operating points on the risk, margin
    percentiles, a validation risk histogram and training value histograms. `feature_set`
    replaces the task's own (e.g. physionet2012-full for mortality). `uncertainty` adds the
    contract 1.4 uncertainty map (UNCERTAINTY_CARD) to every class. A landmark task gets the
    causal graph of `fixture_landmark` and its `trajectory` section (no static input)."""
    from tests.service.fixture_landmark import (  # it builds on this module's graph pieces
        AL_BY_HOUR,
        FIXTURE_TRAJECTORY,
        P_BY_HOUR,
        build_landmark_graph,
    )

    landmarks = task_spec(task).landmarks
    mortality = task_spec(task).binary
    fs = feature_set or (BENCHMARK_48H if mortality else BENCHMARK_STAY)
    loss = loss or ("cbce" if mortality else "csce")
    uses_static = (mortality and not landmarks) if uses_static is None else uses_static
    labels = ["in_hospital_mortality"] if mortality else PHENOTYPE_LABELS
    if unseen is None:
        unseen = ("capillary_refill_rate",) if mortality else ("height",)
    c = len(labels)
    if landmarks:
        model, u, v = build_landmark_graph(fs.n_features, dim, fixed_t=48, seed=seed)
    else:
        model, u, v = build_graph(fs.n_features, dim, c, loss, uses_static=uses_static,
                                  n_static=fs.n_static, fixed_t=48 if mortality else None,
                                  seed=seed, ignore_lengths=ignore_lengths,
                                  lstm_hidden=lstm_hidden)
    out = root / task / version
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "model.onnx")
    rng = np.random.default_rng(seed + 1)
    cards = []
    for i, lab in enumerate(labels):
        if i % 3 == 0:
            cal = {"method": "temperature", "input": "margin", "temperature": 1.5}
        elif i % 3 == 1:
            cal = {"method": "isotonic", "input": "probability", "x": [0.0, 0.3, 0.7, 1.0],
                   "y": [0.0, 0.2, 0.8, 1.0]}
        else:
            cal = {"method": "none"}
        cards.append(_class_card(lab, i, dim, rng, cal))
        if named:
            cards[-1].update(NAMED_CARD)
        if uncertainty:
            cards[-1]["uncertainty"] = UNCERTAINTY_CARD
    static = None
    if uses_static:
        static = StaticImputer(np.array([65.0, 1.0]), np.array([64.0, 0.55]),
                               np.array([16.0, 0.5])).to_dict()
    manifest = {
        "contract_version": contract_version,
        "name": f"fixture-{task}-{loss}",
        "version": version,
        "task": task,
        "label_names": labels,
        "loss": {"name": loss, "lam": 0.005},
        "encoder": {"name": "lstm" if lstm_hidden else "masked-mean-tanh",
                    "hparams": {"dim": dim, "hidden": lstm_hidden}, "out_dim": dim,
                    "uses_static": uses_static},
        "feature_set": fs.to_dict(),
        "normalizer": _normalizer(fs).to_dict(),
        "static": static,
        "coverage": {var.id: (0.0 if var.id in unseen else 0.9) for var in fs.variables},
        "anchors": {"u": u.astype(float).tolist(), "v": v.astype(float).tolist()},
        "classes": cards,
        "metrics": {"auroc": {"value": 0.85, "low": 0.83, "high": 0.87},
                    "auprc": {"value": 0.45, "low": 0.41, "high": 0.49}},
        "provenance": {"dataset": "synthetic", "splits": {"test": {"n": 100,
                                                                   "prevalence": [0.1] * c}}},
        "onnx": {"file": "model.onnx", "sha256": sha256_file(out / "model.onnx"),
                 "opset": ONNX_OPSET, "inputs": [INPUT_X, INPUT_LENGTHS]
                 + ([INPUT_STATIC] if uses_static else []),
                 "outputs": [OUTPUT_Z, OUTPUT_ANCHOR_LOGITS, OUTPUT_PROBABILITY]
                 + ([AL_BY_HOUR, P_BY_HOUR] if landmarks else []),
                 "dynamic_length": not mortality},
        "created_at": "2026-01-01T00:00:00Z",
        "code_version": "test",
    }
    if landmarks:
        manifest["trajectory"] = FIXTURE_TRAJECTORY
    if named:
        manifest["value_reference"] = value_reference(fs)
    if corrupt_sha:
        manifest["onnx"]["sha256"] = "0" * 64
    if mangle:
        manifest.update(mangle)
    if contract_version == CONTRACT_VERSION and not mangle:
        Manifest.model_validate(manifest)  # the fixture itself must honour the contract
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "MODEL_CARD.md").write_text(f"# {manifest['name']}\n\nTest fixture, not a model.\n")
    return out


def _stats(alert_rate: float) -> dict[str, Any]:
    return {"n": 1000, "sensitivity": 0.7, "specificity": 0.8, "ppv": 0.4, "npv": 0.9,
            "alert_rate": alert_rate}


#: Contract 1.1 per-class assets of the `named` fixtures (thresholds on the risk).
NAMED_CARD: dict[str, Any] = {
    "named_points": [
        {"name": n, "rule": f"fixture {n}", "threshold": t, "validation": _stats(a),
         "test": _stats(a)}
        for n, t, a in (("high_sensitivity", 0.2, 0.4), ("balanced", 0.5, 0.2),
                        ("high_ppv", 0.8, 0.05))],
    "default_operating_point": "high_sensitivity",
    "margin_reference": {"split": "fixture", "percentiles": list(range(1, 100)),
                         "without_outcome": np.linspace(-3.0, 1.0, 99).tolist(),
                         "with_outcome": np.linspace(-1.0, 3.0, 99).tolist(),
                         "n_without": 500, "n_with": 100},
    "risk_reference": {"edges": [0.1 * k for k in range(1, 10)], "fractions": [0.1] * 10,
                       "n": 1000},
}

#: Contract 1.4's uncertainty map of the `uncertainty` fixtures: wide above a risk of 0.5.
UNCERTAINTY_CARD: dict[str, Any] = {
    "cuts": [0.2, 0.5, 0.8], "low": [0.0, 0.15, 0.4, 0.6], "high": [0.05, 0.2, 0.7, 0.95],
    "level": 0.9, "event_from": 0.3, "no_event_up_to": 0.6, "fitted_on": "fixture",
    "n": 500, "positives": 100}

#: Standard-normal deciles: a variable's fixture reference is normal ± spread x these.
Z_DECILES = (-1.2816, -0.8416, -0.5244, -0.2533, 0.0, 0.2533, 0.5244, 0.8416, 1.2816)


def spread(var: Any) -> float:
    return max(abs(var.normal_float) * 0.15, 1.0)


def value_reference(fs: FeatureSet) -> dict[str, Any]:
    """Training value histograms of a population around each variable's normal value."""
    out: dict[str, Any] = {}
    for var in fs.variables:
        if var.is_categorical:
            k = len(var.categories)
            out[var.id] = {"edges": [], "fractions": [1.0 / k] * k, "n": 1000}
        else:
            edges = [round(var.normal_float + spread(var) * z, 6) for z in Z_DECILES]
            out[var.id] = {"edges": edges, "fractions": [0.1] * 10, "n": 1000}
    return out


def write_index(root: Path, entries: list[tuple[str, str]],
                defaults: dict[str, str] | None = None) -> None:
    """`root/index.json` listing (task, version) pairs; defaults = the first of each task."""
    models, dflt = [], {}
    for task, version in entries:
        m = json.loads((root / task / version / "manifest.json").read_text())
        models.append({"task": task, "version": version, "name": m["name"],
                       "path": f"{task}/{version}", "loss": m["loss"]["name"],
                       "feature_set": m["feature_set"]["name"], "metrics": m["metrics"]})
        dflt.setdefault(task, version)
    (root / "index.json").write_text(json.dumps({"defaults": defaults or dflt,
                                                 "models": models}, indent=1))


def write_model_dir(root: Path, lstm_hidden: int = 0) -> Path:
    """The standard fixture tree: mortality v1 (CBCE) and v2 (CSCE, without an uncertainty
    map), phenotypes v1 (CSCE)."""
    write_model(root, "mortality", "v1", loss="cbce", seed=1, lstm_hidden=lstm_hidden,
                uncertainty=True)
    write_model(root, "mortality", "v2", loss="csce", seed=2, lstm_hidden=lstm_hidden)
    write_model(root, "phenotypes", "v1", loss="csce", seed=3, lstm_hidden=lstm_hidden,
                uncertainty=True)
    write_index(root, [("mortality", "v1"), ("mortality", "v2"), ("phenotypes", "v1")])
    return root
