"""The small things a newcomer meets first: what `scehr --help` says, a misspelt variable, a
plain `scehr train`, the Challenge scores explained, one CUDA warning per start."""

from __future__ import annotations

import dataclasses

import pytest

from scehr import cli as scehr_cli
from scehr.schemas.featureset import FEATURE_SETS
from scehr.schemas.ingest import ingest_stay
from scehr.schemas.payloads import StayPayload
from scehr.schemas.variables import lookup


def test_help_describes_the_product_and_points_at_the_guide(capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    assert scehr_cli.main([]) == 2
    out = capsys.readouterr().out
    assert "risk scores for intensive care stays" in out and "FHIR" in out
    assert "docs/hospital.md" in out and "The `scehr` command" not in out


def test_a_misspelt_variable_gets_a_suggestion() -> None:
    stay = StayPayload.model_validate({"id": "s1", "observations": [
        {"time": 1, "variable": "heart_rat", "value": 80},
        {"time": 1, "variable": "zzzz", "value": 1}]})
    messages = [p.message for p in ingest_stay(stay, FEATURE_SETS["benchmark76-48h"]).problems]
    assert messages == ["unknown variable 'heart_rat' (did you mean heart_rate?)",
                        "unknown variable 'zzzz'"]
    with pytest.raises(KeyError, match=r"did you mean glucose\?"):
        lookup("glucos")


def test_train_keys_are_every_config_field_set_by_its_own_option() -> None:
    from scehr.training.cli import _TRAIN_KEYS
    from scehr.training.config import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(_TRAIN_KEYS) == fields - {"encoder_hparams", "regularizers"}
    parser, _ = scehr_cli.build_parser("train")
    args = parser.parse_args(["train", "--data", "d", "--lam", "0.005", "--epochs", "3",
                              "--max-train-stays", "50", "--no-tsne"])
    from scehr.training.config import load_config

    cfg = load_config(None, **{k: getattr(args, k, None) for k in _TRAIN_KEYS})
    assert (cfg.lam, cfg.epochs, cfg.max_train_stays, cfg.tsne) == (0.005, 3, 50, False)


def test_plain_train_says_it_is_not_the_shipped_recipe(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path) -> None:
    from scehr.training.cli import no_recipe_note

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default_mortality_full.toml").write_text("")
    note = no_recipe_note("mortality")
    assert "library defaults" in note and "lam 0.0" in note
    assert "--config configs/default_mortality_full.toml" in note


def test_the_challenge_scores_are_explained() -> None:
    from scehr.training.cli import CHALLENGE_NOTE

    assert "min(sensitivity, positive predictive value)" in CHALLENGE_NOTE
    assert "Hosmer-Lemeshow" in CHALLENGE_NOTE and "lower is better" in CHALLENGE_NOTE


def test_a_worker_knows_cuda_is_unusable_from_the_start_check(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """`scehr serve` warns once in its start-up check and tells its workers, which then
    neither retry CUDA nor warn again."""
    from scehr.service.runtime import CUDA_UNUSABLE_ENV, OrtRuntime

    assert OrtRuntime("auto", 1).cuda_works is None
    monkeypatch.setenv(CUDA_UNUSABLE_ENV, "1")
    worker = OrtRuntime("auto", 1)
    assert worker.cuda_works is False and worker.providers() == ["CPUExecutionProvider"]
    assert OrtRuntime("cuda", 1).cuda_works is None  # device=cuda still tries, and refuses
