"""Everything `prepare` and `predictions` produce for real stays does not move under speed work.

The shipped mortality model `VERSION` on the first 200 real test stays (wide form as sent, the
same stays in long form, every fourth one in reverse order, every tenth one strict): per stay a
sha256 over the prepared model rows, lengths, demographics, notices, problems, data summary,
input hash, observed variables, value bins, occluded channels and observation rows read, and
over the response bytes at `explain=basic` and `top`. Recorded in `golden/prepare_real_stays.json`
(`python -m tests.service.test_svc_prepare_frozen` rewrites it: only for a deliberate change).
The stays are converted from the open PhysioNet 2012 data in the shared data folder (the first
records of each set, in the default model's feature set); skipped when that folder is absent.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import SHARED_DATA, needs_shared_data

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "prepare_real_stays.json"
N_STAYS = 200
VERSION = "1.3.1"


def _long(body: dict[str, Any], reverse: bool) -> dict[str, Any]:
    """The same stay as long-form observations (in column order, or reversed)."""
    w = body["wide"]
    obs = [{"variable": name, "time": w["hours"][r], "value": v,
            **({"unit": w["units"][name]} if name in w["units"] else {})}
           for name, col in w["columns"].items() for r, v in enumerate(col) if v is not None]
    out = {k: v for k, v in body.items() if k != "wide"}
    out["observations"] = obs[::-1] if reverse else obs
    return out


def _h(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.tobytes() if isinstance(p, np.ndarray) else
                 json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"|")
    return h.hexdigest()


def convert(out: Path) -> Path:
    """The first `N_STAYS` records of each PhysioNet 2012 set, converted into `out` in the
    default mortality model's feature set (its test split: the first records of set c)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from payloads import SOURCES, default_feature_set

    from scehr.schemas.featureset import FEATURE_SETS
    from scehr.training.data.physionet2012 import convert_physionet2012

    name = default_feature_set("mortality", REPO / "models")
    convert_physionet2012(SHARED_DATA / "physionet2012", out / SOURCES[name][0],
                          limit=N_STAYS, progress=False, fs=FEATURE_SETS[name])
    return out


def digests(data: Path) -> list[str]:
    """One sha256 per (stay, form) of the stays converted under `data` (`convert`): see the
    module's docstring."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from payloads import real_stays

    from scehr.schemas.payloads import StayPayload
    from scehr.service.pipeline import prepare
    from scehr.service.registry import load_model, read_index, resolve
    from scehr.service.responses import predictions
    from scehr.service.settings import Settings

    models = REPO / "models"
    found = real_stays("mortality", N_STAYS, models, data)
    assert found is not None and len(found[0]) == N_STAYS, "conversion gave no test stays"
    m = load_model(resolve(models, read_index(models), "mortality", version=VERSION), "mortality",
                   Settings(model_dir=models, device="cpu", intra_op_threads=1))
    out = []
    for i, body in enumerate(found[0]):
        for form in (body, _long(body, reverse=i % 4 == 0)):
            stay = StayPayload.model_validate(form)
            parts: list[Any] = []
            for explain in ("basic", "top"):
                p = prepare(m.spec, [stay], strict=i % 10 == 0, occlusion=explain == "top")
                parts += [p.n, p.ok, {k: [x.model_dump() for x in v] for k, v in
                                      p.problems.items()},
                          [[x.model_dump() for x in v] for v in p.notices], p.ids,
                          p.input_sha256, [d.as_dict() for d in p.data],
                          [r() for r in p.rows], [c.tolist() for c in p.occluded]]
                if not p.ok:
                    continue
                assert p.inputs is not None and p.observed is not None
                parts += [p.inputs.x, p.inputs.lengths, p.observed,
                          p.values if p.values is not None else "no values",
                          p.inputs.static if p.inputs.static is not None else "no static"]
                res = predictions(m.spec, p, m.run(p.inputs), explain=explain)
                parts += [r.model_dump_json() for r in res.values()]
            out.append(_h(*parts))
    return out


@needs_shared_data
def test_prepare_and_predictions_of_real_stays_did_not_move(tmp_path: Path) -> None:
    want = json.loads(GOLDEN.read_text())
    got = digests(convert(tmp_path))
    moved = [i for i, (a, b) in enumerate(zip(got, want["digests"], strict=True)) if a != b]
    assert not moved, f"{len(moved)} of {len(got)} stays/forms moved, first: {moved[:10]}"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps({"model": f"mortality {VERSION}",
                                      "digests": digests(convert(Path(tmp)))}, indent=0) + "\n")
