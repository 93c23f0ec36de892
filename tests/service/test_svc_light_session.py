"""Small ORT runs go to a one-thread session; what a stay gets never depends on which.

`LoadedModel.light` runs the graph with one intra-op thread for runs of at most
`LIGHT_ROWS` rows when the model's own session has more threads (it costs less CPU there).
Responses are byte-pinned elsewhere (tests/service/test_svc_served_outputs_frozen.py,
test_offline_scoring.py's chunk invariance): this pins that both sessions give bit-identical outputs
for every shipped model, and which session each run size takes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scehr.schemas.contract import GRAPH
from scehr.service.batcher import ModelInputs, ModelOutputs
from scehr.service.registry import LIGHT_ROWS, LoadedModel, load_model
from scehr.service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
SHIPPED = [(e["task"], e["version"], e["path"])
           for e in json.loads((MODELS / "index.json").read_text())["models"]]


def _inputs(m: LoadedModel, rows: int, rng: np.random.Generator) -> ModelInputs:
    """Random rows of the graph's input shapes (values need not be realistic to compare)."""
    shapes = {i.name: i.shape for i in m.session.get_inputs()}
    n_features = shapes[GRAPH.x.name][2]
    t = m.spec.fixed_t or 48
    x = rng.normal(size=(rows, t, n_features)).astype(np.float32)
    lengths = rng.integers(1, t + 1, size=rows).astype(np.int64)
    static = None
    if GRAPH.static.name in shapes:
        static = rng.normal(size=(rows, shapes[GRAPH.static.name][1])).astype(np.float32)
    return ModelInputs(x, lengths, static)


@pytest.mark.parametrize(("task", "version", "path"), SHIPPED)
def test_one_thread_session_gives_the_same_bits(task: str, version: str, path: str) -> None:
    m = load_model(MODELS / path, task, Settings(model_dir=MODELS, device="cpu",
                                                 intra_op_threads=2,
                                                 allow_legacy_models=True))
    assert m.light is not None
    rng = np.random.default_rng(7)
    for rows in (1, 2, 3, 4, 5, 8, 16, 32):
        inputs = _inputs(m, rows, rng)
        light = m.light
        m.light = None  # every size through the model's own (two-thread) session
        heavy = m.run(inputs)
        m.light = light
        one_thread = LoadedModel.run(_only(m, light), inputs)
        for name in ("z", "anchor_logits", "probability"):
            assert np.array_equal(getattr(heavy, name), getattr(one_thread, name)), (rows, name)


def _only(m: LoadedModel, session: Any) -> LoadedModel:
    """`m` with `session` as its only session (for any run size)."""
    return replace(m, session=session, light=None, observe=None)


class _Spy:
    """A session stand-in that records the rows it was given."""

    def __init__(self, real: Any) -> None:
        self.real, self.rows = real, []

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.rows.append(len(feeds[GRAPH.x.name]))
        return self.real.run(names, feeds)


def test_runs_up_to_light_rows_take_the_one_thread_session() -> None:
    task, _, path = SHIPPED[-1]
    m = load_model(MODELS / path, task, Settings(model_dir=MODELS, device="cpu",
                                                 intra_op_threads=2,
                                                 allow_legacy_models=True))
    assert m.light is not None
    rng = np.random.default_rng(3)
    sizes = (1, 3, LIGHT_ROWS, LIGHT_ROWS + 1, 32)
    runs = [_inputs(m, rows, rng) for rows in sizes]
    main, light = _Spy(m.session), _Spy(m.light)
    m.session, m.light = main, light  # type: ignore[assignment]
    for rows, inputs in zip(sizes, runs, strict=True):
        out = m.run(inputs)
        assert isinstance(out, ModelOutputs) and out.z.shape[0] == rows
    # padded to a multiple of 4 rows; the small runs on the light session only
    assert light.rows == [4, 4, LIGHT_ROWS]
    assert main.rows == [LIGHT_ROWS + 4, 32]


def test_no_second_session_with_one_thread() -> None:
    task, _, path = SHIPPED[-1]
    m = load_model(MODELS / path, task, Settings(model_dir=MODELS, device="cpu",
                                                 intra_op_threads=1))
    assert m.light is None
