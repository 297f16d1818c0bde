"""Where outputs go: a command never replaces its own input, an earlier run or files it did not write;
``--overwrite`` replaces only a run dir; a failed run leaves a new ``--out`` as it found it; saved files get
the modes the umask gives.

Independent truths: the files' bytes before and after, and the file modes a plain ``open`` would give.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import make_tiny_checkpoint


def _finetune(workspace, out, *extra):
    return ["finetune", "--model", workspace.tiny, "--task", "sst2", "--train", workspace.train, "--out", out,
            "--max-steps", 1, "--batch-size", 8, "--max-seq-len", 32, "--no-progress", *extra]


def test_prune_refuses_its_own_input_and_keeps_it(tmp_path, capsys):
    from bertforge.cli import main
    base = make_tiny_checkpoint(tmp_path / "tiny")
    before = {p.name: p.read_bytes() for p in base.iterdir() if p.is_file()}
    assert main(["prune", "--model", str(base), "--out", str(base), "--fraction", "0.5", "--data",
                 str(tmp_path / "x.txt"), "--overwrite"]) == 2
    assert "would replace the input" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in base.iterdir() if p.is_file()} == before


def test_saved_model_files_get_a_normal_file_mode(tmp_path):
    """safetensors writes 0600; a saved checkpoint's files follow the umask like any other file."""
    import os
    from bertforge.checkpoint import load_pretrained
    old = os.umask(0o022)
    try:
        d = make_tiny_checkpoint(tmp_path / "m")
        load_pretrained(d).save_pretrained(tmp_path / "again")
    finally:
        os.umask(old)
    for f in ("m/model.safetensors", "again/model.safetensors", "again/config.json"):
        assert (tmp_path / f).stat().st_mode & 0o777 == 0o644, f


def test_qa_split_never_replaces_its_input_a_run_or_an_existing_split(tmp_path, data_dir, cli_error):
    from bertforge.cli import main
    squad = data_dir / "squad" / "dev-v1.1.json"
    split = tmp_path / "split"
    assert main(["qa-split", "--data", str(squad), "--out-dir", str(split)]) == 0
    train = split / "train.json"
    articles = len(json.loads(train.read_text())["data"])
    guard = tmp_path / "guard"
    guard.mkdir()
    # again into the same folder: refused without --overwrite; its own input: refused even with it
    line = cli_error(["qa-split", "--data", squad, "--out-dir", split], guard)
    assert "train.json exists" in line and "--overwrite" in line
    line = cli_error(["qa-split", "--data", train, "--out-dir", split, "--overwrite"], guard)
    assert "is the input file" in line
    assert len(json.loads(train.read_text())["data"]) == articles
    run_dir = make_tiny_checkpoint(tmp_path / "run")
    line = cli_error(["qa-split", "--data", train, "--out-dir", run_dir], run_dir)
    assert "holds a bertforge run or model" in line
    line = cli_error(["qa-split", "--data", train, "--out-dir", run_dir / "sub"], run_dir)
    assert "lies inside" in line
    assert main(["qa-split", "--data", str(squad), "--out-dir", str(split), "--overwrite"]) == 0


def test_embedded_corpus_keeps_user_files_and_leaves_nothing_on_error(tmp_path, cli_error):
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "train.txt").write_text("my precious\n")
    line = cli_error(["embedded-corpus", "--out", mine, "--max-documents", 5], mine)
    assert "train.txt exists" in line and "--overwrite" in line
    afile = tmp_path / "afile"
    afile.write_text("hi\n")
    assert "is a file" in cli_error(["embedded-corpus", "--out", afile], mine)
    fresh = tmp_path / "fresh"
    assert "--max-documents -3 must be ≥ 1" in cli_error(
        ["embedded-corpus", "--out", fresh, "--max-documents", -3], mine)
    assert not fresh.exists()


def test_overwrite_never_removes_other_files_or_the_working_directory(workspace, tmp_path, monkeypatch,
                                                                      cli_error):
    """--overwrite replaces only a run dir: a dir of the user's own files, the current directory and one
    containing it are refused, and their files stay."""
    notarun = tmp_path / "notarun"
    notarun.mkdir()
    (notarun / "notes.txt").write_text("mine")
    cli_error([str(a) for a in _finetune(workspace, notarun, "--overwrite")], untouched=workspace.run)
    assert (notarun / "notes.txt").read_text() == "mine"
    work = tmp_path / "cwd"
    (work / "inner").mkdir(parents=True)
    (work / "recipe.yaml").write_text("x")  # looks like a run: the cwd check must still refuse it
    monkeypatch.chdir(work)
    for out in (".", "inner/..", ".."):
        line = cli_error([str(a) for a in _finetune(workspace, Path(out), "--overwrite")], untouched=workspace.run)
        assert "current directory" in line or "not a bertforge run" in line, line
    assert sorted(p.name for p in work.iterdir()) == ["inner", "recipe.yaml"]
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_a_failed_run_leaves_a_new_out_as_it_found_it(tmp_path):
    """RunDir of a training run → failure: a dir the run created is removed, an empty one emptied, one
    holding a saved checkpoint kept for --resume."""
    from bertforge.pipelines.rundir import RunDir

    def fail(out, write):
        with pytest.raises(RuntimeError):
            with RunDir(out, resume=False) as work:
                write(work)
                raise RuntimeError("the run failed")

    new = tmp_path / "new"
    fail(new, lambda work: ((work / "recipe.yaml").write_text("x"), (work / "teacher_cache").mkdir()))
    assert not new.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    fail(empty, lambda work: (work / "recipe.yaml").write_text("x"))
    assert empty.is_dir() and not any(empty.iterdir())
    kept = tmp_path / "kept"
    fail(kept, lambda work: (work / "checkpoints" / "step-1").mkdir(parents=True))
    assert (kept / "checkpoints" / "step-1").is_dir()


def test_atomic_outputs_get_normal_modes(tmp_path):
    """mkstemp/mkdtemp create 0600/0700; the files and dirs they become get the modes the umask gives."""
    import os
    from bertforge.io import atomic_dir, atomic_write_text
    mask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "x").write_text("1")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(mask)


def test_overwrite_replaces_only_a_real_run_or_model(tmp_path, cli_error):
    """A folder holding a ``config.json`` (or an empty ``checkpoints/``) beside the user's own files is not a
    bertforge output: ``--overwrite`` refuses it and every file stays; a model dir (config + weights) is
    replaced."""
    model = make_tiny_checkpoint(tmp_path / "model")
    for marker in ("config.json", "checkpoints"):
        mine = tmp_path / f"mine-{marker}"
        mine.mkdir()
        (mine / "notes.txt").write_text("precious")
        if marker == "config.json":
            (mine / marker).write_text('{"my": "settings"}')
        else:
            (mine / marker).mkdir()
        for argv in (["export", "--model", model, "--out", mine, "--overwrite"],
                     ["prune", "--model", model, "--fraction", "0.5", "--out", mine, "--overwrite"]):
            line = cli_error([str(a) for a in argv], mine)
            assert "not a bertforge run" in line, line
        assert (mine / "notes.txt").read_text() == "precious"
    from bertforge.pipelines.rundir import replaceable_output
    assert replaceable_output(model) and not replaceable_output(tmp_path / "mine-config.json")
