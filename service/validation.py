"""Load-time model validation: is this folder a model that can serve, before it is swapped in?

Checks, in order: the manifest (contract major version, schema, internal consistency), the
sha256 of model.onnx, the graph's inputs and outputs against the graph contract, then a
warm-up through the real pipeline that checks shapes, the manifest's anchors against the
graph, and that padding a stay in a batch does not change its result. Every failure is a
`ModelLoadError` naming its rule. `preflight` runs the cheap checks at start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort
from pydantic import ValidationError

from scehr.schemas.contract import GRAPH, LANDMARK_OUTPUTS
from scehr.schemas.manifest import ContractError, Manifest, load_manifest, sha256_file
from scehr.schemas.model_index import ModelIndex
from scehr.schemas.payloads import Observation, StayPayload
from scehr.schemas.tasks import TASK_NAMES, task_spec
from scehr.service.batcher import ModelInputs, ModelOutputs, run_chunked
from scehr.service.load_errors import ModelLoadError
from scehr.service.model import ModelSpec
from scehr.service.model_store import read_index, resolve
from scehr.service.pipeline import prepare
from scehr.service.responses import predictions
from scehr.service.runtime import OrtRuntime

log = logging.getLogger("scehr.registry")


def inspect(folder: Path, task: str) -> tuple[Manifest, str]:
    """Manifest (contract version checked) and the verified sha256 of its ONNX file."""
    try:
        m = load_manifest(folder / "manifest.json")
    except ContractError as e:
        unreadable = isinstance(e.__cause__, (OSError, ValueError))  # not JSON, or no file
        raise ModelLoadError(str(e), rule="manifest_invalid" if unreadable
                             else "contract_version") from e
    except ValidationError as e:
        raise ModelLoadError(f"{folder}/manifest.json does not follow the manifest schema: "
                             f"{e.error_count()} errors, first: {e.errors()[0]['msg']} at "
                             f"{'.'.join(map(str, e.errors()[0]['loc']))}",
                             rule="manifest_invalid") from e
    if m.task != task:
        raise ModelLoadError(f"{folder} is a {m.task} model, not {task}", rule="task_mismatch")
    onnx_path = folder / m.onnx.file
    if not onnx_path.is_file():
        raise ModelLoadError(f"{onnx_path} is missing", rule="onnx_missing")
    sha = sha256_file(onnx_path)
    if sha != m.onnx.sha256:
        raise ModelLoadError(f"sha256 of {onnx_path} is {sha}, the manifest says "
                             f"{m.onnx.sha256}: the file was changed after export",
                             rule="sha256_mismatch")
    c = len(m.label_names)
    u, v = m.anchors.get("u"), m.anchors.get("v")
    if len(m.classes) != c or u is None or v is None or len(u) != c or len(v) != c:
        raise ModelLoadError("manifest label_names, classes and anchors disagree on the number "
                             "of classes", rule="manifest_inconsistent")
    if any(len(row) != m.encoder.out_dim for row in (*u, *v)):
        raise ModelLoadError("anchor length differs from encoder.out_dim",
                             rule="manifest_inconsistent")
    return m, sha


#: The first manifest contract whose exports carry an uncertainty map: a model exported
#: before it serves no interval (and, before 1.3, declares no data minimum either). Such a
#: legacy model is served only where the operator asks for it (`allow_legacy_models`).
LEGACY_BEFORE = (1, 4)
ALLOW_LEGACY_ENV = "SCEHR_ALLOW_LEGACY_MODELS"


def is_legacy(m: Manifest) -> bool:
    """Whether the manifest predates contract LEGACY_BEFORE."""
    major, minor = (int(x) for x in m.contract_version.split(".")[:2])
    return (major, minor) < LEGACY_BEFORE


def refuse_legacy(m: Manifest, allow: bool, reissue: str | None = None) -> None:
    """A ModelLoadError (rule legacy_model) for a legacy manifest unless `allow`; `reissue`
    names a version of the index with the same graph that is not legacy."""
    if allow or not is_legacy(m):
        return
    lacks = "serves no uncertainty interval" + (
        "" if m.data_minimum is not None else " and never abstains (no data minimum)")
    instead = (f"its re-issue {m.task} {reissue} (the same ONNX graph)" if reissue
               else "a version exported under contract "
               f"{'.'.join(map(str, LEGACY_BEFORE))} or later")
    raise ModelLoadError(
        f"{m.task} {m.version} is a legacy model (manifest contract {m.contract_version}, "
        f"before {'.'.join(map(str, LEGACY_BEFORE))}): it {lacks}. Serve {instead}, or set "
        f"{ALLOW_LEGACY_ENV}=true to serve it anyway", rule="legacy_model")


def reissue_in_index(model_dir: Path, index: ModelIndex, m: Manifest) -> str | None:
    """The last version of the index (in its order) with `m`'s ONNX graph that is not legacy."""
    found = None
    for e in index.models:
        if e.task != m.task or e.version == m.version:
            continue
        try:
            other = load_manifest(resolve(model_dir, index, e.task, version=e.version)
                                  / "manifest.json")
        except (ContractError, ValidationError, ModelLoadError):
            continue
        if other.onnx.sha256 == m.onnx.sha256 and not is_legacy(other):
            found = e.version
    return found


def check_graph(sess: ort.InferenceSession, m: Manifest) -> tuple[list[str], int | None]:
    """The graph's input names (checked against the contract) and its fixed length, if any."""
    names = [i.name for i in sess.get_inputs()]
    want = GRAPH.input_names(m.encoder.uses_static)
    if sorted(names) != sorted(want):
        raise ModelLoadError(f"graph inputs {names}, expected {want} (uses_static="
                             f"{m.encoder.uses_static})", rule="graph_inputs")
    outs = [o.name for o in sess.get_outputs()]
    if not set(GRAPH.output_names) <= set(outs):
        raise ModelLoadError(f"graph outputs {outs} lack some of {list(GRAPH.output_names)}",
                             rule="graph_outputs")
    t = next(i for i in sess.get_inputs() if i.name == GRAPH.x.name).shape[1]
    return names, t if isinstance(t, int) else None


def graph_outputs(sess: ort.InferenceSession, m: Manifest) -> tuple[str, ...]:
    """The outputs a run fetches, in `ModelOutputs` order: a landmark task's graph must also
    give its per-step outputs (`LANDMARK_OUTPUTS`), which its trajectory is read from."""
    if not task_spec(m.task).landmarks:
        return GRAPH.output_names
    want = tuple(o.name for o in LANDMARK_OUTPUTS)
    outs = [o.name for o in sess.get_outputs()]
    if not set(want) <= set(outs):
        raise ModelLoadError(f"graph outputs {outs} lack some of {list(want)}, which a "
                             f"{m.task} model gives (a risk per hour)", rule="graph_outputs")
    return (*GRAPH.output_names, *want)


def warmup_stays(spec: ModelSpec) -> list[StayPayload]:
    """Two synthetic stays of normal values and different lengths (no patient data)."""
    stays = []
    for hours in (6, 30):
        obs = []
        for k, var in enumerate(spec.fs.variables):
            value: float | str = var.normal if var.is_categorical else float(var.normal)
            for t in range(1, hours + 1, 3):
                obs.append(Observation(variable=var.id, time=float(t) + k / 100.0, value=value,
                                       unit=None if var.is_categorical else var.unit))
        stays.append(StayPayload(observations=obs))
    return stays


class Runnable(Protocol):
    """What warm-up needs of a loaded model: its spec and one blocking ORT call."""

    spec: ModelSpec

    def run(self, inputs: ModelInputs) -> ModelOutputs: ...


def warm_up(model: Runnable, max_batch_size: int) -> None:
    """Run the real pipeline; check shapes, anchors vs graph and batch-vs-single equality."""
    spec = model.spec
    stays = warmup_stays(spec)
    prep = prepare(spec, stays, occlusion=True)
    if prep.problems or prep.inputs is None:
        raise ModelLoadError("warm-up stays did not validate against the feature set",
                             rule="warmup_failed")
    out = run_chunked(model.run, prep.inputs, max_batch_size)
    n, c, d = prep.inputs.rows, len(spec.assets.labels), spec.manifest.encoder.out_dim
    z_name, al_name, p_name = GRAPH.output_names
    for name, arr, shape in ((z_name, out.z, (n, d)), (al_name, out.anchor_logits, (n, c, 2)),
                             (p_name, out.probability, (n, c))):
        if arr.shape != shape:
            raise ModelLoadError(f"warm-up: {name} has shape {arr.shape}, expected {shape}",
                                 rule="warmup_failed")
        if not np.isfinite(arr).all():
            raise ModelLoadError(f"warm-up: {name} is not finite", rule="warmup_failed")
    if (out.probability < 0).any() or (out.probability > 1).any():
        raise ModelLoadError("warm-up: probability outside [0, 1]", rule="warmup_failed")
    z = out.z.astype(np.float64)
    for k, a in ((0, spec.assets.u), (1, spec.assets.v)):
        if not np.allclose(z @ a.T, out.anchor_logits[..., k], rtol=1e-3, atol=1e-3):
            raise ModelLoadError("the manifest's anchors do not reproduce the graph's "
                                 "anchor_logits: explanations would be wrong",
                                 rule="anchors_mismatch")
    n_ok = len(prep.ok)
    for r in range(n_ok):  # each stay alone must equal its row in the padded batch
        one = ModelInputs(prep.inputs.x[r : r + 1, : int(prep.inputs.lengths[r])],
                          prep.inputs.lengths[r : r + 1],
                          None if prep.inputs.static is None else prep.inputs.static[r : r + 1])
        if spec.fixed_t is not None:
            one.x = prep.inputs.x[r : r + 1]
        single = model.run(one)
        if not np.allclose(single.probability, out.probability[r : r + 1], atol=1e-4):
            raise ModelLoadError("a stay scored alone differs from the same stay in a padded "
                                 "batch: the export is wrong for batch > 1 or variable length",
                                 rule="batch_inconsistent")
    predictions(spec, prep, out)


@dataclass(frozen=True)
class Preflight:
    """What start-up learnt: the provider sessions will get and each task's model folders
    (the one requests get without `?version=` first)."""

    provider: str
    folders: dict[str, list[Path]]
    #: task -> (its default version in index.json, since when it is the default)
    defaults: dict[str, tuple[str | None, datetime | None]] = field(default_factory=dict)


def serving_order(default: str | None, listed: Sequence[str] | None) -> list[str | None]:
    """The versions a task serves, the one requests get without `?version=` first: the
    index's default when listed (or when nothing is listed: None, resolved to it), else the
    first listed."""
    if not listed:
        return [None]
    if default in listed:
        return [default, *(v for v in listed if v != default)]
    return list(listed)


def preflight(model_dir: Path, tasks: list[str], runtime: OrtRuntime,
              versions: Mapping[str, Sequence[str]] | None = None,
              allow_legacy: bool = False) -> Preflight:
    """Fail fast at start: device, index, manifests and checksums of every configured model,
    and no legacy model unless `allow_legacy` (`refuse_legacy`).

    `tasks` empty means every task the index has a default for; `versions` lists the versions
    of the index a task serves instead of its default alone (`serving_order`).
    """
    provider = runtime.probe()
    log.info("execution provider", extra={"device": runtime.device, "provider": provider})
    index = read_index(model_dir)
    tasks = tasks or [t for t in TASK_NAMES if t in index.defaults]
    if not tasks:
        raise ModelLoadError(f"{model_dir}/index.json names no default model",
                             rule="no_default_model", status=500)
    folders, defaults = {}, {}
    for task in tasks:
        folders[task] = []
        for version in serving_order(index.defaults.get(task), (versions or {}).get(task)):
            folder = resolve(model_dir, index, task, version=version)
            m, _ = inspect(folder, task)
            if is_legacy(m) and not allow_legacy:
                refuse_legacy(m, allow_legacy, reissue_in_index(model_dir, index, m))
            folders[task].append(folder)
        defaults[task] = (index.defaults.get(task), index.since(task))
        log.info("default model", extra={"task": task,
                                         "default_version": index.defaults.get(task),
                                         "default_since": index.default_since.get(task)})
    return Preflight(provider, folders, defaults)
