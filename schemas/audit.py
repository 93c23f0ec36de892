"""Hashes that trace a served score to its exact model and input without holding any value.

`feature_set_hash` names the feature set's content (its canonical JSON), so two manifests with
the same name but different variables, order or discretization differ. `input_hash` names the
canonical model input of one stay: the discretized tensor before normalization and the raw
demographics, so a long-form and a wide-form payload that mean the same data hash alike, and a
stored payload can later be checked against a score's audit record by re-sending it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII: the same object always gives the same bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def feature_set_hash(feature_set: dict[str, Any]) -> str:
    """The content hash of a manifest's feature set: the `sha256` it records when it has one
    (`FeatureSet.sha256`, in manifests that carry it), else the sha256 of the same canonical
    JSON of its `to_dict()` form, so both give one value for one feature set."""
    recorded = feature_set.get("sha256")
    if isinstance(recorded, str):
        return recorded
    return hashlib.sha256(canonical_json(feature_set)).hexdigest()


def input_hash(feature_set_digest: str, x: np.ndarray, length: int,
               static: np.ndarray | None) -> str:
    """sha256 of one stay's canonical input: feature-set hash, valid hours of the raw
    discretized tensor (float32) and the raw demographics (float32, NaN where missing)."""
    h = hashlib.sha256(feature_set_digest.encode())
    h.update(np.int64(length).tobytes())
    h.update(np.ascontiguousarray(x[:length], dtype=np.float32).tobytes())
    if static is not None:
        h.update(np.ascontiguousarray(static, dtype=np.float32).tobytes())
    return h.hexdigest()
