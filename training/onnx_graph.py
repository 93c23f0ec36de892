"""The served graph: encoder + anchor head + the loss's read-out, its ONNX export and parity check.

The graph's contract (input/output names, dynamic axes, opset) comes from `scehr.schemas.contract`,
so the server reads the same names. Every export is checked against PyTorch with ONNX Runtime on
batch 1 and batch > 1 with ragged lengths: LSTM exports that are right only for batch 1 are a known
failure of such pipelines.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import Tensor, nn

from scehr.schemas.contract import GRAPH, INPUT_LENGTHS, INPUT_STATIC, INPUT_X, LANDMARK_OUTPUTS
from scehr.training.encoders.base import clamp_lengths, last_valid

ONNX_OPSET, PARITY_ATOL = GRAPH.opset, GRAPH.parity_atol
#: The graph's inputs and outputs, from the graph contract (schemas.contract.GRAPH).
OUTPUTS = GRAPH.output_names
#: Example sizes the exporter traces with. Small T keeps the exporter's RNN tracing cheap (its
#: cost grows with T x number of RNNs); sizes >= 2 and distinct so no axis is specialised.
_EXAMPLE_B, _EXAMPLE_T = 3, 5


#: The exporter's logger that says, on every export, that it skips torchvision's detection ops
#: (nms, roi_align, roi_pool, deform_conv2d) because torchvision is not installed: no scehr graph
#: uses them, so the four lines are noise to whoever runs `scehr export`.
_REGISTRATION_LOG = "torch.onnx._internal.exporter._registration"


def _not_torchvision_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("torchvision is not installed")


class ParityError(RuntimeError):
    """ONNX Runtime and PyTorch disagree beyond the tolerance: the export must not ship."""


class ScoringModel(nn.Module):
    """(x, lengths, static?) -> (z, anchor_logits [B, C, 2], probability [B, C])."""

    #: The graph's outputs, in the order `forward` returns them.
    output_names: tuple[str, ...] = OUTPUTS

    def __init__(
        self,
        encoder: nn.Module,
        head: nn.Module,
        probability_fn: Callable[[Tensor], Tensor],
    ) -> None:
        super().__init__()
        self.encoder, self.head, self.probability_fn = encoder, head, probability_fn

    @property
    def uses_static(self) -> bool:
        return bool(getattr(self.encoder, "uses_static", False))

    def forward(
        self, x: Tensor, lengths: Tensor, static: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        z = self.encoder(x, lengths, static)
        anchor_logits = self.head(z)
        return z, anchor_logits, self.probability_fn(anchor_logits)


class LandmarkScoringModel(ScoringModel):
    """A landmark task's graph: today's three outputs at each stay's last valid step, plus the
    anchor logits [B, T, C, 2] and probability [B, T, C] at every step (step t: the risk from
    hours [0, t + 1)), from one run of a causal encoder's `steps()`."""

    output_names = (*OUTPUTS, *(o.name for o in LANDMARK_OUTPUTS))

    def forward(  # type: ignore[override]
        self, x: Tensor, lengths: Tensor, static: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        lengths = clamp_lengths(lengths, x.shape[1])
        zs = self.encoder.steps(x, lengths, static)  # [B, T, D]
        # the head reads [N, D]; T comes from x, never from an RNN output (the exporter pins it)
        by_hour = self.head(zs.flatten(0, 1)).unflatten(0, (x.shape[0], x.shape[1]))
        p_by_hour = self.probability_fn(by_hour)
        return (last_valid(zs, lengths), last_valid(by_hour, lengths),
                last_valid(p_by_hour, lengths), by_hour, p_by_hour)


def export_onnx(
    model: ScoringModel,
    path: str | Path,
    *,
    n_features: int,
    n_static: int,
    seq_len: int,
    dynamic_length: bool,
    opset: int = ONNX_OPSET,
) -> None:
    """Write `model` (eval mode) as one self-contained ONNX file and check it.

    Uses the torch.export-based exporter: it keeps each LSTM/GRU as one ONNX RNN op without
    sequence_lens (lengths are handled by gathers in the encoder) and reaches ONNX_OPSET, where
    the TorchScript exporter stops at opset 20. The trace always has a dynamic T and a small
    example; a fixed-length graph then pins T to `seq_len` in its input signature.
    """
    uses_static = model.uses_static
    if uses_static and n_static < 1:
        raise ValueError("the encoder uses static features: n_static must be >= 1")
    batch = torch.export.Dim("batch")
    steps = torch.export.Dim("T")
    device = next(model.parameters()).device
    args: tuple[Tensor, ...] = (
        torch.randn(_EXAMPLE_B, _EXAMPLE_T, n_features, device=device,
                    dtype=getattr(torch, GRAPH.x.dtype)),
        torch.tensor([_EXAMPLE_T, 2, 4], dtype=getattr(torch, GRAPH.lengths.dtype),
                     device=device),
    )
    dynamic: tuple[dict[int, Any], ...] = ({0: batch, 1: steps}, {0: batch})
    names = GRAPH.input_names(uses_static)
    if uses_static:
        args += (torch.randn(_EXAMPLE_B, n_static, device=device,
                             dtype=getattr(torch, GRAPH.static.dtype)),)
        dynamic += ({0: batch},)
    was_training = model.training
    model.eval()
    _clear_rnn_dispatch_caches()
    registration_log = logging.getLogger(_REGISTRATION_LOG)
    registration_log.addFilter(_not_torchvision_notice)  # that notice only, for this export
    try:
        with warnings.catch_warnings():
            # The exporter's own chatter, harmless here: deprecations inside torch, RNN weights
            # re-assigned by its while-loop decomposition, and x/lengths/static sharing one batch
            # axis name.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
            warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used")
            program = torch.onnx.export(
                model,
                args,
                dynamo=True,
                input_names=names,
                output_names=list(model.output_names),
                dynamic_shapes=dynamic,
                opset_version=opset,
                external_data=False,
                verbose=False,
            )
    finally:
        registration_log.removeFilter(_not_torchvision_notice)
        model.train(was_training)
    assert program is not None
    _check_axes_stayed_dynamic(program.exported_program)
    proto = program.model_proto
    # The exporter annotates RNN outputs with the example's T (a static 5) even though T is
    # dynamic; ONNX Runtime infers every intermediate shape itself, so drop the annotations.
    del proto.graph.value_info[:]
    if not dynamic_length:
        _pin_time_axis(proto, seq_len)
    onnx.checker.check_model(proto, full_check=True)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(path))


def _clear_rnn_dispatch_caches() -> None:
    """Make every export trace LSTM/GRU with the exporter's while-loop decomposition.

    For dynamic shapes the exporter swaps that decomposition into `aten.lstm/gru.input.py_kernels`
    without clearing the op's dispatch cache, so in torch 2.13 a second export in the same process
    reuses the cached default (unrolled) one, which silently specialises T to the example's T.
    """
    for op in (torch.ops.aten.lstm.input, torch.ops.aten.gru.input):
        cache = getattr(op, "_dispatch_cache", None)
        if cache is not None:
            cache.clear()


def _check_axes_stayed_dynamic(program: torch.export.ExportedProgram) -> None:
    """Refuse an export where batch or T got specialised: its graph would score one shape only."""
    user_inputs = set(program.graph_signature.user_inputs)
    x = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs)
    shape = x.meta["val"].shape
    if not all(isinstance(d, torch.SymInt) for d in shape[:2]):
        raise RuntimeError(
            f"ONNX export specialised x's batch/time axes to {tuple(shape[:2])}; the graph would "
            "only accept that shape (look for shape-dependent Python control flow in the encoder)"
        )


def _pin_time_axis(proto: onnx.ModelProto, seq_len: int) -> None:
    """Declare x as [B, seq_len, F] so ONNX Runtime rejects any other T up front."""
    x = next(i for i in proto.graph.input if i.name == INPUT_X)
    dim = x.type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_value = seq_len


def _input_dims(session: ort.InferenceSession) -> dict[str, list[int | str | None]]:
    return {i.name: list(i.shape) for i in session.get_inputs()}


def validate_parity(
    model: ScoringModel,
    onnx_path: str | Path,
    *,
    batch_sizes: Sequence[int] = (1, 7, 256),
    lengths: Sequence[int] = (1, 13, 48, 96),
    atol: float = PARITY_ATOL,
    seed: int = 0,
) -> dict[str, float]:
    """Max |ORT − PyTorch| per output over random ragged batches; ParityError beyond `atol`.

    `lengths` are the time-axis sizes T tried when the graph's T is dynamic; a fixed-T graph is
    tried at its own T only. Within each batch, per-stay lengths vary (the first stay full, the
    second a single step). Shapes and the inputs the graph takes are read from the ONNX file.
    """
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    dims = _input_dims(session)
    n_features = int(dims[INPUT_X][2])  # type: ignore[arg-type]
    fixed_t = dims[INPUT_X][1]
    seq_lens = [fixed_t] if isinstance(fixed_t, int) else list(lengths)
    rng = np.random.default_rng(seed)
    names = list(model.output_names)
    worst = dict.fromkeys(names, 0.0)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for b in batch_sizes:
            for t in seq_lens:
                feed = _random_feed(rng, b, int(t), n_features, dims)
                with torch.no_grad():
                    ref = model(*(torch.from_numpy(feed[k]).to(device) for k in _order(feed)))
                got = session.run(names, feed)
                for name, r, g in zip(names, ref, got, strict=True):
                    if tuple(r.shape) != g.shape:
                        raise ParityError(
                            f"output {name!r} has shape {g.shape} in ONNX Runtime but "
                            f"{tuple(r.shape)} in PyTorch at batch size {b}, T={t} ({onnx_path})"
                        )
                    err = _max_abs(*_valid_steps(name, r.cpu().numpy(), g, feed))
                    if not err <= atol:  # also catches NaN
                        raise ParityError(
                            f"ONNX Runtime vs PyTorch: output {name!r} differs by {err:.3g} "
                            f"(> atol {atol:g}) at batch size {b}, T={t} ({onnx_path})"
                        )
                    worst[name] = max(worst[name], err)
    finally:
        model.train(was_training)
    return worst


def _order(feed: dict[str, np.ndarray]) -> list[str]:
    return [k for k in GRAPH.input_names(uses_static=True) if k in feed]


def _random_feed(
    rng: np.random.Generator, b: int, t: int, n_features: int, dims: dict[str, list]
) -> dict[str, np.ndarray]:
    lens = rng.integers(1, t + 1, size=b)
    lens[0] = t
    if b > 1:
        lens[1] = 1
    feed = {
        INPUT_X: rng.standard_normal((b, t, n_features)).astype(GRAPH.x.dtype),
        INPUT_LENGTHS: lens.astype(GRAPH.lengths.dtype),
    }
    if INPUT_STATIC in dims:
        feed[INPUT_STATIC] = rng.standard_normal((b, int(dims[INPUT_STATIC][1]))).astype(
            GRAPH.static.dtype
        )
    return feed


def _valid_steps(name: str, ref: np.ndarray, got: np.ndarray, feed: dict[str, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A per-step output's values at steps inside each stay (later steps are undefined);
    other outputs whole."""
    if name not in {o.name for o in LANDMARK_OUTPUTS}:
        return ref, got
    inside = np.arange(ref.shape[1])[None, :] < feed[INPUT_LENGTHS][:, None]
    return ref[inside], got[inside]


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
