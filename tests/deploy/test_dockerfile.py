"""The Dockerfile: hadolint-clean, and the rules that matter checked on its text."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scehr.service.cli import register
from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
TEXT = DOCKERFILE.read_text()


def instructions(name: str) -> list[str]:
    """Arguments of every `name` instruction (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", TEXT)
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", joined, re.M)]


def test_hadolint_passes() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    out = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_runtime_is_non_root_exposed_healthchecked_and_exec_form() -> None:
    last_stage = TEXT[TEXT.rindex("\nFROM "):]
    user = re.findall(r"^USER\s+(\S+)", last_stage, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root")
    health = instructions("HEALTHCHECK")[0]
    assert "/livez" in health and "CMD [" in health and "curl" not in health
    entry, cmd = json.loads(instructions("ENTRYPOINT")[0]), json.loads(instructions("CMD")[-1])
    assert entry == ["scehr"]  # exec form: SIGTERM reaches the server, no shell in between
    assert cmd[:1] == ["serve"] and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    env = " ".join(instructions("ENV"))
    assert "TMPDIR=/tmp" in env and "SCEHR_MODEL_DIR=/opt/scehr/models" in env
    # HOME exists on a read-only root: ONNX Runtime writes no telemetry error to the log
    assert "HOME=/tmp" in env


def test_the_port_is_set_in_one_place() -> None:
    """ARG PORT feeds SCEHR_PORT, which `scehr serve`, EXPOSE and the health check read."""
    assert re.findall(r"^ARG PORT=(\d+)$", TEXT, re.M) == ["8000"]
    assert instructions("EXPOSE") == ["${PORT}"]
    assert "SCEHR_PORT=${PORT}" in " ".join(instructions("ENV"))
    assert 'os.environ[\\"SCEHR_PORT\\"]' in instructions("HEALTHCHECK")[0]
    assert "--port" not in instructions("CMD")[-1]
    assert not re.search(r"\b8000\b", TEXT.replace("ARG PORT=8000", ""))



def test_serve_listens_on_scehr_port(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, port in (("9123", 9123), (None, 8000)):
        if env is None:
            monkeypatch.delenv("SCEHR_PORT", raising=False)
        else:
            monkeypatch.setenv("SCEHR_PORT", env)
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers())
        assert parser.parse_args(["serve"]).port == port


def test_one_base_for_build_and_cpu_runtime_pinnable_by_digest() -> None:
    froms = instructions("FROM")
    assert froms[0] == "${BASE_IMAGE} AS build"
    assert "${BASE_IMAGE} AS runtime-cpu" in froms and "${CUDA_IMAGE} AS runtime-gpu" in froms
    # no base written out in a FROM: every one comes from an ARG a build can pin by digest
    assert all(f.startswith("${") or f.startswith("runtime-") for f in froms), froms
    assert re.search(r"^ARG BASE_IMAGE=\S+$", TEXT, re.M)
    assert "@sha256:" in TEXT  # the comment shows how to pin


def test_build_and_runtime_python_minors_match() -> None:
    """The venv built on BASE_IMAGE is copied into CUDA_IMAGE for the GPU variant: both must
    be the same Ubuntu release (the same python3 minor); the CPU variant uses BASE_IMAGE for
    both stages. The runtime stage also imports the service with the copied venv, so another
    base with another minor fails the build instead of the pod."""
    base = re.search(r"^ARG BASE_IMAGE=ubuntu:(\d+\.\d+)(@sha256:[0-9a-f]{64})?$", TEXT, re.M)
    cuda = re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-ubuntu(\d+\.\d+)(@sha256:[0-9a-f]{64})?$",
                     TEXT, re.M)
    assert base and cuda, "BASE_IMAGE and CUDA_IMAGE name their Ubuntu release"
    assert base.group(1) == cuda.group(1)
    runtime = TEXT[TEXT.rindex("\nFROM runtime-"):]
    assert re.search(r'RUN /opt/venv/bin/python -c "import onnxruntime, scehr.service.app"',
                     runtime)


def test_only_the_service_enters_the_image() -> None:
    ignore = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*" and "!training/" not in ignore and "!service/" in ignore
    copies = " ".join(instructions("COPY"))
    assert "training" not in copies and "tests" not in copies
    # the variant is pyproject.toml's runtime extra: the CPU image installs plain onnxruntime
    assert '".[serve,${VARIANT}${EXTRAS:+,$EXTRAS}]"' in TEXT


def test_cuda_base_matches_the_pinned_onnxruntime_gpu() -> None:
    """The base image's CUDA major equals the one onnxruntime-gpu was built with; cuDNN 9."""
    pyproject = (REPO / "pyproject.toml").read_text()
    pinned = re.search(r'"onnxruntime-gpu==([\d.]+)', pyproject).group(1)
    assert f"onnxruntime-gpu=={pinned}" in TEXT
    base = re.search(r"ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-runtime", TEXT)
    assert base, "the GPU base must be an nvidia/cuda cudnn-runtime image"
    assert f"CUDA {base.group(1)}.{base.group(2)}" in TEXT and "cuDNN 9" in TEXT
    info = pytest.importorskip("onnxruntime.capi.build_and_package_info")
    if getattr(info, "package_name", "") != "onnxruntime-gpu":
        pytest.skip("onnxruntime-gpu is not installed here (CPU wheel)")
    assert info.__version__ == pinned
    assert info.cuda_version.split(".")[0] == base.group(1)
