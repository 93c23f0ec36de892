"""./scripts/serve installs once (a stamp keyed on pyproject.toml and the extra) and picks the
CPU-only extra on a machine without an NVIDIA GPU, or when asked with --cpu.

Run on a copy of the script beside a fake `.venv` whose `python` and `scehr` only record how
they were called, so the test installs nothing and starts no server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$(dirname "$0")/../calls"
case "$*" in
  *importlib.metadata*) grep -qx "$3" "$(dirname "$0")/../installed" 2>/dev/null; exit $? ;;
  *"pip install -q -e"*) extra="${@: -1}"; extra="${extra#.[}"; extra="${extra%]}"
     if [ "$extra" = serve-cpu ]; then echo onnxruntime; else echo onnxruntime-gpu; fi \\
       >> "$(dirname "$0")/../installed" ;;
  *"pip uninstall"*) v="$(dirname "$0")/.."; grep -vx "${@: -1}" "$v/installed" > "$v/i.new"
     mv "$v/i.new" "$v/installed" ;;
esac
exit 0
"""


def project(tmp_path: Path, installed: list[str] = ()) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "serve", root / "scripts" / "serve")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON)
    (venv / "bin" / "scehr").write_text(
        '#!/usr/bin/env bash\necho "scehr $*" >> "$(dirname "$0")/../calls"\n')
    for exe in ("python", "scehr"):
        (venv / "bin" / exe).chmod(0o755)
    (venv / "installed").write_text("".join(f"{n}\n" for n in installed))
    return root


TOOLS = ("bash", "env", "cat", "cut", "dirname", "grep", "mv", "sha256sum", "uname")


def serve(root: Path, *args: str) -> list[str]:
    """Run the script on a PATH of plain tools (no nvidia-smi, as on a CPU-only machine); the
    calls it made, then forget them."""
    tools = root.parent / "bin"
    if not tools.exists():
        tools.mkdir()
        for name in TOOLS:
            (tools / name).symlink_to(shutil.which(name))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    env["PATH"] = str(tools)
    res = subprocess.run([str(root / "scripts" / "serve"), *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = root / ".venv" / "calls"
    out = calls.read_text().splitlines()
    calls.unlink()
    return out


def installs(calls: list[str]) -> list[str]:
    return [c for c in calls if "pip install -q -e" in c]


def test_installs_the_cpu_extra_once_then_only_when_pyproject_changes(tmp_path: Path) -> None:
    root = project(tmp_path)
    first = serve(root, "--port", "8123")
    assert installs(first) == ["python -m pip install -q -e .[serve-cpu]"]
    assert first[-1] == "scehr serve --port 8123"
    second = serve(root, "--port", "8123")
    assert installs(second) == []
    assert second[-1] == "scehr serve --port 8123"
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    assert installs(serve(root)) == ["python -m pip install -q -e .[serve-cpu]"]


def test_gpu_and_cpu_flags_switch_the_extra_and_keep_one_onnxruntime(tmp_path: Path) -> None:
    root = project(tmp_path)
    calls = serve(root, "--gpu")
    assert installs(calls) == ["python -m pip install -q -e .[serve]"]
    assert calls[-1] == "scehr serve"  # the flag is the script's, not scehr's
    calls = serve(root, "--cpu")
    assert "python -m pip uninstall -q -y onnxruntime-gpu" in calls
    assert installs(calls) == ["python -m pip install -q -e .[serve-cpu]"]
    assert (root / ".venv" / "installed").read_text().split() == ["onnxruntime"]


def test_a_dev_install_with_the_gpu_wheel_is_kept(tmp_path: Path) -> None:
    """A .venv made by ./scripts/test holds onnxruntime-gpu: serve uses it, uninstalls nothing."""
    root = project(tmp_path, installed=["onnxruntime-gpu"])
    calls = serve(root)
    assert installs(calls) == ["python -m pip install -q -e .[serve]"]
    assert not [c for c in calls if "uninstall" in c]
