"""ONNX export of encoder + anchor head + read-out: contract names, dynamic axes, ORT parity."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from scehr.schemas.contract import (
    INPUT_LENGTHS,
    INPUT_STATIC,
    INPUT_X,
    ONNX_OPSET,
    OUTPUT_ANCHOR_LOGITS,
    OUTPUT_PROBABILITY,
    OUTPUT_Z,
)
from scehr.training.encoders import build_encoder
from scehr.training.heads import AnchorHead
from scehr.training.onnx_graph import ParityError, ScoringModel, export_onnx, validate_parity

F, S, C, T = 6, 3, 2, 48
ENCODERS = {
    # fixed T, like mortality; bidirectional so the per-stay backward direction is exported
    "lstm": ({"units": 8, "depth": 2, "bidirectional": True}, False),
    # dynamic T, like phenotypes; static demographics as an extra input
    "cwgru": ({"hidden": 4, "channels": [[0, 1, 2], [3, 4, 5]], "n_heads": 2}, True),
    # fixed T; masked summary statistics in the graph: a 3-column one-hot channel + a continuous
    # one (4 value columns, then 2 mask columns)
    "sumlstm": ({"units": 4, "summary_dim": 3, "widths": [3, 1]}, False),
}
# The three read-outs, written out here as the paper states them.
READOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "cbce": lambda a: torch.sigmoid(a[..., 0]) / torch.sigmoid(a).sum(dim=-1),
    "csce": lambda a: torch.softmax(a, dim=-1)[..., 0],
    "bce": lambda a: torch.sigmoid(a[..., 0]),
}


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple]:
    """Export each (encoder, read-out) once per module: exports take seconds."""
    cache: dict[tuple[str, str], tuple[ScoringModel, Path]] = {}

    def get(encoder: str, readout: str) -> tuple[ScoringModel, Path]:
        if (encoder, readout) not in cache:
            torch.manual_seed(0)
            hp, dynamic = ENCODERS[encoder]
            enc = build_encoder(encoder, F, S, **hp)
            model = ScoringModel(enc, AnchorHead(enc.out_dim, C), READOUTS[readout])
            path = tmp_path_factory.mktemp("onnx") / f"{encoder}_{readout}.onnx"
            export_onnx(
                model, path, n_features=F, n_static=S, seq_len=T, dynamic_length=dynamic,
                opset=ONNX_OPSET,
            )
            cache[encoder, readout] = (model, path)
        return cache[encoder, readout]

    return get


@pytest.mark.parametrize("readout", list(READOUTS))
@pytest.mark.parametrize("encoder", list(ENCODERS))
def test_export_parity(export: Callable, encoder: str, readout: str) -> None:
    model, path = export(encoder, readout)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    # batch 256 once per encoder; the other read-outs only change the graph's last nodes
    batch_sizes = (1, 7, 256) if readout == "cbce" else (1, 7)
    errors = validate_parity(model, path, batch_sizes=batch_sizes, lengths=(1, 13, 48, 61))
    assert set(errors) == {OUTPUT_Z, OUTPUT_ANCHOR_LOGITS, OUTPUT_PROBABILITY}
    assert max(errors.values()) <= 1e-5


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("encoder", list(ENCODERS))
def test_graph_contract(export: Callable, encoder: str) -> None:
    _, path = export(encoder, "cbce")
    proto = onnx.load(path)
    assert {(o.domain, o.version) for o in proto.opset_import} == {("", ONNX_OPSET)}
    inputs = {i.name: _dims(i) for i in proto.graph.input}
    outputs = {o.name: _dims(o) for o in proto.graph.output}
    batch = inputs[INPUT_X][0]
    assert isinstance(batch, str) and batch  # dynamic batch, one symbol everywhere
    dynamic = ENCODERS[encoder][1]
    time_axis = inputs[INPUT_X][1]
    assert (isinstance(time_axis, str) and time_axis != batch) if dynamic else time_axis == T
    expected_inputs = {INPUT_X: [batch, time_axis, F], INPUT_LENGTHS: [batch]}
    if encoder in ("cwgru", "sumlstm"):
        expected_inputs[INPUT_STATIC] = [batch, S]
    assert inputs == expected_inputs
    assert list(outputs) == [OUTPUT_Z, OUTPUT_ANCHOR_LOGITS, OUTPUT_PROBABILITY]
    assert outputs[OUTPUT_ANCHOR_LOGITS] == [batch, C, 2]
    assert outputs[OUTPUT_PROBABILITY] == [batch, C]
    assert outputs[OUTPUT_Z][0] == batch
    types = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    assert types[INPUT_LENGTHS] == onnx.TensorProto.INT64
    assert types[INPUT_X] == onnx.TensorProto.FLOAT
    if not dynamic:  # a fixed-length graph refuses another T instead of scoring it
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {INPUT_X: np.zeros((1, T + 1, F), np.float32), INPUT_LENGTHS: np.ones(1, np.int64)}
        if INPUT_STATIC in inputs:
            feed[INPUT_STATIC] = np.zeros((1, S), np.float32)
        with pytest.raises(Exception, match="dimensions"):
            session.run(None, feed)


def test_broken_comparison_raises(export: Callable) -> None:
    model, path = export("lstm", "cbce")
    drifted = copy.deepcopy(model)
    with torch.no_grad():
        drifted.head.linear.weight.add_(1e-3)  # the graph no longer matches this model
    with pytest.raises(ParityError, match=r"output 'anchor_logits'.*batch size 1, T=48"):
        validate_parity(drifted, path, batch_sizes=(1,))
