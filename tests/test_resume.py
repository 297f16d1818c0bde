"""Stay up: SIGKILL at a random step then ``--resume`` ends with the same weights as a run that was never
interrupted; SIGKILL inside a checkpoint write leaves the previous checkpoint loadable; NaN losses stop
the run with the last good checkpoint intact; optimizer/RNG state is never unpickled.

Independent truth: the uninterrupted run of the same command (bit-for-bit equal weights expected).
"""
from __future__ import annotations

import json
import shutil
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import (bertforge_cmd, cli_env, load_weights, make_tiny_checkpoint, read_metrics, run,
                     sentences, write_tsv, REPO)

STEPS = 12


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    ckpt = make_tiny_checkpoint(d / "tiny")
    train = write_tsv(d / "train.tsv", sentences(40, 3))  # 40 // 8 = 5 steps per epoch: resumes cross epochs
    ref = d / "ref"
    r = run(bertforge_cmd(*_args(ckpt, train, ref)))
    assert r.returncode == 0, r.stderr
    return d, ckpt, train, ref


def _args(ckpt, train, out, *extra):
    # dropout stays ON: resume must restore the RNG that draws the dropout masks, not only the data order
    return ["finetune", "--model", ckpt, "--task", "sst2", "--train", train, "--out", out,
            "--max-steps", STEPS, "--batch-size", 8, "--max-seq-len", 32, "--no-progress",
            "train.save_every=1", "train.keep_checkpoints=3", "train.log_every=1", "train.lr=1e-3",
            "train.deterministic=true", *extra]


#: ``bertforge`` whose checkpoint write of step 5 stalls after the model files, before optimizer.pt
_STALL_STEP_5_WRITE = """
import runpy, sys, time
from pathlib import Path
import torch
_save = torch.save
def save(obj, f, *args, **kwargs):
    if Path(str(f)).name == "optimizer.pt" and Path(str(f)).parent.name.startswith(".step-5."):
        time.sleep(120)
    return _save(obj, f, *args, **kwargs)
torch.save = save
runpy.run_module("bertforge", run_name="__main__")
"""


def _popen(args, **env):
    return subprocess.Popen(bertforge_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(**env), cwd=str(REPO))


def _wait_for(pred, proc, timeout=240):
    t0 = time.time()
    while not pred():
        assert proc.poll() is None, "the run ended before the kill: " + proc.stderr.read()[-2000:]
        assert time.time() - t0 < timeout, "timed out waiting"
        time.sleep(0.02)


def _same_weights(a, b):
    wa, wb = load_weights(a), load_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_sigkill_at_random_step_then_resume_gives_identical_weights(setup):
    d, ckpt, train, ref = setup
    k = random.Random(os.getpid()).randint(2, STEPS - 3)
    out = d / f"killed-{k}"
    p = _popen(_args(ckpt, train, out))
    _wait_for(lambda: (out / "checkpoints" / f"step-{k}").is_dir(), p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert not (out / "model.safetensors").exists()  # it really died before the end
    r = run(bertforge_cmd(*_args(ckpt, train, out), "--resume"))
    assert r.returncode == 0, r.stderr
    _same_weights(ref / "model.safetensors", out / "model.safetensors")
    _same_weights(ref / "checkpoints" / f"step-{STEPS}" / "trainer_model.safetensors",
                  out / "checkpoints" / f"step-{STEPS}" / "trainer_model.safetensors")
    # the loss curve is the uninterrupted one: records of the killed run after the checkpoint are dropped
    la = [(m["step"], m["loss"]) for m in read_metrics(ref) if "loss" in m]
    lb = [(m["step"], m["loss"]) for m in read_metrics(out) if "loss" in m]
    assert [s for s, _ in lb] == list(range(1, STEPS + 1))
    assert all(x == pytest.approx(y, rel=1e-6) for x, y in zip(la, lb))
    # rotation kept the last 3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == \
        [f"step-{s}" for s in (STEPS - 2, STEPS - 1, STEPS)]


def test_sigkill_during_checkpoint_write_keeps_previous_checkpoint(setup):
    from bertforge.checkpoint import load_pretrained
    d, ckpt, train, ref = setup
    out = d / "killed-in-write"
    p = subprocess.Popen([sys.executable, "-c", _STALL_STEP_5_WRITE, *map(str, _args(ckpt, train, out))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=str(REPO))
    root = out / "checkpoints"
    # the write of step-5 has begun (model files are in its temporary dir) and is sleeping
    _wait_for(lambda: any((t / "model.safetensors").is_file() for t in root.glob(".step-5.*")), p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (root / "step-5").exists()
    assert any(root.glob(".step-5.*"))  # the torn write is only a hidden temporary
    prev = root / "step-4"
    state = json.loads((prev / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["epoch"] == 0 and state["micro_batch"] == 4
    model = load_pretrained(prev)  # the previous checkpoint loads (HF layout) …
    assert model.config.hidden_size == 32
    for f in ("optimizer.pt", "scheduler.pt", "rng.pt"):  # … and so does its state, without unpickling
        torch.load(prev / f, weights_only=True)
    r = run(bertforge_cmd(*_args(ckpt, train, out), "--resume"))
    assert r.returncode == 0, r.stderr
    assert not any(root.glob(".step-*"))  # the stale temporary was cleaned
    _same_weights(ref / "model.safetensors", out / "model.safetensors")


def test_resume_with_other_batch_size_is_refused(setup):
    d, ckpt, train, ref = setup
    before = {f: f.read_bytes() for f in (ref / "model.safetensors", ref / "metrics.jsonl",
                                          ref / "recipe.yaml")}
    r = run(bertforge_cmd(*_args(ckpt, train, ref), "--resume", "--batch-size", 4))
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    errors = [x for x in lines if x.startswith("bertforge: error:")]
    assert len(errors) == 1 and errors[0] == lines[-1] and "Traceback" not in r.stderr
    assert "written with 8 batch_size but this run has 4" in errors[0]
    assert all(f.read_bytes() == b for f, b in before.items())  # the earlier run is untouched



def test_resume_from_another_model_dir_is_refused_a_moved_copy_is_not(setup, tmp_path):
    """The checkpoint weights win on --resume, but the tokenizer saved with the result comes from --model:
    a dir with other files must be refused; the same files under another path must resume."""
    d, ckpt, train, ref = setup
    other, moved = tmp_path / "other", tmp_path / "moved"
    shutil.copytree(ckpt, other)
    shutil.copytree(ckpt, moved)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["normalizer"] = None  # same architecture and vocabulary, other tokenization
    (other / "tokenizer.json").write_text(json.dumps(tok))
    before = {f: f.read_bytes() for f in (ref / "model.safetensors", ref / "metrics.jsonl", ref / "recipe.yaml")}
    r = run(bertforge_cmd(*_args(other, train, ref), "--resume"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines[-1].startswith("bertforge: error: --resume:") and "Traceback" not in r.stderr
    assert f"started from --model {ckpt.resolve()}" in lines[-1]
    assert all(f.read_bytes() == b for f, b in before.items())
    r = run(bertforge_cmd(*_args(moved, train, ref), "--resume"))
    assert r.returncode == 0, r.stderr
    last = max((ref / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["sources"]["--model"]["path"] == str(ckpt.resolve())  # where the run started, not the copy


def test_resume_with_another_sequence_length_is_refused(setup):
    d, ckpt, train, ref = setup
    before = (ref / "model.safetensors").read_bytes()
    r = run(bertforge_cmd(*_args(ckpt, train, ref), "--resume", "--max-seq-len", 48))
    assert r.returncode == 2, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith("bertforge: error: --resume:") and "data.max_seq_len 32 → 48" in line, line
    assert (ref / "model.safetensors").read_bytes() == before



def test_distill_resume_with_another_teacher_is_refused(setup, tmp_path):
    """The teacher is frozen and not in the checkpoint: resuming with other teacher files would silently
    change the targets mid-run."""
    d, ckpt, train, ref = setup
    teacher, out = tmp_path / "teacher", tmp_path / "dst"
    shutil.copytree(ref, teacher, ignore=shutil.ignore_patterns("checkpoints"))
    args = ["distill", "--teacher", teacher, "--student", "1L-16H-2A-32I", "--method", "kd", "--train", train,
            "--out", out,
            "--max-steps", 2, "--batch-size", 8, "--max-seq-len", 32, "--no-progress", "train.save_every=1"]
    r = run(bertforge_cmd(*args))
    assert r.returncode == 0, r.stderr
    before = (out / "model.safetensors").read_bytes()
    r = run(bertforge_cmd(*[a if a != "kd" else "tinybert" for a in args], "--resume", "--max-steps", 3))
    assert r.returncode == 2, r.stderr  # another method: other losses mid-run
    line = r.stderr.splitlines()[-1]
    assert line.startswith("bertforge: error: --resume:") and "distill.method 'kd' → 'tinybert'" in line, line
    cfg = json.loads((teacher / "config.json").read_text())
    cfg["hidden_dropout_prob"] = 0.3  # another teacher config: the run's checkpoints must not continue with it
    (teacher / "config.json").write_text(json.dumps(cfg))
    r = run(bertforge_cmd(*args, "--resume", "--max-steps", 3))
    assert r.returncode == 2, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith("bertforge: error: --resume:") and "--teacher" in line and "changed since" in line, line
    assert (out / "model.safetensors").read_bytes() == before


# ------------------------------------------------------------------------------------------ in-process
class _Toy(torch.nn.Module):
    """Linear regression whose loss turns NaN from call ``nan_at`` on."""

    def __init__(self, nan_at):
        super().__init__()
        self.lin, self.calls, self.nan_at = torch.nn.Linear(2, 1), 0, nan_at

    def forward(self, x, y):
        self.calls += 1
        loss = ((self.lin(x).squeeze(-1) - y) ** 2).mean()
        if self.calls >= self.nan_at:
            loss = loss * float("nan")
        return type("Out", (), {"loss": loss, "terms": None})()

    def save_pretrained(self, d):
        from safetensors.torch import save_model
        save_model(self, str(d / "model.safetensors"))


def _toy_run(tmp_path, nan_at, max_steps=6):
    from bertforge.config import Recipe
    from bertforge.engine.train.trainer import Trainer
    r = Recipe()
    r.train.batch_size, r.train.max_steps, r.train.save_every, r.train.log_every = 4, max_steps, 2, 1
    r.impl.progress = False
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(2, generator=g), torch.randn((), generator=g)) for _ in range(16)]
    collate = lambda items: {"x": torch.stack([a for a, _ in items]), "y": torch.stack([b for _, b in items])}
    return Trainer(_Toy(nan_at), data, collate, r, tmp_path / "toy")


def test_nan_loss_stops_with_last_good_checkpoint(tmp_path):
    from bertforge.errors import TrainingError
    t = _toy_run(tmp_path, nan_at=5)
    with pytest.raises(TrainingError) as e:
        t.fit()
    msg = str(e.value)
    assert "loss became nan at step 5" in msg and "step-4" in msg and "\n" not in msg
    ck = tmp_path / "toy" / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step-2", "step-4"]
    w = load_weights(ck / "step-4" / "trainer_model.safetensors")
    assert all(torch.isfinite(v).all() for v in w.values())
    assert torch.equal(w["lin.weight"], t.model.lin.weight.detach())  # the NaN step was never applied


def test_disk_full_during_checkpoint_is_a_clear_error(tmp_path, monkeypatch):
    import errno
    from bertforge.errors import BertforgeError
    t = _toy_run(tmp_path, nan_at=10**9, max_steps=4)
    real = torch.save
    calls = {"n": 0}

    def fake_save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] > 3:  # the first checkpoint (3 files) succeeds, the second hits a full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **k)
    monkeypatch.setattr(torch, "save", fake_save)
    with pytest.raises(BertforgeError, match=r"disk full while writing .*step-4; free space"):
        t.fit()
    ck = tmp_path / "toy" / "checkpoints"
    assert [p.name for p in ck.iterdir()] == ["step-2"]  # no torn step-4, nothing hidden left behind
    torch.load(ck / "step-2" / "optimizer.pt", weights_only=True)


def test_resume_refuses_a_pickle_that_runs_code(tmp_path):
    """Optimizer state is read with ``torch.load(weights_only=True)``: a tampered optimizer.pt whose
    pickle would run code is refused with a CheckpointError, and the code never runs."""
    import pickle
    from bertforge.errors import CheckpointError
    t = _toy_run(tmp_path, nan_at=10**9, max_steps=2)
    t.fit()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    torch.save({"state": Evil(), "param_groups": []}, tmp_path / "toy" / "checkpoints" / "step-2" /
               "optimizer.pt", pickle_module=pickle)
    t2 = _toy_run(tmp_path, nan_at=10**9, max_steps=4)
    with pytest.raises(CheckpointError, match="step-2 cannot be loaded"):
        t2.resume()
    assert not marker.exists()


def test_ddp_resume_restores_every_ranks_rng(setup):
    """2 processes, dropout ON: each rank draws its own dropout masks, so resuming bit-identically needs the
    RNG state of every rank (rng.pt holds one per rank). Crash simulated by removing the newest checkpoint."""
    from helpers import torchrun_cmd
    d, ckpt, train, ref = setup
    out = d / "ddp"
    args = ["finetune", "--model", ckpt, "--task", "sst2", "--train", train, "--out", out, "--max-steps", 4,
            "--batch-size", 8, "--max-seq-len", 32, "--no-progress", "train.save_every=2",
            "train.log_every=1", "train.lr=1e-3", "train.deterministic=true"]
    r = run(torchrun_cmd(2, *args))
    assert r.returncode == 0, r.stderr[-3000:]
    rng = torch.load(out / "checkpoints" / "step-2" / "rng.pt", weights_only=True)
    assert rng["world_size"] == 2 and len(rng["ranks"]) == 2
    assert not torch.equal(rng["ranks"][0]["torch"], rng["ranks"][1]["torch"])  # really per-rank states
    final = load_weights(out / "model.safetensors")
    shutil.rmtree(out / "checkpoints" / "step-4")
    (out / "model.safetensors").unlink()
    r = run(torchrun_cmd(2, *args, "--resume"))
    assert r.returncode == 0, r.stderr[-3000:]
    again = load_weights(out / "model.safetensors")
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_resume_with_more_steps_says_the_schedule_is_recomputed(setup, tmp_path):
    """Resuming with a larger --max-steps continues from the checkpoint, and says once that the learning-rate
    schedule now spans the new total (the rate jumps), so it is not one longer run."""
    d, ckpt, train, ref = setup
    out = tmp_path / "more"
    shutil.copytree(ref, out)
    r = run(bertforge_cmd(*_args(ckpt, train, out), "--resume", "--max-steps", STEPS + 3))
    assert r.returncode == 0, r.stderr
    notes = [x for x in r.stderr.splitlines() if "schedule is recomputed" in x]
    assert len(notes) == 1 and f"planned for {STEPS} steps as one of {STEPS + 3}" in notes[0]
    steps = [m["step"] for m in read_metrics(out) if "loss" in m]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS + 3
    r = run(bertforge_cmd(*_args(ckpt, train, out), "--resume", "--max-steps", STEPS + 3))
    assert r.returncode == 0 and "schedule is recomputed" not in r.stderr  # same plan: no note


def test_resume_with_another_lr_continues_the_schedule_from_the_new_peak(setup, tmp_path):
    """A resume with a changed train.lr trains with it (the scheduler state would otherwise keep the old
    peak while recipe.yaml records the new one) and says so. Truth: the same resume without the change —
    the schedule factor per step is the same, so every logged rate is exactly 10× as large."""
    import yaml
    d, ckpt, train, ref = setup
    logged = {}
    for name, lr in (("same", "1e-3"), ("tenfold", "1e-2")):
        out = tmp_path / name
        shutil.copytree(ref, out)
        args = [a for a in _args(ckpt, train, out) if a != "train.lr=1e-3"]  # a key may be given once
        r = run(bertforge_cmd(*args, "--resume", "--max-steps", STEPS + 3, f"train.lr={lr}"))
        assert r.returncode == 0, r.stderr
        notes = [x for x in r.stderr.splitlines() if "with train.lr=" in x]
        assert len(notes) == (1 if name == "tenfold" else 0), r.stderr
        logged[name] = {m["step"]: m["lr"] for m in read_metrics(out) if "lr" in m and m["step"] > STEPS}
        assert yaml.safe_load((out / "recipe.yaml").read_text())["train"]["lr"] == float(lr)
    assert sorted(logged["same"]) == [STEPS + 1, STEPS + 2, STEPS + 3] == sorted(logged["tenfold"])
    assert logged["same"][STEPS + 1] > 0  # linear decay: the last step's rate is 0
    for step, lr in logged["same"].items():
        assert logged["tenfold"][step] == pytest.approx(10 * lr, rel=1e-9, abs=1e-15)


def test_sigterm_during_overwrite_cleans_up_and_keeps_the_old_run(setup):
    """``kill`` (SIGTERM) is handled like Ctrl-C: exit 143, one line, the staging dir of the ``--overwrite``
    run removed, the earlier run byte-for-byte as it was."""
    from helpers import snapshot
    d, ckpt, train, ref = setup
    old = d / "old-term"
    shutil.copytree(ref, old)
    before = snapshot(old)
    p = _popen(_args(ckpt, train, old, "--overwrite", "--max-steps", 100000))
    _wait_for(lambda: any((s / "checkpoints").is_dir() for s in d.glob(".old-term.staging-*")), p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    assert err.strip().splitlines()[-1] == "bertforge: terminated" and "Traceback" not in err, err
    assert not list(d.glob(".old-term.*")), list(d.glob(".old-term.*"))
    assert snapshot(old) == before


def test_staging_dirs_of_killed_runs_are_removed_by_the_next_run(setup, tmp_path):
    """SIGKILL cannot be handled: the next run on that --out removes the staging dirs whose writer (this host,
    pid in the name) is gone, and keeps those of a live process and of another host."""
    from bertforge.io import owner_tag
    d, ckpt, train, ref = setup
    old = tmp_path / "run"
    shutil.copytree(ref, old)
    p = _popen(_args(ckpt, train, old, "--overwrite", "--max-steps", 100000))
    _wait_for(lambda: any((s / "checkpoints").is_dir() for s in tmp_path.glob(".run.staging-*")), p)
    p.kill()
    p.wait()
    killed = list(tmp_path.glob(".run.staging-*"))
    assert len(killed) == 1 and f"_{p.pid}_" in killed[0].name
    host = owner_tag().split("_")[0]
    live = tmp_path / f".run.staging-{host}_{os.getppid()}_abc"  # a running process (pytest's parent)
    other = tmp_path / f".run.staging-otherhost{host}_{p.pid}_abc"  # another machine on a shared disk
    for k in (live, other):
        k.mkdir()
    r = run(bertforge_cmd(*_args(ckpt, train, old, "--overwrite", "--max-steps", 1)))
    assert r.returncode == 0, r.stderr
    assert sorted(tmp_path.glob(".run.*")) == sorted([live, other])


def test_resume_past_the_new_total_is_refused_and_a_constant_schedule_needs_no_note(setup, tmp_path):
    """A checkpoint already beyond --max-steps cannot be continued (exit 2, nothing trained, the run as it
    was); a schedule that does not depend on the total (constant, fixed warm-up) resumes without the note."""
    from helpers import snapshot
    d, ckpt, train, ref = setup
    out = tmp_path / "past"
    shutil.copytree(ref, out)
    before = snapshot(out)
    r = run(bertforge_cmd(*_args(ckpt, train, out), "--resume", "--max-steps", 5))
    assert r.returncode == 2 and f"is at step {STEPS}, past this run's 5 steps" in r.stderr, r.stderr
    assert snapshot(out) == before
    const = tmp_path / "const"
    flags = ("train.schedule=constant", "train.warmup_steps=2")
    r = run(bertforge_cmd(*_args(ckpt, train, const, "--max-steps", 4, *flags)))
    assert r.returncode == 0, r.stderr
    r = run(bertforge_cmd(*_args(ckpt, train, const, "--max-steps", 6, "--resume", *flags)))
    assert r.returncode == 0 and "schedule is recomputed" not in r.stderr, r.stderr
    assert [m["step"] for m in read_metrics(const) if "loss" in m][-1] == 6


def test_load_pretrained_returns_a_model_ready_for_inference(setup):
    """As transformers' from_pretrained: eval mode, so two calls on the same input agree (dropout off)."""
    from bertforge import load_pretrained
    d, ckpt, train, ref = setup
    model = load_pretrained(ref)
    assert not model.training
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids).logits)


def test_resume_ignores_settings_only_one_version_records():
    """A run started before pretrain.max_ngram existed (or whose recipe recorded model.embedding_size for
    an E = H family) still resumes; a recorded value that changed is still named."""
    from bertforge.pipelines.resume_policy import _recipe_changes
    old = {"model": {"hidden_size": 32, "embedding_size": 64}, "pretrain": {"scheme": "token"}}
    assert _recipe_changes(old, {"model": {"hidden_size": 32}, "pretrain": {"scheme": "token", "max_ngram": 3}}) == ""
    assert "pretrain.scheme 'token' → 'ngram'" in _recipe_changes(old, {"model": {"hidden_size": 32},
                                                                         "pretrain": {"scheme": "ngram"}})
