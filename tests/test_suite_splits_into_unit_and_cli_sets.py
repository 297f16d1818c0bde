"""The suite splits in two sets, each runnable alone: ``pytest -m unit`` (the Python API and the layers below
it) and ``pytest -m cli`` (end to end through the command line); conftest.py marks every test with one."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collected(marker: str) -> set:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


def test_every_test_is_in_exactly_one_set_and_the_sets_match_what_they_run():
    unit, cli = collected("unit"), collected("cli")
    everything = collected("unit or cli or not (unit or cli)")
    assert unit and cli and not unit & cli
    assert unit | cli == everything
    # a verb run in-process is end to end; a model checked against transformers is a unit test
    assert any(t.startswith("tests/test_cli_errors.py::") for t in cli)
    assert not any(t.startswith("tests/test_cli_errors.py::") for t in unit)
    assert any(t.startswith("tests/test_encoder_hf.py::") for t in unit)
