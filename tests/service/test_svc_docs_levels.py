"""docs/interfaces.md quotes the default models' operating points and levels from their
manifests, and only versions that are served: `python -m tests.service.test_svc_docs_levels`
rewrites the table between its markers."""

from __future__ import annotations

import re
from pathlib import Path

from scehr.schemas.manifest import load_manifest
from scehr.schemas.model_index import read_index

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "interfaces.md"
BEGIN, END = "<!-- levels:begin -->", "<!-- levels:end -->"


def levels_table() -> str:
    """Per default model and class: default point, warning and critical thresholds on the
    risk, validation alert rate, and what is withheld."""
    index = read_index(REPO / "models")
    rows = ["| model | class | default point (risk ≥) | validation alert rate | warning at | "
            "critical at | withheld |", "|---|---|---|---:|---|---|---|"]
    for task, version in sorted(index.defaults.items()):
        m = load_manifest(REPO / "models" / index.entry(task, version).path / "manifest.json")
        for c in m.classes:
            by = {p.name: p for p in c.named_points}
            d = by.get(c.default_operating_point or "")

            def at(name: str | None, by: dict = by) -> str:
                return f"{name} ({by[name].threshold:.3f})" if name in by else "—"

            lv = c.levels
            rows.append(
                f"| {task} {version} | {c.label} | {at(c.default_operating_point)} | "
                f"{'—' if d is None else f'{d.validation.alert_rate:.3f}'} | "
                f"{at(lv.warning if lv else None)} | {at(lv.critical if lv else None)} | "
                f"{', '.join(w.name for w in c.withheld_points) or '—'} |")
    return "\n".join(rows)


def rendered(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{levels_table()}\n{END}{tail}"


def test_the_levels_table_is_generated_from_the_shipped_default_manifests() -> None:
    text = DOC.read_text()
    assert text == rendered(text), ("docs/interfaces.md's levels table is stale: run "
                                    "python -m tests.service.test_svc_docs_levels")


def test_versions_quoted_in_paths_are_shipped_versions_of_their_task() -> None:
    shipped = {(e.task, e.version) for e in read_index(REPO / "models").models}
    quoted = set(re.findall(r"/models/(\w+)/versions/(\d+\.\d+\.\d+)", DOC.read_text()))
    assert quoted and quoted <= shipped, f"docs/interfaces.md names {quoted - shipped}"


def test_no_score_based_cut_offs_are_quoted() -> None:
    assert "score ≥" not in DOC.read_text()


if __name__ == "__main__":
    DOC.write_text(rendered(DOC.read_text()))
