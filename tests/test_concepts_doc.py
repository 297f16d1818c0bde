"""docs/concepts.md names only modules and commands that exist."""
import re
import shlex
from pathlib import Path

from bertforge.cli import _verbs

ROOT = Path(__file__).resolve().parents[1]


def _rows():
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    return [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| concept")]


def test_every_named_module_exists():
    rows = _rows()
    assert len(rows) >= 30
    for row in rows:
        module_cell = row.rstrip(" |").rsplit("|", 1)[-1]
        mods = re.findall(r"`([\w/]+\.py)`", module_cell)
        assert mods, row
        for m in mods:
            assert (ROOT / "src" / "bertforge" / m).is_file(), f"{m} (row: {row[:60]})"


def test_every_named_command_exists():
    verbs = set(_verbs())
    for row in _rows():
        for cmd in re.findall(r"`bertforge ([^`]+)`", row):
            assert shlex.split(cmd)[0] in verbs, cmd
        for cmd in re.findall(r"`([a-z-]+)`,", row.split("|")[3]):
            assert cmd in verbs or cmd.startswith(("train", "model")), cmd
