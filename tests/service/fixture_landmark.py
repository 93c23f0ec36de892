"""A tiny torch-free landmark graph (`onnx.helper`) and its manifest's `trajectory` section.

The graph is causal by construction: step t reads the cumulative mean of x over steps 0..t
(z_t = tanh(mean_t @ W)), so the risk at hour t+1 depends on nothing later. Its outputs are
the contract's: `z`, `anchor_logits`, `probability` at each stay's last valid step (the step
lengths-1 of the per-step outputs, picked by a one-hot mask), plus `anchor_logits_by_hour`
[B, T, C, 2] and `probability_by_hour` [B, T, C] (CBCE read-out at every step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from scehr.schemas.contract import (
    INPUT_LENGTHS,
    INPUT_X,
    LANDMARK_OUTPUTS,
    ONNX_OPSET,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
    OUTPUT_Z,
)
from tests.service.fixture_model import constants, valid_step_nodes

AL_BY_HOUR, P_BY_HOUR = (o.name for o in LANDMARK_OUTPUTS)

#: The fixture's trajectory section: no risk before hour 6; three bands with different maps
#: (the first with a data minimum of 6 observations of 3 variables, and an uncertainty map).
FIXTURE_TRAJECTORY: dict[str, Any] = {
    "first_hour": 6, "last_hour": 48,
    "bands": [
        {"from_hour": 6, "to_hour": 11,
         "calibration": {"method": "temperature", "input": "margin", "temperature": 2.0},
         "uncertainty": {
             "cuts": [0.2, 0.5, 0.8], "low": [0.0, 0.15, 0.4, 0.6],
             "high": [0.05, 0.2, 0.7, 0.95], "level": 0.9, "event_from": 0.3,
             "no_event_up_to": 0.6, "fitted_on": "fixture", "n": 500, "positives": 100},
         "data_minimum": {"min_observations": 6, "min_channels": 3,
                          "rule": "fixture: 6 observations of 3 variables"}},
        {"from_hour": 12, "to_hour": 23,
         "calibration": {"method": "platt", "input": "margin", "slope": 0.8,
                         "intercept": -0.2}},
        {"from_hour": 24, "to_hour": 48, "calibration": {"method": "none"}},
    ],
    "alert_policy": {"threshold": 0.3, "silence_hours": 6, "realert_rise": 0.1,
                     "rule": "fixture"},
}


def build_landmark_graph(n_features: int, dim: int, *, fixed_t: int, seed: int
                         ) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """The causal ONNX model of one class (CBCE) and its anchors (u [1, D], v [1, D])."""
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(n_features, dim)) / np.sqrt(n_features) * 2.0).astype(np.float32)
    u = rng.normal(size=(1, dim)).astype(np.float32)
    v = rng.normal(size=(1, dim)).astype(np.float32)
    head = np.stack([u, v], axis=1).reshape(2, dim).T.copy()  # [D, 2]: u0 v0
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(head, "H"),
        *constants(1),
        numpy_helper.from_array(np.array(1, np.int64), "ax1_s"),
        numpy_helper.from_array(np.array([3], np.int64), "ax3"),
    ]
    n = helper.make_node
    nodes = [
        *valid_step_nodes(),
        n("Mul", [INPUT_X, "valid3"], ["xm"]),
        n("CumSum", ["xm", "ax1_s"], ["xcum"]),  # [B, T, F]: causal
        n("CumSum", ["valid3", "ax1_s"], ["ncum"]),  # [B, T, 1]
        n("Max", ["ncum", "onef"], ["nc"]),
        n("Div", ["xcum", "nc"], ["xmean"]),
        n("MatMul", ["xmean", "W"], ["h"]),
        n("Tanh", ["h"], ["zt"]),  # [B, T, D]
        n("MatMul", ["zt", "H"], ["flat_t"]),  # [B, T, 2]
        n("Unsqueeze", ["flat_t", "ax2"], [AL_BY_HOUR]),  # [B, T, 1, 2]
        n("Sigmoid", [AL_BY_HOUR], ["sig_t"]),
        n("ReduceSum", ["sig_t", "ax3"], ["den_t"], keepdims=1),
        n("Div", ["sig_t", "den_t"], ["ratio_t"]),
        n("Gather", ["ratio_t", "zero_s"], [P_BY_HOUR], axis=3),  # [B, T, 1]
        # the last valid step: one-hot on lengths - 1
        n("Sub", ["len2", "one_s"], ["last2"]),
        n("Equal", ["steps2", "last2"], ["is_last"]),  # [B, T]
        n("Cast", ["is_last"], ["lastf"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["lastf", "ax2"], ["last3"]),  # [B, T, 1]
        n("Mul", ["zt", "last3"], ["zlast"]),
        n("ReduceSum", ["zlast", "ax1"], [OUTPUT_Z], keepdims=0),  # [B, D]
        n("MatMul", [OUTPUT_Z, "H"], ["flat"]),
        n("Reshape", ["flat", "shape_c2"], [OUTPUT_ANCHOR_LOGITS]),
        n("Sigmoid", [OUTPUT_ANCHOR_LOGITS], ["sig"]),
        n("ReduceSum", ["sig", "ax2"], ["den"], keepdims=1),
        n("Div", ["sig", "den"], ["ratio"]),
        n("Gather", ["ratio", "zero_s"], [OUTPUT_PROBABILITY], axis=2),  # [B, 1]
    ]
    inputs = [helper.make_tensor_value_info(INPUT_X, TensorProto.FLOAT,
                                            ["B", fixed_t, n_features]),
              helper.make_tensor_value_info(INPUT_LENGTHS, TensorProto.INT64, ["B"])]
    outputs = [
        helper.make_tensor_value_info(OUTPUT_Z, TensorProto.FLOAT, ["B", dim]),
        helper.make_tensor_value_info(OUTPUT_ANCHOR_LOGITS, TensorProto.FLOAT, ["B", 1, 2]),
        helper.make_tensor_value_info(OUTPUT_PROBABILITY, TensorProto.FLOAT, ["B", 1]),
        helper.make_tensor_value_info(AL_BY_HOUR, TensorProto.FLOAT, ["B", fixed_t, 1, 2]),
        helper.make_tensor_value_info(P_BY_HOUR, TensorProto.FLOAT, ["B", fixed_t, 1]),
    ]
    graph = helper.make_graph(nodes, "scehr_landmark_fixture", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="scehr-tests")
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    onnx.checker.check_model(model)
    return model, u, v
