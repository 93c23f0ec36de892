"""The explanation screen end to end on a tiny exported model: fitted on its training stays'
exact occlusion with the service's code (`scehr.service.screen_fit`), chosen on its validation
stays, shipped by re-issuing the model (same graph), and served: `explain=top` runs exact rows
for the screen's candidates only, with a notice; a screen fitted on another graph is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from scehr.schemas.manifest import load_manifest, sha256_file
from scehr.schemas.payloads import StayPayload
from scehr.service.pipeline import prepare
from scehr.service.registry import load_model
from scehr.service.screen_fit import listed_stays
from scehr.service.screen_fit import main as fit_main
from scehr.service.settings import Settings
from scehr.training.reissue import main as reissue_main


def test_a_fitted_screen_is_shipped_by_reissue_and_served(home_model: Path, tmp_path: Path
                                                          ) -> None:
    data = home_model.parents[2] / "home" / "in-hospital-mortality"
    # a copy of the session's models folder: re-issue adds to its index
    shutil.copytree(home_model.parents[1], tmp_path / "models")
    home_model = tmp_path / "models" / "mortality" / home_model.name
    out = tmp_path / "screen.json"
    # any share: the tiny model's screen is checked for its mechanics, not its fidelity
    assert fit_main([str(home_model), "--data", str(data), "--out", str(out), "--share", "0",
                     "--train-stays", "120", "--val-stays", "40"]) == 0
    doc = json.loads(out.read_text())
    assert doc["candidates"] == 3  # the smallest budget that meets a share of 0
    assert doc["onnx_sha256"] == sha256_file(home_model / "model.onnx")
    assert set(doc["validation"]) == {str(m) for m in range(1, 16)}
    assert all(0.0 <= v <= 1.0 for v in doc["validation"].values())

    new = home_model.parent / "0.1.1"
    assert reissue_main([str(home_model), str(new), "--explanation-screen", str(out)]) == 0
    m = load_manifest(new / "manifest.json")
    assert m.explanation_screen is not None and m.explanation_screen.candidates == 3
    assert (new / "model.onnx").read_bytes() == (home_model / "model.onnx").read_bytes()
    assert "explanation screen" in m.notes[-1]

    model = load_model(new, "mortality", Settings(model_dir=new.parent.parent, device="cpu",
                                                  intra_op_threads=1))
    stays: list[StayPayload] = listed_stays(data, "val_listfile.csv", 10)
    exact = prepare(model.spec, stays, occlusion=True)
    top = prepare(model.spec, stays, occlusion=True, screened=True)
    for e, t, notes in zip(exact.occluded, top.occluded, top.notices, strict=True):
        assert len(t) == min(len(e), 3) and set(t.tolist()) <= set(e.tolist())
        assert any(n.code == "contributions_screened" for n in notes) == (len(e) > 3)

    other = tmp_path / "other.json"
    other.write_text(json.dumps({**doc, "onnx_sha256": "f" * 64}))
    assert reissue_main([str(home_model), str(home_model.parent / "0.1.2"),
                         "--explanation-screen", str(other)]) == 2
    assert not (home_model.parent / "0.1.2").exists()
