"""The one installed namespace: the repository's `service/`, `training/` and `schemas/`
folders are installed as `scehr.service`, `scehr.training` and `scehr.schemas` (with the
`scehr` package and its command), so nothing but `scehr` lands at site-packages' top level.

Packages are found here rather than listed in pyproject.toml: a build from part of the tree
(the service image copies no `training/`) installs what it has.
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
FOLDERS = ("service", "training", "schemas")

setup(
    package_dir={"scehr": "scehr", **{f"scehr.{top}": top for top in FOLDERS}},
    packages=["scehr", *(
        "scehr." + ".".join(init.parent.relative_to(HERE).parts)
        for top in FOLDERS if (HERE / top).is_dir()
        for init in sorted((HERE / top).rglob("__init__.py")))],
)
