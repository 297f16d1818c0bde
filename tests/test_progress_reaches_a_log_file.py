"""Long work with its stderr in a file (no terminal) says how far it is (issue #49, item 8): `quantize --bits 4`
printed "step 0 of 300" and then nothing for tens of minutes. Without a terminal — or with progress off
(``--no-progress``, ``$BERTFORGE_NO_PROGRESS``, which conftest sets for every test) — the Trainer and the other
long loops write a plain line every ``$BERTFORGE_PROGRESS_EVERY`` seconds with the step out of the total, the
rate and the ETA, and one at the end; a tqdm bar only on a terminal.

Independent truth: the lines are parsed back, their steps must climb by one (the interval is 0 here: a line per
step) up to the total that ``metrics.jsonl`` logged, their ETA must equal (total − step) × the rate they print.
"""
from __future__ import annotations

import io
import re
import sys

import pytest

from helpers import bertforge_cmd, read_metrics, run, sentences, write_tsv

LINE = re.compile(r"^bertforge (?P<name>[\w ]+): (?P<unit>\w+) (?P<n>\d+) of (?P<total>\d+) \((?P<pct>\d+)%\), "
                  r"(?P<rate>[\d.]+) (?P<how>s/\w+|\w+/s), (?P<elapsed>[\dhms.]+) elapsed, "
                  r"(?:ETA (?P<eta>[\dhms.]+)|(?P<end>done|stopped))")


def _seconds(s: str) -> float:
    """``4.2s``, ``42s``, ``4m34s``, ``2h05m`` → seconds."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?", s)
    assert m and s, s
    h, mi, se = m.groups()
    return int(h or 0) * 3600 + int(mi or 0) * 60 + float(se or 0)


def _progress_lines(text: str, name: str = "train") -> list:
    return [m for m in map(LINE.match, text.splitlines()) if m and m["name"] == name]


def _finetune(workspace, tmp_path, monkeypatch, extra: list, every: str = "0") -> str:
    """A 5-step finetune of the tiny model with sys.stderr a real file; returns what the file got."""
    from bertforge.cli import main
    monkeypatch.setenv("BERTFORGE_PROGRESS_EVERY", every)
    log = tmp_path / "stderr.log"
    with open(log, "w", encoding="utf-8") as f:
        assert not f.isatty()
        monkeypatch.setattr(sys, "stderr", f)
        assert main(["finetune", "--model", str(workspace.tiny), "--task", "sst2", "--train", str(workspace.train),
                     "--out", str(tmp_path / "run"), "--max-steps", "5", "--batch-size", "4", "--max-seq-len", "32",
                     *extra]) == 0
        monkeypatch.undo()
    return log.read_text(encoding="utf-8")


@pytest.mark.parametrize("extra", [[], ["--no-progress"]], ids=["progress-on", "no-progress"])
def test_training_writes_progress_lines_with_rate_and_eta_to_a_log(workspace, tmp_path, monkeypatch, extra):
    err = _finetune(workspace, tmp_path, monkeypatch, extra)
    assert "\r" not in err, "a tqdm bar was drawn into a file"
    lines = _progress_lines(err)
    total = max(r["step"] for r in read_metrics(tmp_path / "run"))
    assert total == 5
    periodic, final = lines[:-1], lines[-1]
    assert [int(m["n"]) for m in periodic] == [1, 2, 3, 4], err  # the interval is 0: a line per step, the last
    # step's is the final line
    for m in periodic:
        n = int(m["n"])
        assert m["unit"] == "step" and int(m["total"]) == total and int(m["pct"]) == round(100 * n / total)
        rate = float(m["rate"])
        assert rate > 0
        s_per_step = rate if m["how"] == "s/step" else 1 / rate
        assert m["how"] in ("s/step", "steps/s")
        # the ETA is the steps left at the rate so far (both rounded in print)
        assert _seconds(m["eta"]) == pytest.approx((total - n) * s_per_step, abs=0.1 + 0.02 * (total - n) *
                                                   s_per_step)
        assert _seconds(m["elapsed"]) == pytest.approx(n * s_per_step, rel=0.05, abs=0.1)
    assert int(final["n"]) == total and final["end"] == "done" and final["eta"] is None, err
    assert err.index("bertforge train: step 0 of 5") < err.index(periodic[0].group(0))  # the start line first


def test_a_run_shorter_than_the_interval_adds_no_line(workspace, tmp_path, monkeypatch):
    err = _finetune(workspace, tmp_path, monkeypatch, [], every="3600")
    assert not _progress_lines(err) and "bertforge train: step 0 of 5" in err, err


def test_lowbit_qat_in_a_subprocess_with_stderr_in_a_file(workspace, tmp_path):
    """The issue's own case: ``quantize --bits 4`` (QAT through the Trainer) with stderr in a file."""
    log = tmp_path / "quantize.err"
    texts = tmp_path / "calib.txt"
    texts.write_text("\n".join(s for s, _ in sentences(24, 3)) + "\n", encoding="utf-8")
    r = run(bertforge_cmd("quantize", "--model", workspace.tiny, "--out", tmp_path / "q4", "--bits", "4",
                          "--group-size", "32", "--qat-steps", "3", "--qat-batch-size", "4", "--calib", texts,
                          "--max-seq-len", "32"),
            BERTFORGE_PROGRESS_EVERY="0")
    log.write_text(r.stderr, encoding="utf-8")  # captured through a pipe: no terminal, as a file
    assert r.returncode == 0, r.stderr
    lines = _progress_lines(r.stderr)
    assert [int(m["n"]) for m in lines] == [1, 2, 3], r.stderr
    assert all(m["eta"] for m in lines[:-1]) and lines[-1]["end"] == "done"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_the_bar_and_a_file_the_lines(monkeypatch):
    from bertforge.progress import Progress
    monkeypatch.delenv("BERTFORGE_NO_PROGRESS", raising=False)
    tty, log = _Terminal(), io.StringIO()
    for stream in (tty, log):
        with Progress(3, "work", unit="item", every=0, stream=stream) as p:
            for _ in range(3):
                p.update()
    assert "3/3" in tty.getvalue() and not _progress_lines(tty.getvalue(), "work")
    got = _progress_lines(log.getvalue(), "work")
    assert [int(m["n"]) for m in got] == [1, 2, 3] and got[-1]["end"] == "done"
    # BERTFORGE_NO_PROGRESS (or show=False): lines even on a terminal
    monkeypatch.setenv("BERTFORGE_NO_PROGRESS", "1")
    tty = _Terminal()
    with Progress(2, "work", unit="item", every=0, stream=tty) as p:
        p.update(1)
        p.update(1)
    assert [int(m["n"]) for m in _progress_lines(tty.getvalue(), "work")] == [1, 2]


def test_embedding_shards_report_texts_with_rate_and_eta(workspace, tmp_path, monkeypatch):
    """Another long loop, the same helper: ``embed`` counts texts over its shards."""
    from bertforge.cli import main
    monkeypatch.setenv("BERTFORGE_PROGRESS_EVERY", "0")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(s for s, _ in sentences(40, 5)) + "\n", encoding="utf-8")
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    assert main(["embed", "--model", str(workspace.tiny), "--input", str(corpus), "--out", str(tmp_path / "vecs"),
                 "--shard-size", "20", "--max-seq-len", "32", "--threads", "1"]) == 0
    monkeypatch.undo()
    got = _progress_lines(buf.getvalue(), "embed")
    assert got and all(m["unit"] == "text" and m["total"] == "40" for m in got), buf.getvalue()
    assert int(got[-1]["n"]) == 40 and got[-1]["end"] == "done"


@pytest.mark.parametrize("raw", ["abc", "-1", "nan"])
def test_a_bad_interval_warns_once_and_falls_back(raw, monkeypatch, capsys):
    from bertforge import progress
    monkeypatch.setenv(progress.EVERY_ENV, raw)
    monkeypatch.setattr(progress, "_warned", set())
    assert progress.progress_every() == progress.DEFAULT_EVERY
    assert progress.progress_every() == progress.DEFAULT_EVERY
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and progress.EVERY_ENV in err[0] and repr(raw) in err[0], err
