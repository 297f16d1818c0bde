"""The demo's serving stage as a row of its table: what it runs, when it is left out, and how a stage whose
verb needs another verb is reported when that one is not in the build. (The stage itself runs in
tests/test_demo.py's quick demo.)"""
import json
from pathlib import Path

from bertforge.cli import _verbs, build_parser, main
from bertforge.pipelines.demo import BUDGETS, Pipeline, Stage, stage_table


def _rows(tmp_path, *extra):
    args = build_parser().parse_args(["demo", "--quick", "--out", str(tmp_path / "d"), *extra])
    return stage_table(args, BUDGETS["quick"], tmp_path / "d")


def test_the_serve_row_serves_the_teacher_and_the_int8_student(tmp_path):
    rows = _rows(tmp_path)
    assert rows[-1].name == "serve"  # the last row: the story ends with deployment
    row = rows[-1]
    D = tmp_path / "d"
    assert row.argv() == ["serve-bench", "--model=teacher=minilm",
                          f"--model=student-a-int8={D / 'onnx' / 'student-a-int8'}",
                          "--requests", str(BUDGETS["quick"]["serve_requests"]),
                          "--concurrency", str(BUDGETS["quick"]["serve_concurrency"]),
                          "--out", str(D / "serve" / "results.json"), "--overwrite"]
    assert row.needs == ("student-a-int8",) and row.requires == ("serve",)
    assert "student-a-int8" in [r.name for r in rows]


def test_the_serve_row_is_skippable_and_leaves_with_compression(tmp_path):
    for skip in (["serve"], ["compress"], ["distill"]):
        names = [r.name for r in _rows(tmp_path, "--skip", *skip)]
        assert "serve" not in names, skip
    assert "student-a-int8" in [r.name for r in _rows(tmp_path, "--skip", "serve")]


def test_a_stage_whose_required_verb_is_absent_is_not_available(tmp_path):
    pl = Pipeline(tmp_path, ["demo"], main, _verbs())
    assert not pl.run(Stage("needs-ghost", "embed-eval", {"--model": "x"}, requires=("no-such-verb",)))
    rec = json.loads((tmp_path / "demo.json").read_text())["stages"][0]
    assert rec["status"] == "skipped"
    assert rec["message"] == "not available: `bertforge no-such-verb` is not in this build"


def test_serve_bench_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    from helpers import cli_error_line
    line = cli_error_line(["serve-bench", "--model", f"x={tmp_path / 'nothing'}", "--requests", "4"], capsys,
                          tmp_path)
    assert "nothing" in line or "not in this build" in line
