"""The manifest JSON Schema is current and other contract majors are refused clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scehr.schemas.contract import CONTRACT_VERSION
from scehr.schemas.manifest import SCHEMA_PATH, ContractError, json_schema, load_manifest


def test_committed_json_schema_is_current() -> None:
    assert json.loads(SCHEMA_PATH.read_text()) == json_schema(), (
        "regenerate with: python -m scehr.schemas.manifest")


def test_other_major_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"contract_version": "99.0"}))
    with pytest.raises(ContractError, match=f"contract {CONTRACT_VERSION}"):
        load_manifest(p)
    p.write_text("{not json")
    with pytest.raises(ContractError, match="cannot read manifest"):
        load_manifest(p)
