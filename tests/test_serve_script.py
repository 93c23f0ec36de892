"""./scripts/serve and ./scripts/test share one .venv in any order, any number of times.

Both source scripts/lib/venv.sh, which picks one ONNX Runtime (the `cpu` extra, or `gpu` where
nvidia-smi lists a GPU) and keeps it the only one. Run on copies of the scripts beside a fake
`.venv` whose `python` models pip as it behaves with the two runtime wheels (both install the same
module: removing one while the other stays breaks the module; installing a wheel already there
changes nothing), so the tests install nothing and start no server. The real probe runs once on
this test run's own interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
v="$(cd "$(dirname "$0")/.." && pwd)"
case "$*" in
  *scehr-runtime-probe*) echo "python <probe>" >> "$v/calls"
     sort "$v/installed"
     if [ ! -s "$v/installed" ]; then echo "broken: ModuleNotFoundError: No module named x"
     elif [ -f "$v/broken" ]; then echo "broken: AttributeError: no get_available_providers"
     else echo ok; fi
     exit 0 ;;
esac
echo "python $*" >> "$v/calls"
case "$*" in
  *"pip install -q -e"*) spec="${@: -1}"; spec="${spec#.[}"; spec="${spec%]}"
     wheel=onnxruntime
     if [ "${spec##*,}" = gpu ] && [ "$(uname -sm)" = "Linux x86_64" ]; then
       wheel=onnxruntime-gpu; fi
     add() { grep -qx "$1" "$v/installed" || { echo "$1" >> "$v/installed"; rm -f "$v/broken"; }; }
     add "$wheel"
     if [ -f "$v/pulls_other" ]; then
       add "$( [ "$wheel" = onnxruntime ] && echo onnxruntime-gpu || echo onnxruntime)"; fi ;;
  *"pip uninstall"*) for name in "$@"; do
       case "$name" in onnxruntime|onnxruntime-gpu) ;; *) continue ;; esac
       grep -qx "$name" "$v/installed" || continue
       grep -vx "$name" "$v/installed" > "$v/i.new"; mv "$v/i.new" "$v/installed"
       if [ -s "$v/installed" ]; then touch "$v/broken"; else rm -f "$v/broken"; fi
     done ;;
esac
exit 0
"""
RECORDER = '#!/usr/bin/env bash\necho "{name} $*" >> "$(dirname "$0")/../calls"\n'
NVIDIA_SMI = "#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n"
TOOLS = ("bash", "env", "cat", "cut", "dirname", "grep", "mv", "rm", "sed", "sha256sum", "sort",
         "touch", "tr", "uname")
GPU_WHEEL = "onnxruntime-gpu" if os.uname().sysname == "Linux" and \
    os.uname().machine == "x86_64" else "onnxruntime"


def project(tmp_path: Path, installed: list[str] = (), broken: bool = False) -> Path:
    root = tmp_path / "repo"
    (root / "scripts" / "lib").mkdir(parents=True)
    for script in ("serve", "test", "lib/venv.sh"):
        shutil.copy(REPO / "scripts" / script, root / "scripts" / script)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON)
    for exe in ("scehr", "ruff"):
        (venv / "bin" / exe).write_text(RECORDER.format(name=exe))
    for exe in ("python", "scehr", "ruff"):
        (venv / "bin" / exe).chmod(0o755)
    (venv / "installed").write_text("".join(f"{n}\n" for n in installed))
    if broken:
        (venv / "broken").touch()
    return root


def run(root: Path, script: str, *args: str, gpu: bool = False,
        env: dict[str, str] | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run scripts/SCRIPT on a PATH of plain tools, plus an nvidia-smi that lists a GPU when
    `gpu`; the calls it made are in .venv/calls."""
    tools = root.parent / ("bin-gpu" if gpu else "bin")
    if not tools.exists():
        tools.mkdir()
        for name in TOOLS:
            (tools / name).symlink_to(shutil.which(name))
        if gpu:
            (tools / "nvidia-smi").write_text(NVIDIA_SMI)
            (tools / "nvidia-smi").chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SCEHR_")}
    (root / ".venv" / "calls").unlink(missing_ok=True)
    res = subprocess.run([str(root / "scripts" / script), *args],
                         env={**clean, "PATH": str(tools), **(env or {})},
                         capture_output=True, text=True, timeout=60)
    assert (res.returncode == 0) == ok, res.stderr
    return res


def calls(root: Path) -> list[str]:
    path = root / ".venv" / "calls"
    return path.read_text().splitlines() if path.exists() else []


def installs(root: Path) -> list[str]:
    return [c for c in calls(root) if "pip install -q -e" in c]


def runtime(root: Path) -> tuple[list[str], bool]:
    """The wheels the fake .venv holds, and whether its onnxruntime module imports."""
    venv = root / ".venv"
    return sorted(venv.joinpath("installed").read_text().split()), not (venv / "broken").exists()


def test_installs_the_cpu_extra_once_then_only_when_pyproject_changes(tmp_path: Path) -> None:
    root = project(tmp_path)
    run(root, "serve", "--port", "8123")
    assert installs(root) == ["python -m pip install -q -e .[serve,cpu]"]
    assert calls(root)[-1] == "scehr serve --port 8123"
    run(root, "serve", "--port", "8123")
    assert installs(root) == []
    assert calls(root)[-1] == "scehr serve --port 8123"
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    run(root, "serve")
    assert installs(root) == ["python -m pip install -q -e .[serve,cpu]"]


def test_gpu_and_cpu_flags_switch_the_runtime_and_keep_one(tmp_path: Path) -> None:
    root = project(tmp_path)
    run(root, "serve", "--gpu")
    assert installs(root) == ["python -m pip install -q -e .[serve,gpu]"]
    assert calls(root)[-1] == "scehr serve"  # the flag is the script's, not scehr's
    assert runtime(root) == ([GPU_WHEEL], True)
    run(root, "serve", "--cpu")
    assert installs(root) == ["python -m pip install -q -e .[serve,cpu]"]
    assert runtime(root) == (["onnxruntime"], True)


def test_a_machine_with_an_nvidia_gpu_gets_the_gpu_runtime_in_both_scripts(tmp_path: Path) -> None:
    root = project(tmp_path)
    run(root, "test", "-q", gpu=True)
    assert installs(root) == ["python -m pip install -q -e .[dev,gpu]"]
    assert calls(root)[-2:] == ["ruff check .", "python -m pytest -q"]
    run(root, "serve", gpu=True)
    assert installs(root) == ["python -m pip install -q -e .[serve,gpu]"]
    assert not [c for c in calls(root) if "uninstall" in c]
    assert runtime(root) == ([GPU_WHEEL], True)


# The README's two commands in the orders a developer runs them, on each kind of machine.
SEQUENCES = [
    ["serve", "test", "serve"],
    ["test", "serve", "test", "serve", "serve"],
    ["serve", "serve --gpu", "test", "serve", "serve --cpu", "test"],
    ["test", "test", "serve --gpu", "serve"],
]


#: What .venv holds before: nothing; both wheels (a dev install of the old extras after a CPU
#: serve install); the GPU wheel listed but its module broken (the old serve then uninstalled
#: plain onnxruntime beside it).
STARTS = {"fresh": [], "both": ["onnxruntime", "onnxruntime-gpu"], "broken": ["onnxruntime-gpu"]}


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu-machine", "gpu-machine"])
@pytest.mark.parametrize("steps", SEQUENCES, ids=["-".join(s).replace(" --", "+")
                                                  for s in SEQUENCES])
@pytest.mark.parametrize("start", list(STARTS))
def test_any_order_of_the_two_scripts_leaves_exactly_one_working_runtime(
        tmp_path: Path, steps: list[str], gpu: bool, start: str) -> None:
    """Whatever .venv held before (STARTS), every step ends with exactly the runtime that step
    chose, importable, and the server or the tests started."""
    root = project(tmp_path, installed=STARTS[start], broken=start == "broken")
    for step in steps:
        script, *flags = step.split()
        run(root, script, *flags, gpu=gpu)
        asked = flags[0][2:] if flags else ("gpu" if gpu else "cpu")
        assert runtime(root) == ([GPU_WHEEL if asked == "gpu" else "onnxruntime"], True), step
        assert calls(root)[-1] == ("scehr serve" if script == "serve" else "python -m pytest")


def test_a_venv_with_both_wheels_is_repaired_and_says_so(tmp_path: Path) -> None:
    root = project(tmp_path, installed=["onnxruntime", "onnxruntime-gpu"])
    res = run(root, "serve")
    assert "python -m pip uninstall -qq -y onnxruntime onnxruntime-gpu" in calls(root)
    assert "holds 'onnxruntime onnxruntime-gpu ok'" in res.stderr
    assert "uninstalling both wheels, then installing onnxruntime" in res.stderr
    assert runtime(root) == (["onnxruntime"], True)


def test_a_stamped_venv_whose_module_broke_is_repaired_before_the_start(tmp_path: Path) -> None:
    """The install stamp says all is done, but the module no longer imports (a wheel was
    uninstalled by hand beside the other): the start repairs it instead of failing."""
    root = project(tmp_path)
    run(root, "serve")
    (root / ".venv" / "broken").touch()
    run(root, "serve")
    assert installs(root) == ["python -m pip install -q -e .[serve,cpu]"]
    assert runtime(root) == (["onnxruntime"], True)


@pytest.mark.parametrize("script", ["serve", "test"])
def test_a_venv_the_install_cannot_fix_stops_with_the_fix(tmp_path: Path, script: str) -> None:
    """Something installs the other wheel too: no server and no tests start on it; the
    message says what .venv holds and the commands that fix it."""
    root = project(tmp_path)
    (root / ".venv" / "pulls_other").touch()
    res = run(root, script, ok=False)
    assert res.returncode == 1
    assert "it should hold onnxruntime alone" in res.stderr
    assert "it holds: onnxruntime onnxruntime-gpu ok" in res.stderr
    assert "Fix: .venv/bin/python -m pip uninstall -y onnxruntime onnxruntime-gpu" in res.stderr
    assert not [c for c in calls(root) if c.startswith(("scehr", "ruff", "python -m pytest"))]


def test_an_unknown_runtime_is_refused_in_one_line(tmp_path: Path) -> None:
    root = project(tmp_path)
    res = run(root, "serve", env={"SCEHR_RUNTIME": "rocm"}, ok=False)
    assert res.stderr.strip() == "scripts/serve: SCEHR_RUNTIME must be cpu or gpu, not 'rocm'"
    assert calls(root) == []


def test_the_probe_sees_exactly_one_working_runtime_in_this_test_environment(
        tmp_path: Path) -> None:
    """The real probe of scripts/lib/venv.sh on the interpreter running these tests (the .venv
    ./scripts/test set up): one runtime wheel, and a module that imports."""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = subprocess.run(["bash", "-c", f". '{REPO}/scripts/lib/venv.sh'; scehr_runtime_state"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() in ("onnxruntime ok", "onnxruntime-gpu ok"), out.stdout


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]


def _requirements(extra: str, extras: dict[str, list[str]]) -> list[str]:
    """The extra's requirements, with the scehr[...] extras it names expanded."""
    out = []
    for req in extras[extra]:
        match = re.fullmatch(r"scehr\[([\w,-]+)\]", req.split(";")[0].strip())
        out += ([r for e in match.group(1).split(",") for r in _requirements(e, extras)]
                if match else [req])
    return out


def test_only_the_runtime_extras_name_an_onnx_runtime() -> None:
    """The scripts add `cpu` or `gpu` to `serve` and `dev`: any other extra naming a runtime
    would put the second wheel beside the chosen one."""
    extras = _extras()
    runtime = {e: [r for r in _requirements(e, extras) if r.startswith("onnxruntime")]
               for e in extras}
    assert {e for e, reqs in runtime.items() if reqs} == {"cpu", "gpu"}
    assert runtime["cpu"] == ["onnxruntime==1.31.1"]
    assert [r.split(";")[0] for r in runtime["gpu"]] == ["onnxruntime-gpu==1.31.1",
                                                         "onnxruntime==1.31.1"]
