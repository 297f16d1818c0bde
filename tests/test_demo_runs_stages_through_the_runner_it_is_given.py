"""``bertforge.pipelines.demo.demo_with`` runs each row of the demo's table through the command runner it is
given (``bertforge demo`` gives it ``bertforge.cli.main``): in the table's order, each command line as the row
renders it; a stage that fails marks the stages that need it skipped, and the report and ``demo.json`` are
written either way.

Independent truth: the command lines the stand-in runner received, against each row's own ``argv()``."""
from __future__ import annotations

import json

from bertforge.cli import _verbs


def test_stages_run_in_order_through_the_runner_and_a_failure_skips_what_needs_it(tmp_path):
    from bertforge.pipelines.demo import BUDGETS, DemoOptions, demo_with, stage_table
    seen = []

    def runner(argv):  # nothing runs; student (a), the teacher's layers copied, fails
        seen.append(argv)
        return 1 if "layers:0,2,5" in argv else 0

    opts = DemoOptions(out=str(tmp_path / "d"), quick=True, skip=["objectives", "serve"], threads=1,
                       no_progress=True)
    r = demo_with(opts, runner, _verbs())
    rows = stage_table(opts, BUDGETS["quick"], tmp_path / "d")
    a = next(i for i, row in enumerate(rows) if row.name == "student-a")
    assert seen[:a + 1] == [row.argv() for row in rows[:a + 1]]  # in order, as rendered, until the failure
    status = {s["name"]: s["status"] for s in r.stages}
    assert status["student-a"] == "failed" and r.failed == ["student-a"]
    for needs_a in ("student-a-pruned", "student-a-onnx", "student-a-int8", "student-b"):  # (b) is (a) at 4 bits
        assert status[needs_a] == "skipped" and all(argv[0] != "export" for argv in seen)
    assert status["student-static"] == "ok"  # needs nothing of (a)
    assert seen[-1][0] == "embed-eval" and status["report"] == "ok"
    assert "stage **student-a** failed" in (tmp_path / "d" / "report.md").read_text()
    assert json.loads((tmp_path / "d" / "demo.json").read_text())["stages"] == r.stages
