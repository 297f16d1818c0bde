"""RunDir, the life of a verb's --out folder: check, stage, swap in, clean up (pipelines/rundir.py).

The truth in each test is the file system itself: which folders exist beside --out and what their files hold.
"""
import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertforge.pipelines.rundir import RunDir
from bertforge.errors import BertforgeError
from bertforge.io import owner_tag

REPO = Path(__file__).resolve().parents[1]


def _old_run(path: Path) -> Path:
    """A finished run: recipe.yaml, config.json and one checkpoint."""
    (path / "checkpoints" / "step-2").mkdir(parents=True)
    (path / "recipe.yaml").write_text("train: {lr: 1.0e-3}\n")
    (path / "config.json").write_text('{"model_type": "bert"}')
    return path


def _files(path: Path) -> dict:
    return {str(f.relative_to(path)): f.read_text() for f in sorted(path.rglob("*")) if f.is_file()}


def _siblings(path: Path) -> list:
    """Every entry beside ``path`` whose name starts with ``.NAME.`` (staging and renamed-away dirs)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


@pytest.mark.parametrize("resume", [False, None], ids=["training-verb", "one-shot-verb"])
def test_overwrite_stages_beside_out_and_swaps_in_only_on_success(tmp_path, resume):
    out = _old_run(tmp_path / "run")
    before = _files(out)
    with RunDir(out, overwrite=True, resume=resume) as work:
        assert work.parent == out.resolve().parent and work.name.startswith(".run.staging-")
        (work / "config.json").write_text("new")
        (work / "model.safetensors").write_text("weights")
        assert _files(out) == before  # the old run is whole while the new one is written
    assert _files(out) == {"config.json": "new", "model.safetensors": "weights"}
    assert _siblings(out) == []


@pytest.mark.parametrize("exc", [RuntimeError("a bug"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
@pytest.mark.parametrize("resume", [False, None], ids=["training-verb", "one-shot-verb"])
def test_a_failure_mid_run_keeps_the_old_run_and_removes_the_staging_dir(tmp_path, resume, exc):
    out = _old_run(tmp_path / "run")
    before = _files(out)
    with pytest.raises(type(exc)):
        with RunDir(out, overwrite=True, resume=resume) as work:
            (work / "config.json").write_text("half")
            (work / "checkpoints" / "step-1").mkdir(parents=True)
            raise exc
    assert _files(out) == before
    assert _siblings(out) == []


def test_a_new_out_of_a_one_shot_verb_appears_only_complete(tmp_path):
    out = tmp_path / "models" / "int8"
    with RunDir(out) as work:
        assert work != out and not out.exists()
        (work / "model.onnx").write_text("graph")
    assert _files(out) == {"model.onnx": "graph"}
    with pytest.raises(RuntimeError):
        with RunDir(tmp_path / "failed") as work:
            (work / "model.onnx").write_text("half")
            raise RuntimeError
    assert not (tmp_path / "failed").exists() and _siblings(tmp_path / "failed") == []


def test_a_one_shot_verb_reports_a_failed_write_on_one_line(tmp_path):
    """An OSError while a one-shot verb writes its folder is a BertforgeError naming --out (CLI: exit 2)."""
    out = tmp_path / "q"
    with pytest.raises(BertforgeError, match=rf"disk full while writing {out}; free space"):
        with RunDir(out):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert not out.exists() and _siblings(out) == []


def test_a_training_run_writes_a_new_or_empty_out_in_place_and_resume_reuses_it(tmp_path):
    out = tmp_path / "new"
    with RunDir(out, resume=False) as work:
        assert work == out and out.is_dir()
        _old_run(work)
    with RunDir(out, resume=True) as work:
        assert work == out
        (work / "more.txt").write_text("x")
    assert (out / "more.txt").is_file() and (out / "checkpoints" / "step-2").is_dir()


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_dir_of_other_files_is_refused_and_left_alone(tmp_path, overwrite):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    expected = {(False, False): "is a non-empty directory that holds no run",
                (False, None): "is not empty; pass --overwrite",
                (True, False): "holds files that are not a bertforge run",
                (True, None): "holds files that are not a bertforge run"}
    for resume in (False, None):
        with pytest.raises(BertforgeError, match=expected[overwrite, resume]):
            RunDir(mine, overwrite=overwrite, resume=resume)
    assert _files(mine) == {"notes.txt": "keep"} and _siblings(mine) == []


def test_the_out_rules(tmp_path, monkeypatch):
    run = _old_run(tmp_path / "run")
    model = _old_run(tmp_path / "model")
    cases = [
        (dict(out=run, resume=False), "already holds a run; pass --resume"),
        (dict(out=run, resume=True, overwrite=True), "pass one of them"),
        (dict(out=tmp_path / "fresh", resume=True), "has no checkpoints/"),
        (dict(out=model, inputs=(model,), overwrite=True), "would replace the input"),
        (dict(out=tmp_path, inputs=(model,), overwrite=True), "contains the input"),
        (dict(out=tmp_path, inputs=(model,), overwrite=True, resume=False), "holds files that are not a bertforge"),
        (dict(out=model / "sub", inputs=(model,)), "is inside the input"),
        (dict(out=run / "sub", resume=False), f"is inside {run.resolve()}, which holds a bertforge run"),
    ]
    (tmp_path / "afile").write_text("x")
    cases.append((dict(out=tmp_path / "afile"), "is a file; pass a directory path"))
    for kw, needle in cases:
        with pytest.raises(BertforgeError, match=needle):
            RunDir(kw.pop("out"), **kw)
    monkeypatch.chdir(run)
    with pytest.raises(BertforgeError, match="is the current directory or contains it"):
        RunDir(Path("."), overwrite=True, resume=False)
    assert (run / "checkpoints" / "step-2").is_dir()


_KILLED_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from bertforge.pipelines.rundir import RunDir
    with RunDir(Path(sys.argv[1]), overwrite=True, resume=False) as work:
        (work / "config.json").write_text("half")
        print(work, flush=True)
        time.sleep(600)
""")


def test_the_leftovers_of_a_killed_run_are_removed_by_the_next_one(tmp_path):
    """kill -9 leaves the staging dir behind; the next RunDir on that --out removes it, but not the staging
    dir of a live process nor one of another host."""
    out = _old_run(tmp_path / "run")
    before = _files(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(out)], stdout=subprocess.PIPE, text=True,
                         env=env)
    staged = Path(p.stdout.readline().strip())
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert staged.is_dir() and f"_{p.pid}_" in staged.name and _files(out) == before
    host = owner_tag().split("_")[0]
    live = tmp_path / f".run.staging-{host}_{os.getppid()}_abc"
    other = tmp_path / f".run.staging-otherhost{host}_{p.pid}_abc"
    for d in (live, other):
        d.mkdir()
    RunDir(out, overwrite=True, resume=False)
    assert not staged.exists() and live.is_dir() and other.is_dir()
    assert _files(out) == before
