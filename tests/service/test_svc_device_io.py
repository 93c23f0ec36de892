"""The GPU path on CPU: the batch-size policy, and bound runs equal to `session.run`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scehr.schemas.contract import GRAPH
from scehr.schemas.payloads import StayPayload
from scehr.service.batcher import ModelInputs
from scehr.service.device_io import BoundRunner, max_batch_rows, padded_rows
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model
from scehr.service.runtime import CPU, CUDA
from scehr.service.settings import Settings
from tests.service.conftest import stay


def test_batch_policy() -> None:
    assert max_batch_rows(CUDA, 32, 256) == 256 and max_batch_rows(CPU, 32, 256) == 32
    assert [padded_rows(n, 256) for n in (0, 1, 2, 3, 5, 33, 129, 256)] == [
        0, 1, 2, 4, 8, 64, 256, 256]
    assert padded_rows(100, 64) == 100 and padded_rows(40, 48) == 48  # never fewer rows


@pytest.mark.parametrize("task", ["phenotypes", "mortality"])
@pytest.mark.parametrize("pad", [False, True])
def test_bound_runs_equal_session_run(model_dir: Path, task: str, pad: bool) -> None:
    """Shapes that grow and shrink (rows and time steps) reuse and regrow the staging buffers;
    padded rows (the GPU policy, here on CPU) do not change the real rows' outputs."""
    model = load_model(sorted((model_dir / task).iterdir())[0], task,
                       Settings(model_dir=model_dir, device="cpu", intra_op_threads=1))
    runner = BoundRunner(model.session, 16, gpu=False, pad=pad)
    assert runner.device == "cpu" and not runner.pinned
    rng = np.random.default_rng(0)
    for n, hours in ((1, (1.0, 5.0)), (3, (2.0, 30.0, 47.0)), (11, (1.0, 47.0)), (2, (4.0,))):
        stays = [StayPayload.model_validate(stay(hours=hours, hr=float(rng.uniform(60, 140))))
                 for _ in range(n)]
        inputs = prepare(model.spec, stays).inputs
        assert inputs is not None
        feeds = {GRAPH.x.name: inputs.x, GRAPH.lengths.name: inputs.lengths}
        if GRAPH.static.name in model.input_names:
            feeds[GRAPH.static.name] = inputs.static
        want = model.session.run(list(GRAPH.output_names), feeds)
        got = runner.run(inputs, model.input_names)
        for a, b in zip(want, (got.z, got.anchor_logits, got.probability), strict=True):
            assert b.shape == a.shape
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-6 if pad else 0)


def test_staging_buffer_grows_in_powers_of_two(model_dir: Path) -> None:
    model = load_model(sorted((model_dir / "mortality").iterdir())[0], "mortality",
                       Settings(model_dir=model_dir, device="cpu", intra_op_threads=1))
    runner = BoundRunner(model.session, 8, gpu=False)
    inputs = prepare(model.spec, [StayPayload.model_validate(stay())] * 3).inputs
    assert isinstance(inputs, ModelInputs)
    runner.run(inputs, model.input_names)
    size = runner._buffers[GRAPH.x.name].view.nbytes
    assert size >= inputs.x.nbytes and size & (size - 1) == 0
    runner.run(ModelInputs(inputs.x[:1], inputs.lengths[:1],
                           None if inputs.static is None else inputs.static[:1]),
               model.input_names)
    assert runner._buffers[GRAPH.x.name].view.nbytes == size  # reused, not reallocated
