"""docs/extending.md's "where to add things" table is true: a toy loss, a toy task and a toy
variable are added to a copy of the code by editing only the files the table names for each,
then a model is trained and exported with the loss and the task, and a stay with the variable
is validated and tensorized. A registry the table forgets would make a step fail here.

The copy holds schemas/, training/ and the `scehr` package (what the three rows touch), laid out
as they are installed (`scehr/schemas`, `scehr/training`), and runs in its own Python process
with the copy first on the path, so the edits are really what it imports.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = (REPO / "docs" / "extending.md").read_text()

TOY_LOSS = '''

class ToyBCE(AnchorLoss):
    """BCE on the positive anchor with the margin halved: a loss that exists only in a test."""

    positive_anchor_only = True

    def elementwise(self, u: Tensor, v: Tensor, y: Tensor) -> Tensor:
        return -(y * F.logsigmoid(u / 2) + (1 - y) * F.logsigmoid(-u / 2))

    @staticmethod
    def probability(anchor_logits: Tensor) -> Tensor:
        return torch.sigmoid(anchor_logits[..., 0] / 2)
'''

TOY_TASK = '''
TOY = TaskSpec(
    name="toy",
    description="a toy binary outcome from the first 48 hours (tests only).",
    label_names=("toy_outcome",),
    multi_label=False,
    feature_set="benchmark76-48h",
    window_hours=48.0,
    dynamic_length=False,
    headline_metric="auroc",
    default_operating_point="sensitivity>=0.8",
    data_dir="toy-outcome",
    label_column="y_true",
)
'''

TOY_CONVERTER = '''"""Toy task converter: synthetic 48-hour stays in the toy task's folder."""

import shutil
from pathlib import Path

from scehr.schemas.tasks import task_spec
from scehr.training.data.synthetic import write_synthetic


def convert_toy(out: Path) -> Path:
    write_synthetic(out, "mortality", n_train=160, n_test=60, prevalence=0.3, seed=3)
    shutil.move(out / task_spec("mortality").data_dir, out / task_spec("toy").data_dir)
    return out
'''

TOY_VARIABLE = '''    _lab("toy_marker", "Toy marker", "mg/dL", "1.0", None, aliases=("ToyMarker",),
         plausible=Plausible(0, 100, True)),
'''

RUN = '''
import json, sys
from pathlib import Path
import scehr.schemas, scehr.training
for package in (scehr.schemas, scehr.training):  # the copy's code, not the checkout's
    assert Path(package.__file__).is_relative_to(Path.cwd()), package.__file__
from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.ingest import ingest
from scehr.schemas.manifest import load_manifest
from scehr.schemas.payloads import StayPayload
from scehr.schemas.tensorize import discretize
from scehr.training.config import TrainConfig
from scehr.training.data.toy import convert_toy
from scehr.training.export import export_run
from scehr.training.run import train_run
from scehr import cli as scehr_cli

parser, _ = scehr_cli.build_parser("train")
help_text = parser._subparsers._group_actions[0].choices["train"].format_help()
assert "toy_bce" in help_text and "toy" in help_text, "the CLI derives its choices"

out = Path(sys.argv[1])
data = convert_toy(out / "data")
tiny = {"units": 4, "depth": 1, "bidirectional": False, "dropout": 0.0}
for task, loss in (("toy", "cbce"), ("mortality", "toy_bce")):
    cfg = TrainConfig(task=task, loss=loss, data=str(data if task == "toy" else out / "m"),
                      out=str(out / f"run-{task}"), encoder_hparams=tiny, epochs=1,
                      batch_size=32, threads=1, n_boot=5, plots=False, tsne=False,
                      progress=False)
    if task == "mortality":
        from scehr.training.data.synthetic import write_synthetic
        write_synthetic(out / "m", "mortality", n_train=160, n_test=60, prevalence=0.3, seed=4)
    train_run(cfg, echo=False)
    folder, _ = export_run(out / f"run-{task}", out / "models" / task / "0.1.0")
    m = load_manifest(folder / "manifest.json")
    assert (m.task, m.loss.name) == (task, loss), (m.task, m.loss.name)

fs = FEATURE_SETS["toy-set"]
stay = StayPayload.model_validate({"id": "t", "observations": [
    {"variable": "heart_rate", "time": 1, "value": 80},
    {"variable": "ToyMarker", "time": 2, "value": 3.5, "unit": "mg/dL"}]})
res = ingest([stay], fs)
assert res.ok == [0], res.stays[0].problems
x, _ = discretize(res.observations, fs)
col = fs.variable_ids.index("toy_marker")
assert x.shape[-1] == FEATURE_SETS["benchmark76-48h"].n_features + 2, x.shape
print("extended: ok")
'''


def documented_files(row: str) -> set[str]:
    """The repository paths the table's row `row` names."""
    line = next(t for t in TABLE.splitlines() if t.startswith(f"| {row} |"))
    return set(re.findall(r"[\w/<>-]+(?:\.[\w]+)*\.(?:py|json|md)", line))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: anchor {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def test_a_toy_loss_task_and_variable_need_only_the_documented_files(tmp_path: Path) -> None:
    copy = tmp_path / "code"
    copy.mkdir()
    code = copy / "scehr"  # the installed layout: scehr/schemas, scehr/training
    shutil.copytree(REPO / "scehr", code, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("schemas", "training"):
        shutil.copytree(REPO / name, code / name, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "docs").mkdir()
    for doc in ("method.md", "variables.md"):
        shutil.copy(REPO / "docs" / doc, copy / "docs" / doc)
    def rel(p: Path) -> str:
        """A file's repository path (the package folders without their `scehr/`)."""
        return (p.relative_to(code) if code in p.parents else p.relative_to(copy)).as_posix()

    before = {rel(p): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    touched: dict[str, set[str]] = {}

    # a loss: the class in its family file, its name in the registry, its formula in the docs
    edit(code / "training/losses/classification.py", "\n\nclass CBCE(",
         TOY_LOSS + "\n\nclass CBCE(")
    edit(code / "training/losses/combined.py", '    "bce": BCE,\n',
         '    "bce": BCE,\n    "toy_bce": ToyBCE,\n')
    edit(code / "training/losses/combined.py",
         "from scehr.training.losses.classification import BCE,",
         "from scehr.training.losses.classification import BCE, ToyBCE,")
    with (copy / "docs/method.md").open("a") as f:
        f.write("\n- toy_bce: −[y log σ(uᵀz/2) + (1−y) log σ(−uᵀz/2)]; p = σ(uᵀz/2).\n")
    touched["a loss"] = {"training/losses/classification.py", "training/losses/combined.py",
                         "docs/method.md"}

    # a task: its TaskSpec in the registry, a converter, the regenerated manifest schema
    edit(code / "schemas/tasks.py", "\n#: Every task, by name",
         TOY_TASK + "\n#: Every task, by name")
    edit(code / "schemas/tasks.py", "for t in (MORTALITY, PHENOTYPES, MORTALITY_LANDMARK)}",
         "for t in (MORTALITY, PHENOTYPES, MORTALITY_LANDMARK, TOY)}")
    (code / "training/data/toy.py").write_text(TOY_CONVERTER)
    env = {"PYTHONPATH": str(copy), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "MPLBACKEND": "Agg", "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "scehr.schemas.manifest"], cwd=copy, env=env, check=True)
    touched["a task"] = {"schemas/tasks.py", "training/data/toy.py",
                         "schemas/manifest.schema.json"}

    # a variable: its catalog entry, a new feature set listing it, the regenerated catalog page
    edit(code / "schemas/variables.py", "ICU_VARIABLES: tuple[Variable, ...] = (\n",
         "ICU_VARIABLES: tuple[Variable, ...] = (\n" + TOY_VARIABLE)
    edit(code / "schemas/resources/feature_sets.json", '"feature_sets": {',
         '"feature_sets": {"toy-set": {"version": "1", "description": "benchmark-17 and the toy '
         'marker (tests only).", "variables": ["capillary_refill_rate", "diastolic_bp", "fio2", '
         '"gcs_eye", "gcs_motor", "gcs_total", "gcs_verbal", "glucose", "heart_rate", "height", '
         '"mean_bp", "o2_saturation", "respiratory_rate", "systolic_bp", "temperature", '
         '"weight", "ph", "toy_marker"], "timestep": 1.0, "window_hours": 48.0, '
         '"max_hours": 48.0, "impute": "previous", "start_time": "zero"}, ')
    page = subprocess.run([sys.executable, "-m", "scehr.schemas.variables"], cwd=copy, env=env,
                          check=True, capture_output=True, text=True).stdout
    (copy / "docs/variables.md").write_text(page)
    assert "toy_marker" in page
    touched["a variable"] = {"schemas/variables.py", "schemas/resources/feature_sets.json",
                             "docs/variables.md"}

    after = {rel(p): p.read_bytes() for p in copy.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == set().union(*touched.values()), changed
    for row, files in touched.items():
        named = documented_files(row)
        for f in files:
            assert f in named or any(re.fullmatch(n.replace("<family>", r"\w+").replace(
                "<name>", r"\w+"), f) for n in named) or f.startswith("training/data/"), (
                f"{row}: {f} is not named in docs/extending.md")

    res = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "work")], cwd=copy,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "extended: ok" in res.stdout
    print({row: len(files) for row, files in touched.items()})
