"""Synthetic generator: layout, exact prevalence, learnable signal, load_split round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scehr.schemas.ingest import ingest_stay
from scehr.schemas.payloads import StayPayload
from scehr.training.data import load_split, write_synthetic
from scehr.training.data.phenotypes import PHENOTYPE_LABELS
from scehr.training.data.synthetic import example_payload

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(autouse=True)
def _no_cache_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCEHR_CACHE_DIR", raising=False)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth"), task="both", n_train=200,
                           n_test=40, prevalence=0.25, seed=3)


def test_layout_is_the_benchmark_one(synth: Path) -> None:
    ihm = synth / "in-hospital-mortality"
    for f in ("train/listfile.csv", "test/listfile.csv", "train_listfile.csv",
              "val_listfile.csv", "train/demographics.csv"):
        assert (ihm / f).is_file(), f
    assert (ihm / "train/listfile.csv").read_text().startswith("stay,y_true\n")
    head = (synth / "phenotyping/train/listfile.csv").read_text().splitlines()[0].split(",")
    assert head[:2] == ["stay", "period_length"] and tuple(head[2:]) == PHENOTYPE_LABELS
    ts = next((ihm / "train").glob("*_timeseries.csv")).read_text().splitlines()
    assert ts[0].startswith("Hours,Capillary refill rate,Diastolic blood pressure")
    assert json.loads((synth / "provenance.json").read_text())["signal"]["mortality"]


def test_round_trip_shapes_prevalence_and_cache(synth: Path) -> None:
    tr = load_split(synth, "mortality", "train", progress=False)
    va = load_split(synth, "mortality", "val", progress=False)
    te = load_split(synth, "mortality", "test", progress=False)
    assert len(tr) + len(va) == 200 and len(te) == 40
    assert tr.x.shape == (len(tr), 48, 76) and tr.x.dtype == np.float32
    assert tr.y.shape == (len(tr), 1) and tr.y.dtype == np.float32
    assert tr.static_raw.shape == (len(tr), 2)
    assert te.prevalence[0] == pytest.approx(0.25)
    assert (tr.y.sum() + va.y.sum()) == 50  # exact prevalence over train + val
    assert not set(tr.stays) & set(va.stays)
    assert tr.label_names == ("in_hospital_mortality",)
    assert tr.dropped.sum() == 0 and tr.clipped.sum() == 0
    assert tr.coverage.min() > 0.9 and not tr.from_cache
    again = load_split(synth, "mortality", "train", progress=False)
    assert again.from_cache and again.cache_path is not None
    np.testing.assert_array_equal(again.x, tr.x)
    np.testing.assert_array_equal(again.stays, tr.stays)

    ph = load_split(synth, "phenotypes", "train", progress=False)
    assert ph.y.shape == (len(ph), 25) and ph.label_names == PHENOTYPE_LABELS
    assert ph.x.shape[1] <= 240 and ph.x.shape[1] == ph.lengths.max()
    assert (ph.lengths == np.maximum(ph.feature_set.n_bins(ph.end_hours), 1)).all()


def test_signal_is_learnable(synth: Path) -> None:
    a = load_split(synth, "mortality", "train", progress=False)
    fs = a.feature_set
    names = fs.column_names()
    hr, ph = names.index("heart_rate"), names.index("ph")
    y = a.y[:, 0] == 1
    late_hr = a.x[:, 40:, hr].mean(axis=1)
    assert late_hr[y].mean() - late_hr[~y].mean() > 5
    assert a.x[:, :, ph].mean(axis=1)[y].mean() < a.x[:, :, ph].mean(axis=1)[~y].mean()


def test_cache_invalidated_when_a_file_changes(tmp_path: Path) -> None:
    root = write_synthetic(tmp_path, task="mortality", n_train=20, n_test=5, seed=1)
    first = load_split(root, "mortality", "test", progress=False)
    f = root / "in-hospital-mortality" / "test" / first.stays[0]
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:2]) + "\n")  # keep one row only
    second = load_split(root, "mortality", "test", progress=False)
    assert not second.from_cache
    assert not np.array_equal(first.x[0], second.x[0])
    assert len(list(first.cache_path.parent.glob("mortality-test-*.npz"))) == 1


def test_a_cache_being_written_by_another_process_is_left_alone(tmp_path: Path) -> None:
    """Two trainings starting at once: one rebuilds a split while the other's temporary file
    (same task and split, `.tmpPID.npz`) is half-written; it must not be read nor deleted."""
    root = write_synthetic(tmp_path, task="mortality", n_train=20, n_test=5, seed=1)
    first = load_split(root, "mortality", "test", progress=False)
    partial = first.cache_path.with_name(first.cache_path.stem + ".tmp99999.npz")
    partial.write_bytes(b"PK\x03\x04 half-written")  # not yet a zip file
    first.cache_path.unlink()  # force a rebuild, which then sweeps stale caches
    again = load_split(root, "mortality", "test", progress=False)
    assert not again.from_cache and partial.is_file()
    np.testing.assert_array_equal(again.x, first.x)


def test_seeded(tmp_path: Path) -> None:
    """Same seed, same files. (Its speed is not asserted here: a timed unit test fails on a
    loaded machine; the synthetic writer is small enough that the suite shows any slowdown.)"""
    a = write_synthetic(tmp_path / "a", task="both", n_train=200, n_test=50, seed=5)
    b = write_synthetic(tmp_path / "b", task="both", n_train=200, n_test=50, seed=5)
    name = "in-hospital-mortality/train/900007_episode1_timeseries.csv"
    assert (a / name).read_text() == (b / name).read_text()


#: examples/ file -> (the feature set it is written for, the synthetic task generating it,
#: the shipped model it is sent to; task None: written by hand for the full PhysioNet set the
#: default mortality model reads)
EXAMPLE_FILES = {
    "mortality_stay_benchmark17.json": ("benchmark76-48h", "mortality", "mortality/1.1.1"),
    "phenotypes_stay.json": ("benchmark76-stay", "phenotypes", "phenotypes/1.1.0"),
    "mortality_stay.json": ("physionet2012-full", None, "mortality/1.2.0"),
}
MODELS = EXAMPLES.parent / "models"


def never_seen(model: str) -> set[str]:
    """Channels the shipped model never saw in training (coverage 0): an example that sent
    them would get a warning for each, so the examples leave them out."""
    manifest = json.loads((MODELS / model / "manifest.json").read_text())
    return {v for v, c in manifest["coverage"].items() if c == 0}


def fitted_example(name: str) -> dict:
    """The synthetic example for `name`'s task, fitted to the model it is sent to: without the
    channels that model never saw, and with an id of its own."""
    _, task, model = EXAMPLE_FILES[name]
    payload = example_payload(task)
    drop = never_seen(model)
    payload["observations"] = [o for o in payload["observations"] if o["variable"] not in drop]
    stem = name.removesuffix(".json").replace("_stay", "").replace("_", "-")
    payload["id"] = f"example-{stem}-1"
    return payload


@pytest.mark.parametrize("name", sorted(EXAMPLE_FILES))
def test_example_payloads_are_valid(name: str) -> None:
    from scehr.schemas.featureset import FEATURE_SETS

    fs_name, task, model = EXAMPLE_FILES[name]
    path = EXAMPLES / name
    assert path.stat().st_size < 30_000
    payload = StayPayload.model_validate(json.loads(path.read_text()))
    assert payload.demographics is not None
    result = ingest_stay(payload, FEATURE_SETS[fs_name])
    assert result.problems == []
    assert not {o.variable for o in payload.observations} & never_seen(model)
    if task is not None:
        assert json.loads(path.read_text()) == fitted_example(name), (
            f"regenerate examples/{name}: python -m tests.training.data.test_data_synthetic")


def test_every_example_has_its_own_id() -> None:
    ids = [json.loads((EXAMPLES / n).read_text())["id"] for n in EXAMPLE_FILES]
    assert len(set(ids)) == len(ids), ids


def test_subset_keeps_rows_aligned(synth: Path) -> None:
    a = load_split(synth, "phenotypes", "test", progress=False)
    idx = np.array([3, 0, 7])
    b = a.subset(idx)
    assert len(b) == 3 and b.x.shape[1] == a.lengths[idx].max()
    np.testing.assert_array_equal(b.y, a.y[idx])
    np.testing.assert_array_equal(b.stays, a.stays[idx])
    np.testing.assert_array_equal(b.x, a.x[idx][:, : b.x.shape[1]])
    full = a.subset(np.ones(len(a), dtype=bool))
    np.testing.assert_allclose(full.coverage, a.coverage)


def example_text(payload: dict) -> str:
    """The examples' layout: two-space indents, one observation per line."""
    obs = payload["observations"]
    head = json.dumps({k: v for k, v in payload.items() if k != "observations"}, indent=2)
    lines = [f"    {json.dumps(o)}," for o in obs]
    lines[-1] = lines[-1].rstrip(",")
    return head[:-2] + ',\n  "observations": [\n' + "\n".join(lines) + "\n  ]\n}\n"


if __name__ == "__main__":  # rewrite the generated examples
    for name, (_, task, _) in EXAMPLE_FILES.items():
        if task is not None:
            (EXAMPLES / name).write_text(example_text(fitted_example(name)))
