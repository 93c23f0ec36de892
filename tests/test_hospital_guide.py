"""docs/hospital.md works as written: every command in its bash blocks runs, in order, on real
open data (the eICU demo as "your hospital"), from a FHIR prediction on the shipped model to a
site recalibration served and called through CDS Hooks.

The commands are taken from the page itself, with two substitutions the page's readers do not
need: a free port instead of 8000 (several suites may share a machine), and `--workers 1` on
`scehr serve` (one worker is enough for one request at a time). A `scehr serve` line starts a
server in the background (the next one replaces it) and waits for /readyz.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import SHARED_DATA, needs_shared_data

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "hospital.md"


def guide_commands(text: str) -> list[str]:
    """The non-empty lines of the page's ```bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"scehr serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"scehr serve not ready on port {port} after {timeout:.0f} s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_guide_lists_the_five_steps_as_commands() -> None:
    commands = guide_commands(GUIDE.read_text())
    firsts = [c.split()[:2] for c in commands]
    assert ["scehr", "evaluate"] in firsts and ["scehr", "recalibrate"] in firsts
    assert sum(c[:2] == ["scehr", "serve"] for c in firsts) == 2
    assert any("/fhir/predict/" in c for c in commands)
    assert any("/cds-services/" in c for c in commands)


@needs_shared_data
def test_a_newcomer_follows_the_guide_from_fhir_to_a_served_site_model(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("models", "examples", "configs"):
        (root / name).symlink_to(REPO / name)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(SHARED_DATA.resolve())
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SCEHR_DATA_DIR": str(SHARED_DATA.resolve())}
    env = {k: v for k, v in env.items() if k not in ("SCEHR_MODEL_DIR", "SCEHR_VERSIONS")}
    outputs: dict[str, str] = {}
    server: subprocess.Popen | None = None
    try:
        for command in guide_commands(GUIDE.read_text()):
            command = command.replace("8000", str(port))
            if command.startswith("scehr serve"):
                stop(server)
                server = subprocess.Popen(f"exec {command} --workers 1", shell=True, cwd=root,
                                          env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
                wait_ready(port, server)
                continue
            res = subprocess.run(["bash", "-c", command], cwd=root, env=env,
                                 capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            outputs[command] = res.stdout
    finally:
        stop(server)

    def out(fragment: str) -> str:
        return next(v for k, v in outputs.items() if fragment in k)

    fhir = json.loads(out("/fhir/predict/mortality"))
    risk = [e["resource"] for e in fhir["entry"]
            if e["resource"]["resourceType"] == "RiskAssessment"]
    assert len(risk) == 1 and risk[0]["method"]["coding"][0]["version"] == "1.3.1"
    assert 0 < risk[0]["prediction"][0]["probabilityDecimal"] < 1
    report = json.loads((root / "site-report" / "report.json").read_text())
    abstention = report["models"]["model"]["abstention"]
    assert abstention["n"] > 500 and report["warnings"] == []
    assert 0 < abstention["abstained"] < abstention["n"]  # below 1.3.1's data minimum
    assert report["models"]["model"]["scored"]["coverage"]["with_outcome"]["value"] is not None
    page = (root / "site-report" / "report.html").read_text()
    assert page.count("src='data:image/png;base64,") == len(report["plots"]) >= 6
    assert "auroc" in out("scehr evaluate") and "Event 1 = min(" in out("scehr evaluate")
    assert "abstain below the data minimum" in out("scehr evaluate")
    site = root / "site-models" / "mortality" / "1.3.1-site"
    assert (site / "model.onnx").read_bytes() == (REPO / "models" / "mortality" / "1.3.1" /
                                                 "model.onnx").read_bytes()
    assert "1.3.1-site" in out("scehr models list")
    discovery = next(v for k, v in outputs.items() if k.endswith("/cds-services"))
    assert "scehr-mortality" in discovery
    card = json.loads(out("/cds-services/scehr-mortality"))["cards"][0]
    assert card["extension"]["dev.scehr.result"]["version"] == "1.3.1-site"
    assert card["summary"].startswith("in-hospital death: risk ")
