"""Static checks of the code's shape: the layering rule and "no branching on a task's name".

Layering (docs/extending.md): schemas <- training, schemas <- service. `schemas` is the
shared contract and stays light (no torch, pandas or scikit-learn); the service never imports
training code or torch; training never imports the service. Checked on the source with `ast`,
so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TASK_REGISTRY = REPO / "schemas" / "tasks.py"


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module `path` imports (absolute imports), anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


FORBIDDEN = {
    "schemas": ("torch", "pandas", "sklearn", "training", "service"),
    "service": ("torch", "training"),
    "training": ("service",),
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(package: str) -> None:
    bad = []
    for path in sources(package):
        for mod in imported_modules(path):
            if mod.split(".")[0] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(REPO)} imports {mod}")
    assert not bad, f"{package} breaks the layering rule:\n" + "\n".join(bad)


def test_the_training_library_never_imports_the_studies() -> None:
    """training/studies/ builds on the library; the library (what export and serve rely on)
    stays free of research code, so a study can change without touching a shipped path. The
    CLI (training/cli.py) is the one exception: it dispatches the study subcommands."""
    studies = REPO / "training" / "studies"
    bad = [f"{path.relative_to(REPO)} imports {mod}"
           for path in sources("training") if studies not in path.parents
           for mod in imported_modules(path) if mod.startswith("training.studies")
           and path != REPO / "training" / "cli.py"]
    assert not bad, "the training library imports a study:\n" + "\n".join(bad)


def test_layering_check_sees_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import torch.nn\n    from training.fit import fit\n")
    assert imported_modules(f) == {"torch.nn", "training.fit"}


_NAMES = r"['\"](?:mortality|phenotypes)['\"]"
#: Branches on a task's name: `== "mortality"`, `"phenotypes" !=`, `in ("mortality", ...)`,
#: `Literal["mortality", ...]`, and the list of tasks spelled out (`["mortality", "phenotypes"]`).
TASK_BRANCH = re.compile(
    rf"[=!]=\s*{_NAMES}|{_NAMES}\s*[=!]=|\bin\s*[(\[{{]\s*{_NAMES}|Literal\[\s*{_NAMES}"
    rf"|[(\[{{]\s*{_NAMES}\s*,\s*{_NAMES}")


def task_branches(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if TASK_BRANCH.search(line)]


def test_no_module_outside_the_task_registry_branches_on_a_task_name() -> None:
    bad = []
    files = [*sources("schemas"), *sources("service"), *sources("training"),
             *sources("benchmarks"), REPO / "scehr_cli.py"]
    for path in files:
        if path == TASK_REGISTRY:
            continue
        bad += [f"{path.relative_to(REPO)}: {line}" for line in task_branches(path.read_text())]
    assert not bad, "look the task up in schemas.tasks instead:\n" + "\n".join(bad)


@pytest.mark.parametrize("line", [
    'if task == "mortality":', "x = 1 if 'phenotypes' != t else 2",
    'if task in ("mortality", "both"):', 'task: Literal["mortality", "phenotypes"]',
    'choices=["mortality", "phenotypes"]', 'for t in ("mortality", "phenotypes"):'])
def test_task_branch_pattern_catches(line: str) -> None:
    assert task_branches(line) == [line]


def test_task_branch_pattern_lets_lookups_pass() -> None:
    assert task_branches('TASK_DIRS["mortality"]\nspec = task_spec("phenotypes")') == []
