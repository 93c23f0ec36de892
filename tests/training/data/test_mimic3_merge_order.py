"""`merge_in_pandas1_order`: the inner-merge row order of pandas 1.x, which the reference's
`all_diagnoses.csv` and `diagnosis_counts.csv` have. The expected orders are what pandas 1.2.5
(the reference's pin) returns for the same frames; pandas >= 2.2 keeps left's order instead."""

from __future__ import annotations

import pandas as pd

from scehr.training.data.mimic3.subjects import merge_in_pandas1_order

LEFT = pd.DataFrame({"k": ["b", "a", "b", "c", "a"], "j": [1, 1, 2, 1, 1], "row": range(5)})
RIGHT = pd.DataFrame({"k": ["a", "b", "b", "a"], "j": [1, 1, 2, 1], "r": [10, 11, 12, 13]})


def _pairs(df: pd.DataFrame) -> list[list[int]]:
    return df[["row", "r"]].to_numpy().tolist()


def test_one_key_grouped_in_order_of_first_appearance_left_major() -> None:
    assert _pairs(merge_in_pandas1_order(LEFT, RIGHT, ["k"])) == [
        [0, 11], [0, 12], [2, 11], [2, 12], [1, 10], [1, 13], [4, 10], [4, 13]]


def test_two_keys_grouped_by_the_pair() -> None:
    assert _pairs(merge_in_pandas1_order(LEFT, RIGHT, ["k", "j"])) == [
        [0, 11], [1, 10], [1, 13], [4, 10], [4, 13], [2, 12]]
    left = pd.DataFrame({"s": [2, 1, 2, 1, 3], "h": [20, 10, 21, 10, 30], "row": range(5)})
    right = pd.DataFrame({"s": [1, 2, 2], "h": [10, 20, 21], "r": [0, 1, 2]})
    out = merge_in_pandas1_order(left, right, ["s", "h"])
    assert _pairs(out) == [[0, 1], [1, 0], [3, 0], [2, 2]]
    assert list(out.columns) == ["s", "h", "row", "r"] and list(out.index) == [0, 1, 2, 3]
