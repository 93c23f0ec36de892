"""The wheel installs one namespace, `scehr`, and nothing else at site-packages' top level."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

FOLDERS = ("service", "training", "schemas")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the files it packages."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("scehr", *FOLDERS):
        shutil.copytree(REPO / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    [built] = out.glob("scehr-*.whl")
    return built


def test_the_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"scehr"}
    info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(info).decode().split() == ["scehr"]


def test_every_package_folder_is_installed_under_scehr(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in FOLDERS:
        for init in (REPO / folder).rglob("__init__.py"):
            assert f"scehr/{init.relative_to(REPO).as_posix()}" in names
    assert "scehr/cli.py" in names
    assert "scehr/schemas/resources/feature_sets.json" in names
    assert "scehr/schemas/manifest.schema.json" in names
    pages = REPO / "service" / "pages"
    for f in [*(pages / "templates").glob("*.html"), *(pages / "static").iterdir()]:
        assert f"scehr/{f.relative_to(REPO).as_posix()}" in names, f  # the pages under /ui/


def test_the_command_and_the_modules_come_from_the_namespace() -> None:
    import scehr.service.app  # noqa: F401

    assert not any(m.split(".")[0] in FOLDERS for m in sys.modules), \
        "a top-level service/training/schemas module was imported"
    entry = subprocess.run([sys.executable, "-c", "from importlib.metadata import entry_points;"
                            "print(entry_points(group='console_scripts')['scehr'].value)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert entry == "scehr.cli:main"
