"""The real thing: `scehr serve` as a process; the CLI; no torch in the service."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from scehr import cli as scehr_cli
from tests.service.conftest import stay, wait_until_serving

REPO = Path(__file__).resolve().parents[2]


def scehr_command() -> list[str]:
    exe = Path(sys.executable).parent / "scehr"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "scehr.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_service_never_imports_torch_or_training() -> None:
    code = ("import sys, service.app, service.cli, service.registry; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'training')); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_scehr_serve_process_end_to_end(model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prom")
    proc = subprocess.Popen(
        [*scehr_command(), "serve", "--port", str(port), "--model-dir", str(model_dir),
         "--device", "cpu"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base, lambda: proc.communicate()[1])
        r = httpx.post(f"{base}/predict/mortality", json=stay(id="proc-1"), timeout=10)
        assert r.status_code == 200 and r.json()["id"] == "proc-1"
        r = httpx.post(f"{base}/predict/phenotypes/batch", json={"stays": [stay(), {}]},
                       timeout=10)
        assert r.status_code == 200 and r.json()["items"][1]["errors"]
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert 'scehr_requests_total{endpoint="/predict/mortality"' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, err[-3000:]
    assert '"logger": "scehr.access"' in err and "Shutting down" in err


def test_cli_models_list(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scehr_cli.main(["models", "list", "--model-dir", str(model_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["TASK", "VERSION", "DEFAULT"]
    rows = [line.split() for line in out[1:]]
    assert rows[0][:3] == ["mortality", "v1", "*"] and rows[1][:2] == ["mortality", "v2"]
    assert "0.850" in out[1]
    assert scehr_cli.main(["models", "list", "--json", "--model-dir", str(model_dir)]) == 0
    assert '"defaults"' in capsys.readouterr().out


def test_cli_serve_fails_clearly(tmp_path: Path, model_dir: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    for k in {*(k for k in os.environ if k.startswith("SCEHR_")), "SCEHR_MODEL_DIR",
              "SCEHR_DEVICE", "SCEHR_WORKERS", "SCEHR_LOG_LEVEL"}:
        monkeypatch.setenv(k, "")  # recorded, so what `serve` sets is undone afterwards
        monkeypatch.delenv(k)
    assert scehr_cli.main(["serve", "--model-dir", str(tmp_path)]) == 1
    assert "no model index" in capsys.readouterr().err
    if shutil.which("nvidia-smi") is None:  # no GPU: device=cuda must refuse to start
        assert scehr_cli.main(["serve", "--model-dir", str(model_dir), "--device", "cuda"]) == 1
        assert "device=cuda but" in capsys.readouterr().err
