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
#: The repository's folders installed under the one namespace (`scehr.service`, ...).
PACKAGES = ("schemas", "service", "training")


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def layer(module: str) -> str:
    """The part of the house a module belongs to: `scehr.service.app` -> `service`; a
    third-party module -> its top-level name."""
    parts = module.split(".")
    return parts[1] if parts[0] == "scehr" and len(parts) > 1 else parts[0]


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
            if layer(mod) in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(REPO)} imports {mod}")
    assert not bad, f"{package} breaks the layering rule:\n" + "\n".join(bad)


def test_the_training_library_never_imports_the_studies() -> None:
    """training/studies/ builds on the library; the library (what export and serve rely on)
    stays free of research code, so a study can change without touching a shipped path. The
    CLI (training/cli.py) is the one exception: it dispatches the study subcommands."""
    studies = REPO / "training" / "studies"
    bad = [f"{path.relative_to(REPO)} imports {mod}"
           for path in sources("training") if studies not in path.parents
           for mod in imported_modules(path) if mod.startswith("scehr.training.studies")
           and path != REPO / "training" / "cli.py"]
    assert not bad, "the training library imports a study:\n" + "\n".join(bad)


def test_layering_check_sees_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import torch.nn\n    from scehr.training.fit import fit\n")
    assert imported_modules(f) == {"torch.nn", "scehr.training.fit"}
    assert {layer(m) for m in imported_modules(f)} == {"torch", "training"}


def test_code_imports_the_house_only_through_its_namespace() -> None:
    """`service`, `training` and `schemas` are installed as `scehr.*` only: an import of the
    bare name works in a checkout and fails (or finds another project's module) elsewhere."""
    files = [*(p for pkg in PACKAGES for p in sources(pkg)), *sources("scehr"),
             *sources("tests"), *sources("benchmarks")]
    bad = [f"{path.relative_to(REPO)} imports {mod}" for path in files
           for mod in imported_modules(path) if mod.split(".")[0] in PACKAGES]
    assert not bad, "import them as scehr.<package>:\n" + "\n".join(bad)


def module_name(path: Path, root: Path, namespace: str | None = None) -> str:
    """`service/routes/fhir.py` -> `scehr.service.routes.fhir` (`scehr.service.routes.fhir` in the
    `scehr` namespace); a package's `__init__.py` -> its name."""
    parts = path.relative_to(root).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join([namespace, *parts] if namespace and parts[0] != namespace else parts)


def import_graph(root: Path, paths: list[Path], namespace: str | None = None
                 ) -> dict[str, set[str]]:
    """Module -> the modules among `paths` it imports, anywhere in it (a function-level import
    counts: it runs the imported module too, only later). `from a.b import c` is an edge to the
    module `a.b.c` when that is one, else to `a.b`."""
    modules = {module_name(p, root, namespace): p for p in paths}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                package = mod.split(".")[: len(mod.split(".")) - node.level
                                        + (path.name == "__init__.py")] if node.level else []
                base = ".".join([*package, *([node.module] if node.module else [])])
                names += [f"{base}.{a.name}" for a in node.names]
        graph[mod] = {m for m in map(resolve, names) if m is not None and m != mod}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, directly or around a loop: each strongly connected
    component of more than one module (Tarjan's algorithm, iterative), its names sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((m for m in edges if m not in index or m in on_stack), None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt is not None:
                low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_cycle() -> None:
    """No module imports, directly or through others, a module that imports it back: a cycle
    hides as a function-level import and breaks as soon as someone moves it to the top."""
    paths = [*(p for pkg in PACKAGES for p in sources(pkg)), *sources("scehr")]
    graph = import_graph(REPO, paths, "scehr")
    assert graph["scehr.service.app"], "the graph sees the namespace's imports"
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    files = {"__init__.py": "from pkg.a import f\n", "a.py": "from pkg import b\n",
             "b.py": "def g():\n    from pkg.c import h\n", "c.py": "from .a import f\n",
             "d.py": "import pkg.a\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, sorted(pkg.glob("*.py")))
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


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
             *sources("benchmarks"), *sources("scehr")]
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
