"""Screened occlusion (`explain=top` with a model's explanation screen) against exact occlusion:
the screen's features of a stay do not depend on its batch, a screen whose candidates cover
every observed channel answers exactly as exact occlusion, a screened answer's deltas are the
exact ones of the channels it ran, `explain=full` stays exact, and a model without a screen
answers as before. On the shipped default mortality model's manifest and on the fixture model
(its graph run in-process)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from scehr.schemas.explanation_screen import (
    FEATURE_NAMES,
    FEATURES_VERSION,
    ExplanationScreen,
    channel_features,
)
from scehr.schemas.featureset import FeatureSet
from scehr.schemas.manifest import Manifest, load_manifest
from scehr.schemas.payloads import StayPayload
from scehr.service.model import ModelSpec
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model
from scehr.service.responses import predictions
from scehr.service.settings import Settings
from tests.service.test_svc_occlusion_rows import default_spec


def screen_of(n_channels: int, m: int, seed: int = 0) -> ExplanationScreen:
    rng = np.random.default_rng(seed)
    return ExplanationScreen(
        features=FEATURES_VERSION, candidates=m,
        coefficients=rng.normal(size=(n_channels, len(FEATURE_NAMES))).tolist(),
        target="random (a test)", fitted_on="none", chosen_on="none", validation={"3": 0.5},
        onnx_sha256="0" * 64)


def with_screen(spec: ModelSpec, screen: ExplanationScreen | None) -> ModelSpec:
    m = spec.manifest.model_copy(update={"explanation_screen": screen})
    return ModelSpec.from_manifest(m, spec.ref.sha256, spec.fixed_t)


def stays(fs: FeatureSet, n: int = 5) -> list[StayPayload]:
    """Stays of `fs`'s continuous variables, 4 to 8 of them observed, of different lengths and
    values."""
    cont = [v for v in fs.variables if not v.is_categorical][:8]
    out = []
    for i in range(n):
        obs = [{"variable": v.id, "time": float(t), "value": float(v.normal) * (0.7 + 0.13 * i
                                                                               + 0.05 * j * t),
                **({"unit": v.unit} if v.unit else {})}
               for j, v in enumerate(cont[: 4 + i]) for t in range(1, 4 + 5 * i, 2 + j % 3)]
        out.append(StayPayload.model_validate({"observations": obs}))
    return out


def test_screen_features_and_candidates_do_not_depend_on_the_batch() -> None:
    spec = with_screen(default_spec("mortality"), screen_of(39, 3))
    batch = stays(spec.fs)
    together = prepare(spec, batch, occlusion=True, screened=True)
    assert together.inputs is not None
    for i, s in enumerate(batch):
        alone = prepare(spec, [s], occlusion=True, screened=True)
        assert alone.inputs is not None
        np.testing.assert_array_equal(alone.occluded[0], together.occluded[i])
        assert len(alone.occluded[0]) == 3
        x_b, x_a = together.inputs.x[i], alone.inputs.x[0]
        t = int(alone.inputs.lengths[0])
        unobserved = np.zeros_like(x_a)  # the same 'nothing observed' for both: compare x's
        chans = np.arange(spec.fs.n_channels)
        np.testing.assert_array_equal(
            channel_features(x_a, unobserved, t, chans, spec.fs),
            channel_features(x_b[: x_a.shape[0]], unobserved, t, chans, spec.fs))


def test_without_a_screen_or_at_full_occlusion_is_exact() -> None:
    plain = default_spec("mortality")
    screened = with_screen(plain, screen_of(39, 3))
    batch = stays(plain.fs)
    exact = prepare(plain, batch, occlusion=True)
    for spec, flag in ((plain, True), (screened, False)):
        p = prepare(spec, batch, occlusion=True, screened=flag)
        assert [c.tolist() for c in p.occluded] == [c.tolist() for c in exact.occluded]
        assert p.inputs is not None and exact.inputs is not None
        np.testing.assert_array_equal(p.inputs.x, exact.inputs.x)
        assert not any(n.code == "contributions_screened" for ns in p.notices for n in ns)
    p = prepare(screened, batch, occlusion=True, screened=True)
    assert all(len(c) == 3 for c in p.occluded)
    assert all(any(n.code == "contributions_screened" for n in ns) for ns in p.notices)


@pytest.fixture(scope="module")
def fixture_model(model_dir: Path) -> LoadedModel:
    return load_model(model_dir / "mortality" / "v2", "mortality",
                      Settings(model_dir=model_dir, device="cpu", intra_op_threads=1))


def answer(model: LoadedModel, spec: ModelSpec, explain: str) -> list[dict]:
    p = prepare(spec, stays(spec.fs), occlusion=explain != "basic", screened=explain == "top")
    assert p.inputs is not None
    res = predictions(spec, p, model.run(p.inputs), explain=explain)
    return [res[i].model_dump(mode="json") for i in sorted(res)]


def test_candidates_covering_every_channel_answer_as_exact_occlusion(
        fixture_model: LoadedModel) -> None:
    spec = fixture_model.spec
    covering = with_screen(spec, screen_of(spec.fs.n_channels, spec.fs.n_channels))
    assert answer(fixture_model, covering, "top") == answer(fixture_model, spec, "top")


def test_screened_deltas_are_the_exact_ones_and_full_stays_exact(
        fixture_model: LoadedModel) -> None:
    spec = fixture_model.spec
    small = with_screen(spec, screen_of(spec.fs.n_channels, 2, seed=3))
    exact = answer(fixture_model, spec, "full")
    screened = answer(fixture_model, small, "top")
    assert answer(fixture_model, small, "full") == exact
    for e, s in zip(exact, screened, strict=True):
        assert any(n["code"] == "contributions_screened" for n in s["warnings"])
        for ce, cs in zip(e["results"], s["results"], strict=True):
            by_var = {c["variable"]: c for c in ce["contributions"]}
            assert len(cs["contributions"]) == 2
            for c in cs["contributions"]:
                assert c == by_var[c["variable"]]
            deltas = [abs(c["delta"]) for c in cs["contributions"]]
            assert deltas == sorted(deltas, reverse=True)


def test_the_manifest_section_round_trips_and_is_checked() -> None:
    path = Path(__file__).resolve().parents[2] / "models" / "mortality" / "1.3.2"
    m = load_manifest(path / "manifest.json")
    assert m.explanation_screen is None  # every shipped version stays valid without one
    sc = screen_of(len(m.feature_set["variables"]), 7)
    with_sc = m.model_copy(update={"explanation_screen": sc})
    back = Manifest.model_validate_json(with_sc.model_dump_json())
    assert back.explanation_screen == sc
    bad_rows = with_sc.model_dump()
    bad_rows["explanation_screen"]["coefficients"] = sc.coefficients[:-1]
    with pytest.raises(ValidationError, match="one row per channel"):
        Manifest.model_validate(bad_rows)
    with pytest.raises(ValidationError, match="values"):
        ExplanationScreen.model_validate({**sc.model_dump(), "coefficients": [[1.0]]})
    two = with_sc.model_dump()
    two["label_names"] = ["a", "b"]
    with pytest.raises(ValidationError, match="one-class"):
        Manifest.model_validate(two)
