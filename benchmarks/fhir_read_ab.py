"""The FHIR route's reading steps before/after a change, interleaved in one process.

    .venv/bin/python benchmarks/fhir_read_ab.py --before main [--passes 15] [--repeats 20]
        [--bundle examples/fhir_bundle.json | --real K]

Loads `service/` and `schemas/` as they were at git revision `--before` (from `git archive`,
into a temporary folder) next to the current ones, and times the steps of `POST /fhir/
predict/mortality` before scoring, on the same body: the raw limit scan (`check_raw`), the
decode with its limits (`_bundle`, the scan included), the lean reading of the Bundle into
the stay (`read_bundle`, with the mortality model's variables), and that reading with the
stay's ingest (`ingest_stay`: validation, units, cleaning; what a revision leaves to ingest
counts there). Each pass runs `--repeats`
requests of each revision, alternating which goes first; the garbage collector is tuned as in
a served worker. Prints, per step, the median over passes of each pass's median thread CPU
time (less sensitive to other jobs than wall time), the after/before ratio, and the load
average (`--real K`: the K-th real set-C stay's Bundle, as in `fhir_stages.py`). Only prints.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fhir_stages import body_of  # noqa: E402

from scehr.service.gc_pauses import tune_collector  # noqa: E402

PACKAGES = ("service", "schemas")


def _ours(name: str) -> bool:
    """A module of the packages compared (`scehr.service...`, `scehr.schemas...`)."""
    parts = name.split(".")
    return len(parts) > 1 and parts[0] == "scehr" and parts[1] in PACKAGES


class _Tree(MetaPathFinder):
    """Imports `scehr.service` and `scehr.schemas` (and what they hold) from the folders of
    another tree, ahead of the installed mapping (an editable install maps the installed
    namespace's packages and their immediate children to this checkout's folders)."""

    def __init__(self, root: Path) -> None:
        self.folders = {f"scehr.{p}": root / p for p in PACKAGES}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in self.folders:
            folder = self.folders[fullname]
            return spec_from_file_location(fullname, folder / "__init__.py",
                                           submodule_search_locations=[str(folder)])
        parent = fullname.rpartition(".")[0]
        if parent in self.folders:
            return PathFinder.find_spec(fullname, [str(self.folders[parent])])
        return None  # deeper modules: their parent's __path__, in the other tree


def load(root: Path | None) -> SimpleNamespace:
    """The reading functions of the tree at `root` (None: the current one), each module
    bound to its own tree's imports."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if _ours(k)} if root else {}
    finder = _Tree(root) if root else None
    if finder:
        sys.meta_path.insert(0, finder)
    try:
        from scehr.schemas.ingest import ingest_stay
        from scehr.service.interop import fhir_in, fhir_limits
        from scehr.service.settings import Settings
        try:  # the FHIR codec; before it, the route read the Bundle
            from scehr.service.interfaces.fhir import read_body
        except ModuleNotFoundError:
            from scehr.service.routes.fhir import _bundle as read_body  # type: ignore[attr-defined]
        assert root is None or Path(fhir_in.__file__).is_relative_to(root), fhir_in.__file__
        return SimpleNamespace(check_raw=fhir_limits.check_raw, limits=fhir_limits.FhirLimits(
            Settings().max_observations), bundle=read_body, read_bundle=fhir_in.read_bundle,
            ingest_stay=ingest_stay)
    finally:
        if finder:
            sys.meta_path.remove(finder)
            for k in [k for k in sys.modules if _ours(k)]:
                del sys.modules[k]
            sys.modules.update(saved)


def checkout(rev: str) -> Path:
    archive = subprocess.run(["git", "archive", rev, *PACKAGES], cwd=REPO, check=True,
                             capture_output=True).stdout
    root = Path(tempfile.mkdtemp(prefix="fhir_read_ab_"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


def steps(code: SimpleNamespace, raw: bytes, fs: Any) -> dict[str, Callable[[], Any]]:
    decoded = code.bundle(raw, code.limits)
    return {
        "check_raw": lambda: code.check_raw(raw, code.limits),
        "_bundle (decode + limits)": lambda: code.bundle(raw, code.limits),
        "read_bundle (lean)": lambda: code.read_bundle(decoded, variables=fs.variables),
        "read_bundle + ingest_stay": lambda: code.ingest_stay(
            code.read_bundle(decoded, variables=fs.variables).payload, fs),
    }


def cpu_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=20, help="requests per step and pass")
    ap.add_argument("--bundle", type=Path, default=REPO / "examples" / "fhir_bundle.json")
    ap.add_argument("--real", type=int, default=0, metavar="K",
                    help="the K-th real set-C stay's Bundle instead of --bundle")
    args = ap.parse_args()
    raw, title = body_of(args.bundle, args.real)
    from scehr.service.registry import load_model, read_index, resolve
    from scehr.service.settings import Settings
    models = REPO / "models"
    model = load_model(resolve(models, read_index(models), "mortality"), "mortality",
                       Settings(model_dir=models, device="cpu"))
    before = load(checkout(args.before))
    after = load(None)
    load_before = os.getloadavg()[0]
    tune_collector()
    sides = {"before": steps(before, raw, model.spec.fs),
             "after": steps(after, raw, model.spec.fs)}
    names = list(sides["after"])
    results: dict[str, dict[str, list[float]]] = {s: {n: [] for n in names} for s in sides}
    for p in range(args.passes):
        for side in (("before", "after") if p % 2 == 0 else ("after", "before")):
            for name in names:
                results[side][name].append(cpu_ms(sides[side][name], args.repeats))
    print(f"{title}: {args.passes} passes x {args.repeats} requests, thread CPU; "
          f"before = {args.before}; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"  {'step':28s} {'before':>9s} {'after':>9s}  after/before")
    for name in names:
        b, a = (statistics.median(results[s][name]) for s in ("before", "after"))
        print(f"  {name:28s} {b:6.3f} ms {a:6.3f} ms  {a / b:5.2f}")


if __name__ == "__main__":
    main()
