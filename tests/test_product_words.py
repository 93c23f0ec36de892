"""Product files speak of the product: no issue, round or stop numbers, no development branch
names and no absolute paths of one machine in code, tests, docs, the README or configs.

The history of how the work was organised belongs to git and CHANGELOG.md (which is the one
file allowed to cite versions and dates, though it too carries no issue numbers); a reader of a
docstring, a config comment or a doc page should find the product and its users there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Suffixes of the files checked (text the product ships or documents itself with).
TEXT = {".py", ".md", ".toml", ".json", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".tpl", ""}
#: Built artifacts: immutable once shipped (a manifest is never rewritten), and generated.
SKIP_DIRS = ("models/",)

_ISSUE = r"\bissues?\s*#?\s*\d+"
_ROUND = r"\b(?:round|stop)s?\s+#?\d+\b"
_BRANCH = r"\bbranch tip\b|\b(?:main|house|scorer|edges|mimic|deploy|architecture)\s+branch\b"
#: Top-level folders of the development machines: an absolute path into one is a machine remark.
MACHINE_ROOTS = ("work", "root")
_PATH = rf"(?<![\w.}}/])/(?:{'|'.join(MACHINE_ROOTS)})/"  # absolute, not a folder named root
FORBIDDEN = re.compile("|".join([_ISSUE, _ROUND, _BRANCH, _PATH]), re.IGNORECASE)


def product_files() -> list[Path]:
    """Tracked and untracked (not ignored) text files of the repository."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    files = []
    for name in sorted(set(out.splitlines())):
        path = REPO / name
        if name.startswith(SKIP_DIRS) or path.suffix not in TEXT or not path.is_file():
            continue
        files.append(path)
    return files


def offending_lines(text: str) -> list[str]:
    return [line.strip()[:160] for line in text.splitlines() if FORBIDDEN.search(line)]


def test_product_files_carry_no_issue_numbers_branches_or_machine_paths() -> None:
    bad = []
    for path in product_files():
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        bad += [f"{path.relative_to(REPO)}: {line}" for line in offending_lines(text)]
    assert not bad, "say it in words of the product (history goes to CHANGELOG.md):\n" + \
        "\n".join(bad)


def test_the_check_sees_each_kind_of_remark() -> None:
    for line in ["as issue 14 asked", "see Issue #9", "stop 20 serving comparison",
                 "measured in round 3", "at the branch tip 46c54b4", "the house branch's code",
                 *(f"data in /{top}/shared/data" for top in MACHINE_ROOTS)]:
        assert offending_lines(line), line
    for line in ["round(x, 2)", "the timestamp branch of time", "stop the server", "a round trip",
                 "../shared/data", "issues are filed on GitHub",
                 *(f"docs/{top}/plan.md" for top in MACHINE_ROOTS)]:
        assert not offending_lines(line), line
