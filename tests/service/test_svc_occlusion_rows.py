"""Occlusion rows built by column replacement equal re-discretizing each stay without the
occluded channel's observations (what a contribution means), bit for bit, on the shipped
models: real PhysioNet 2012 set-c stays (mortality) and whole-stay stays of different lengths
with a categorical channel (phenotypes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scehr.schemas.ingest import ingest
from scehr.schemas.manifest import load_manifest
from scehr.schemas.model_index import read_index
from scehr.schemas.payloads import StayPayload
from scehr.schemas.tensorize import Observations, discretize
from scehr.service.model import ModelSpec
from scehr.service.pipeline import _neutralise, prepare
from tests.conftest import SHARED_DATA
from tests.service.conftest import stay

MODELS = Path(__file__).resolve().parents[2] / "models"


def default_spec(task: str) -> ModelSpec:
    index = read_index(MODELS)
    entry = index.entry(task, index.defaults[task])
    assert entry is not None
    return ModelSpec.from_manifest(load_manifest(MODELS / entry.path / "manifest.json"),
                                   "0" * 64)


def rediscretized(spec: ModelSpec, stays: list[StayPayload]) -> tuple[np.ndarray, np.ndarray,
                                                                     list[np.ndarray]]:
    """The stays, then per stay and observed channel the stay without that channel's
    observations, each discretized from its observations and normalized; and the channels."""
    res = ingest(stays, spec.fs)
    obs = _neutralise(spec, res.observations, res.ok, [[] for _ in stays])
    n = len(res.ok)
    parts, ends, chans_of = [obs], list(res.end_hours), []
    next_id = n
    for s in range(n):
        mine = obs.stay == s
        chans = np.unique(obs.channel[mine & (obs.time <= res.end_hours[s] + 1e-6)])
        chans_of.append(chans)
        for k in chans:
            keep = mine & (obs.channel != k)
            parts.append(Observations(np.full(int(keep.sum()), next_id), obs.channel[keep],
                                      obs.time[keep], obs.value[keep], 0))
            ends.append(res.end_hours[s])
            next_id += 1
    allobs = Observations(*(np.concatenate([getattr(p, a) for p in parts])
                            for a in ("stay", "channel", "time", "value")), next_id)
    x, lengths = discretize(allobs, spec.fs, np.asarray(ends))
    return spec.normalizer.transform(x, lengths), lengths, chans_of


def check(spec: ModelSpec, stays: list[StayPayload]) -> int:
    prep = prepare(spec, stays, occlusion=True)
    assert prep.inputs is not None and not prep.problems
    x, lengths, chans = rediscretized(spec, stays)
    assert [c.tolist() for c in prep.occluded] == [c.tolist() for c in chans]
    np.testing.assert_array_equal(prep.inputs.lengths, lengths)
    np.testing.assert_array_equal(prep.inputs.x, x)  # exact: not a tolerance
    if prep.inputs.static is not None:
        base = prepare(spec, stays).inputs
        assert base is not None and base.static is not None
        src = np.concatenate([np.arange(len(stays)),
                              np.repeat(np.arange(len(stays)), [len(c) for c in chans])])
        np.testing.assert_array_equal(prep.inputs.static, base.static[src])
    return sum(len(c) for c in chans)


def test_whole_stay_rows_of_different_lengths_with_a_categorical_channel() -> None:
    spec = default_spec("phenotypes")
    stays = [StayPayload.model_validate(stay(hours=h, hr=80 + 5 * i)) for i, h in
             enumerate([(1.0, 12.0, 24.0, 47.0), (0.5, 3.0), (2.0, 30.0, 70.0)])]
    assert check(spec, stays) >= 12


def test_real_set_c_stays() -> None:
    if not (SHARED_DATA / "physionet2012" / "set-c.tar.gz").is_file():
        pytest.skip(f"{SHARED_DATA}/physionet2012/set-c.tar.gz is absent")
    from tests.service.test_svc_edges import both_forms, set_c

    spec = default_spec("mortality")
    stays = [StayPayload.model_validate(both_forms(rows)[0]) for _, rows in set_c(12)]
    assert check(spec, stays) > 12 * 10  # many channels per stay occluded
