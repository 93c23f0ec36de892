"""scripts/build_default_models refuses what would make a shipped model irreproducible."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO


def run(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scripts/build_default_models", *args], cwd=repo, text=True,
                          capture_output=True, env={**os.environ, **env}, timeout=60)


def test_refuses_dirty_trees_and_existing_versions(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "build_default_models", repo / "scripts")
    (repo / "models" / "mortality" / "1.0.0").mkdir(parents=True)
    (repo / "models" / "mortality" / "1.0.0" / "manifest.json").write_text("{}")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)

    r = run(repo, "mortality", "1.0.0")
    assert r.returncode == 1 and "versions are immutable" in r.stderr
    r = run(repo, "mortality", "2.0.0", "--check")
    assert r.returncode == 1 and "--check: no models/mortality/2.0.0/manifest.json" in r.stderr
    (repo / "notes.txt").write_text("uncommitted")
    r = run(repo, "mortality", "2.0.0")
    assert r.returncode == 1 and "refusing to build" in r.stderr and "SCEHR_ALLOW_DIRTY" in r.stderr
    r = run(repo, "mortality", "2.0.0", SCEHR_ALLOW_DIRTY="1", SCEHR_DATA_DIR=str(tmp_path))
    assert r.stderr.startswith("WARNING: building from a tree with uncommitted changes")
    assert r.returncode != 0  # then it stops: this bare repo has no venv to train with
    r = run(repo, "mortality", "2.0.0", "--config", "configs/nope.toml", SCEHR_ALLOW_DIRTY="1")
    assert r.returncode == 2 and "no config configs/nope.toml" in r.stderr
    r = run(repo, "mortality")
    assert r.returncode == 1 and "usage" in r.stderr
