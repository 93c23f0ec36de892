"""`scehr serve` uses the cores by default: one worker per available core, cgroup quota included."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from scehr import cli as scehr_cli
from scehr.service import settings as settings_mod
from scehr.service.settings import Settings, _cgroup_quota, available_cores
from tests.service.test_svc_process import free_port


def test_cgroup_v2_quota_rounds_up(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_quota(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_quota(tmp_path) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cgroup_quota(tmp_path) == 3
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert _cgroup_quota(tmp_path) is None
    assert _cgroup_quota(tmp_path / "absent") is None


def test_quota_caps_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_mod, "_cgroup_quota", lambda: 1)
    assert available_cores() == 1
    monkeypatch.setattr(settings_mod, "_cgroup_quota", lambda: None)
    assert available_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("given", "cores", "workers", "threads"),
                         [(None, 4, 4, 1), (None, 1, 1, 1), (["--workers", "2"], 8, 2, 4)])
def test_serve_default_workers_follow_the_cores(
        monkeypatch: pytest.MonkeyPatch, model_dir: Path, given: list[str] | None, cores: int,
        workers: int, threads: int) -> None:
    """Without --workers, one worker per core and one ORT thread each; with it, the cores are
    shared out between the workers (SCEHR_WORKERS reaches every worker's Settings)."""
    import uvicorn

    from scehr.service import workers as workers_mod

    seen: dict[str, Any] = {}

    def fake_run(*_: Any, **kw: Any) -> None:
        seen["workers"] = kw["workers"]
        seen["threads"] = Settings().ort_threads
        seen["multiproc"] = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

    monkeypatch.setattr(uvicorn, "run", fake_run)
    monkeypatch.setattr(workers_mod, "run_workers",
                        lambda config, _: fake_run(workers=config.workers) or 0)
    monkeypatch.setattr(settings_mod, "available_cores", lambda: cores)
    for k in [k for k in os.environ if k.startswith("SCEHR_")]:
        monkeypatch.delenv(k)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("SCEHR_DEVICE", "cpu")  # undone afterwards, like what serve sets
    monkeypatch.setenv("SCEHR_WORKERS", "1")
    monkeypatch.setenv("SCEHR_MODEL_DIR", str(model_dir))
    assert scehr_cli.main(["serve", "--model-dir", str(model_dir), "--device", "cpu",
                           "--port", str(free_port()), *(given or [])]) == 0
    assert seen["workers"] == workers and seen["threads"] == threads
    # several workers: a private metrics folder of the service's own, removed at exit
    assert (seen["multiproc"] is not None) == (workers > 1)
    if seen["multiproc"]:
        assert not Path(seen["multiproc"]).exists()


def test_serve_refuses_zero_workers(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scehr_cli.main(["serve", "--model-dir", str(model_dir), "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err
