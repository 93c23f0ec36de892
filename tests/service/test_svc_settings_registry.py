"""Settings from SCEHR_* variables; loading: devices, checksums, contract, index."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from scehr.schemas.payloads import StayPayload
from scehr.service.app import create_app
from scehr.service.pipeline import prepare
from scehr.service.registry import (
    DeviceError,
    ModelLoadError,
    Registry,
    inspect,
    load_model,
    probe_device,
    read_index,
    resolve,
)
from scehr.service.runtime import CUDA, OrtRuntime
from scehr.service.settings import Settings, available_cores
from tests.service.conftest import serve, stay
from tests.service.fixture_model import write_index, write_model

pytestmark = pytest.mark.anyio

CUDA_WORKS = False
if "CUDAExecutionProvider" in ort.get_available_providers():
    try:
        CUDA_WORKS = probe_device("auto") == "CUDAExecutionProvider"
    except Exception:
        CUDA_WORKS = False


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k, v in {"SCEHR_MODEL_DIR": str(tmp_path), "SCEHR_API_KEYS": "key-one, key-two",
                 "SCEHR_TASKS": "mortality", "SCEHR_MAX_BATCH_SIZE": "8",
                 "SCEHR_MAX_QUEUE_DELAY_MS": "5", "SCEHR_DEVICE": "cpu",
                 "SCEHR_LOG_LEVEL": "debug", "SCEHR_WORKERS": "2"}.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    assert s.model_dir == tmp_path
    assert [k.get_secret_value() for k in s.api_keys] == ["key-one", "key-two"]
    assert s.tasks == ["mortality"] and s.max_batch_size == 8 and s.max_queue_delay == 0.005
    assert s.log_level == "DEBUG" and "key-one" not in repr(s)  # secrets
    assert s.ort_threads == max(1, available_cores() // 2)
    monkeypatch.setenv("SCEHR_TASKS", "sepsis")
    with pytest.raises(ValueError, match="unknown task"):
        Settings()


async def test_a_task_can_be_pinned_to_a_version_other_than_its_default(
        monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    """SCEHR_VERSIONS=mortality=v2 serves v2 (the index default is v1); bad values are named."""
    monkeypatch.setenv("SCEHR_VERSIONS", "mortality = v2")
    settings = Settings(model_dir=model_dir, device="cpu")
    assert settings.versions == {"mortality": ["v2"]}
    async with serve(settings) as client:
        r = await client.post("/predict/mortality", json=stay())
        assert r.status_code == 200 and r.json()["model"]["version"] == "v2"
        r = await client.post("/predict/phenotypes", json=stay())
        assert r.json()["model"]["version"] == "v1"  # not pinned: its default
        models = (await client.get("/models/mortality")).json()
        assert models["version"] == "v2" and models["default_version"] == "v1"
    for bad, rule in (("mortality", "TASK=VERSION"), ("sepsis=1.0", "unknown task")):
        monkeypatch.setenv("SCEHR_VERSIONS", bad)
        with pytest.raises(ValueError, match=rule):
            Settings()
    monkeypatch.setenv("SCEHR_VERSIONS", "mortality=9.9.9")
    registry = Registry(Settings(model_dir=model_dir, device="cpu"), None, None)  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match=r"9\.9\.9"):
        registry.preflight()


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("SCEHR_")]:
        monkeypatch.delenv(k)
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.device == "auto" and s.api_keys == [] and s.tasks is None
    assert s.model_dir.name == "models"


def test_load_model_checks_and_provider(model_dir: Path) -> None:
    m = load_model(model_dir / "phenotypes" / "v1", "phenotypes", Settings(
        model_dir=model_dir, device="cpu", intra_op_threads=1))
    assert m.provider == "CPUExecutionProvider" and m.spec.fixed_t is None
    assert m.session.get_session_options().intra_op_num_threads == 1


def test_io_binding_is_wired_and_gives_the_same_outputs(model_dir: Path) -> None:
    """SCEHR_IO_BINDING=on runs through run_with_iobinding (on CPU here: the GPU path itself
    is unverified); auto turns it on for the CUDA provider only."""
    folder = model_dir / "phenotypes" / "v1"
    plain = load_model(folder, "phenotypes", Settings(model_dir=model_dir, device="cpu",
                                                      intra_op_threads=1))
    bound = load_model(folder, "phenotypes", Settings(model_dir=model_dir, device="cpu",
                                                      intra_op_threads=1, io_binding="on"))
    assert not plain.io_binding and bound.io_binding  # auto on CPU: off
    stays = [StayPayload.model_validate(stay(hours=h)) for h in ((1.0, 5.0), (2.0, 30.0, 47.0))]
    inputs = prepare(plain.spec, stays).inputs
    assert inputs is not None
    calls: list[str] = []
    assert bound.bound is not None and bound.bound.device == "cpu" and not bound.bound.pad
    bound.bound.session = _Spy(bound.bound.session, calls)  # type: ignore[assignment]
    a, b = plain.run(inputs), bound.run(inputs)
    assert calls == ["run_with_iobinding"]
    for k in ("z", "anchor_logits", "probability"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))


class _Spy:
    """A session that records which run method was used."""

    def __init__(self, session: ort.InferenceSession, calls: list[str]) -> None:
        self._s, self._calls = session, calls

    def __getattr__(self, name: str) -> object:
        if name.startswith("run"):
            self._calls.append(name)
        return getattr(self._s, name)


@pytest.mark.skipif(CUDA_WORKS, reason="a working CUDA provider is present")
def test_device_cuda_fails_clearly_without_gpu(model_dir: Path) -> None:
    with pytest.raises(DeviceError, match="device=cuda but") as e:
        probe_device("cuda")
    assert "SCEHR_DEVICE=auto" in str(e.value)
    with pytest.raises(DeviceError):
        load_model(model_dir / "mortality" / "v1", "mortality",
                   Settings(model_dir=model_dir, device="cuda"))


@pytest.mark.skipif(CUDA_WORKS, reason="a working CUDA provider is present")
async def test_app_with_device_cuda_fails_at_start(model_dir: Path) -> None:
    app = create_app(Settings(model_dir=model_dir, device="cuda"))
    with pytest.raises(DeviceError, match=r"could not start its CUDA provider|no CUDA"):
        async with app.router.lifespan_context(app):
            pass


async def test_auto_runs_on_what_really_works(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, device="auto", tasks="mortality")) as c:
        info = (await c.get("/models/mortality")).json()
    assert info["provider"] == ("CUDAExecutionProvider" if CUDA_WORKS
                                else "CPUExecutionProvider")
    assert info["providers"][0] == info["provider"]


def test_inspect_rejects_bad_artifacts(tmp_path: Path) -> None:
    bad = write_model(tmp_path, "mortality", "sha", corrupt_sha=True)
    with pytest.raises(ModelLoadError, match="changed after export") as e:
        inspect(bad, "mortality")
    assert e.value.rule == "sha256_mismatch"
    old = write_model(tmp_path, "mortality", "old", contract_version="0.9")
    with pytest.raises(ModelLoadError, match=r"contract version 0\.9") as e:
        inspect(old, "mortality")
    assert e.value.rule == "contract_version"
    with pytest.raises(ModelLoadError, match="not mortality"):
        inspect(write_model(tmp_path, "phenotypes", "p"), "mortality")
    m = json.loads((old / "manifest.json").read_text())
    m["contract_version"] = "1.0"
    m["classes"] = []
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelLoadError) as e:
        inspect(old, "mortality")
    assert e.value.rule == "manifest_inconsistent"


def test_index_and_resolve(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model index"):
        read_index(tmp_path)
    write_model(tmp_path, "mortality", "v1")
    write_index(tmp_path, [("mortality", "v1")])
    index = read_index(tmp_path)
    assert resolve(tmp_path, index, "mortality") == (tmp_path / "mortality" / "v1").resolve()
    with pytest.raises(ModelLoadError, match="no default model"):
        resolve(tmp_path, index, "phenotypes")
    with pytest.raises(ModelLoadError, match="outside"):
        resolve(tmp_path, index, "mortality", path="/etc")


def test_preflight_fails_fast_on_missing_index(tmp_path: Path) -> None:
    reg = Registry(Settings(model_dir=tmp_path, device="cpu"), None, None)  # type: ignore
    with pytest.raises(ModelLoadError, match="no model index"):
        reg.preflight()


def test_model_state_is_an_enum_shown_as_before() -> None:
    from scehr.service.registry import ModelState, TaskState

    assert str(TaskState(ModelState.LOADING)) == "loading"
    assert str(TaskState(ModelState.READY)) == "ready" and TaskState(ModelState.READY).ready
    assert str(TaskState(ModelState.FAILED, "bad graph")) == "failed: bad graph"


def test_runtimes_keep_what_they_learnt_about_cuda_to_themselves() -> None:
    from scehr.service.runtime import OrtRuntime

    a, b = OrtRuntime("auto", 1), OrtRuntime("auto", 1)
    a.cuda_works = False
    assert a.providers() == ["CPUExecutionProvider"] and b.cuda_works is None
    assert OrtRuntime("cpu", 1).probe() == "CPUExecutionProvider"


def test_auto_tries_cuda_quietly_and_says_it_once(capfd: pytest.CaptureFixture[str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """onnxruntime-gpu without a usable GPU: no red ONNX Runtime errors at start under
    device=auto, one warning of ours instead (device=cuda keeps ORT's error: it explains why
    the service refuses to start)."""
    if CUDA not in ort.get_available_providers():
        pytest.skip("this onnxruntime build has no CUDA provider to try")
    rt = OrtRuntime("auto", 1)
    with caplog.at_level(logging.WARNING, logger="scehr.registry"):
        provider = rt.probe()
        rt.probe()
    if provider == CUDA:
        pytest.skip("CUDA works on this machine: there is no fallback to be quiet about")
    err = capfd.readouterr().err
    assert "[E:onnxruntime" not in err and "Failed to load library" not in err, err[:300]
    assert sum("not usable" in r.getMessage() for r in caplog.records) == 1
