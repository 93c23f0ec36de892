"""docs/hospital.md works as written: every command in its bash blocks runs, in order, on real
open data (the eICU demo as "your hospital"), from a FHIR prediction on the shipped model to a
site recalibration served and called through CDS Hooks.

The commands are taken from the page itself, with two substitutions the page's readers do not
need: free ports instead of 8000 and 8001 (several suites may share a machine), and
`--workers 1` on `scehr serve` (one worker is enough for one request at a time). A `scehr
serve` line (with any `NAME=value` settings before it) starts a server in the background and
waits for /readyz; every server keeps running until the end, as a reader's terminals would, so
a page that started two on one port fails here.
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


#: A `scehr serve` line: settings given before the command, then the command.
SERVE = re.compile(r"^((?:[A-Z_][A-Z0-9_]*=\S+\s+)*)(scehr serve\b.*)$")


def guide_commands(text: str) -> list[str]:
    """The non-empty lines of the page's ```bash blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


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
    assert sum(SERVE.match(c) is not None for c in commands) == 2
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
    ports = {"8000": free_port(), "8001": free_port()}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SCEHR_DATA_DIR": str(SHARED_DATA.resolve())}
    env = {k: v for k, v in env.items() if k not in (
        "SCEHR_MODEL_DIR", "SCEHR_VERSIONS", "SCEHR_PUBLIC_BASE_URL")}
    outputs: dict[str, str] = {}
    servers: list[subprocess.Popen] = []
    try:
        for command in guide_commands(GUIDE.read_text()):
            for page_port, port in ports.items():
                command = command.replace(page_port, str(port))
            serve = SERVE.match(command)
            if serve:
                settings = dict(a.split("=", 1) for a in serve.group(1).split())
                port = int(re.search(r"--port (\d+)", command).group(1))  # type: ignore[union-attr]
                assert port_is_free(port), f"{command}: a server of the page already listens on "\
                    "this port (Address already in use)"
                servers.append(subprocess.Popen(
                    f"exec {serve.group(2)} --workers 1", shell=True, cwd=root,
                    env={**env, **settings}, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL))
                wait_ready(port, servers[-1])
                continue
            res = subprocess.run(["bash", "-c", command], cwd=root, env=env,
                                 capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            outputs[command] = res.stdout
    finally:
        for server in servers:
            stop(server)

    def out(fragment: str) -> str:
        return next(v for k, v in outputs.items() if fragment in k)

    index = json.loads((REPO / "models" / "index.json").read_text())
    version = index["defaults"]["mortality"]
    fhir = json.loads(out("/fhir/predict/mortality"))
    risk = [e["resource"] for e in fhir["entry"]
            if e["resource"]["resourceType"] == "RiskAssessment"]
    assert len(risk) == 1 and risk[0]["method"]["coding"][0]["version"] == version
    assert 0 < risk[0]["prediction"][0]["probabilityDecimal"] < 1
    # the page says what the answer holds: only the RiskAssessment for this example
    says_only = "the Bundle\nholds only the `RiskAssessment`" in GUIDE.read_text()
    assert says_only == ([e["resource"]["resourceType"] for e in fhir["entry"]]
                         == ["RiskAssessment"])
    report = json.loads((root / "site-report" / "report.json").read_text())
    abstention = report["models"]["model"]["abstention"]
    assert abstention["n"] > 500 and report["warnings"] == []
    assert 0 < abstention["abstained"] < abstention["n"]  # below the model's data minimum
    assert report["models"]["model"]["scored"]["coverage"]["with_outcome"]["value"] is not None
    page = (root / "site-report" / "report.html").read_text()
    assert page.count("src='data:image/png;base64,") == len(report["plots"]) >= 6
    assert "auroc" in out("scehr evaluate") and "Event 1 = min(" in out("scehr evaluate")
    assert "abstain below the data minimum" in out("scehr evaluate")
    site = root / "site-models" / "mortality" / f"{version}-site"
    assert (site / "report" / "report.html").is_file()  # the site model against its parent
    assert (site / "model.onnx").read_bytes() == (REPO / "models" / "mortality" / version /
                                                 "model.onnx").read_bytes()
    # the site model shows the site's held-out figures as the site's, the parent's as its own
    info = json.loads(out("/models/mortality"))
    assert info["version"] == f"{version}-site" and "test_ci" not in info["metrics"]
    figures = info["metrics"]["site"]["figures"]
    assert figures["on"].startswith("the held-out part of site-data")
    assert figures["auroc"]["low"] <= figures["auroc"]["value"] <= figures["auroc"]["high"]
    assert figures["coverage_with_outcome"]["value"] is not None
    assert info["metrics"]["parent"]["model"].endswith(version)
    listed = out("scehr models list")
    assert f"{version}-site" in listed and "site held-out part of site-data" in listed
    assert f"auroc {figures['auroc']['value']:.3f}" in listed
    # every point is served or withheld with its reason, and levels name served points
    withheld = {line.split()[1].rstrip(":") for line in info["metrics"]["site"]["changes"]
                if line.startswith("point ") and "withheld (" in line}
    assert set(info["operating_points"]) | withheld == {"high_sensitivity", "balanced",
                                                        "high_ppv"}
    discovery = next(v for k, v in outputs.items() if k.endswith("/cds-services"))
    assert "scehr-mortality" in discovery
    card = json.loads(out("/cds-services/scehr-mortality"))["cards"][0]
    assert card["extension"]["dev.scehr.result"]["version"] == f"{version}-site"
    assert card["summary"].startswith("in-hospital death: risk ")
    # the card links the site model's card, under SCEHR_PUBLIC_BASE_URL
    card_url = f"http://localhost:{ports['8001']}/models/mortality/card"
    assert card_url in [link["url"] for link in card["links"]]
