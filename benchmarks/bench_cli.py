"""How fast the command line answers: ``bertforge --help`` and ``bertforge finetune --help``, wall time of a
fresh process, median of N runs (default 5).

Peers in the same run: the bare interpreter (``python -c pass``, the floor), ``python -c "import torch"``
(what every answer cost while the parser was built after importing torch) and, with ``--baseline REV``, the
same two commands from the git revision REV of this repository (extracted with ``git archive`` into a
temporary folder; e.g. the commit before the lazy imports).

    python benchmarks/bench_cli.py [--runs 5] [--baseline 3972076]

Writes benchmarks/results/bench_cli.txt (CPU flags first, then one line per command).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bertforge.hardware import cpu_flags  # a light module: reads /proc/cpuinfo, imports nothing heavy

ROOT = Path(__file__).resolve().parents[1]
TORCH = "python -c 'import torch'"


def wall(cmd: list, src: Path, runs: int) -> tuple:
    """(median, min) wall seconds of ``cmd`` in a fresh process with ``PYTHONPATH=src``; checks it exits 0."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        res = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[-300:]}")
    return statistics.median(times), min(times)


def extract(rev: str, dst: Path) -> Path:
    """``src/`` of git revision ``rev`` under ``dst``."""
    archive = dst / "src.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=f, check=True)
    with tarfile.open(archive) as t:
        t.extractall(dst, filter="data")
    return dst / "src"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", help="git revision whose CLI to time as well (e.g. the commit before this one)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_cli.txt"))
    args = ap.parse_args()
    py = sys.executable
    here = ROOT / "src"
    rows = []
    lines = [f"# bench_cli: wall seconds of a fresh process, median (min) of {args.runs} runs",
             f"# {platform.platform()}; python {platform.python_version()}; {os.cpu_count()} CPUs; "
             f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"# CPU flags: {' '.join(cpu_flags())}"]

    def add(name: str, cmd: list, src: Path):
        med, low = wall(cmd, src, args.runs)
        rows.append((name, med))
        lines.append(f"{name:<48} {med:7.3f} s  ({low:.3f})")
        print(lines[-1], flush=True)

    for ln in lines:
        print(ln)
    add("python -c pass", [py, "-c", "pass"], here)
    add(TORCH, [py, "-c", "import torch"], here)
    add("bertforge --help", [py, "-m", "bertforge", "--help"], here)
    add("bertforge finetune --help", [py, "-m", "bertforge", "finetune", "--help"], here)
    add("bertforge --version", [py, "-m", "bertforge", "--version"], here)
    if args.baseline:
        with tempfile.TemporaryDirectory() as tmp:
            old = extract(args.baseline, Path(tmp))
            add(f"bertforge --help @ {args.baseline}", [py, "-m", "bertforge", "--help"], old)
            add(f"bertforge finetune --help @ {args.baseline}", [py, "-m", "bertforge", "finetune", "--help"], old)
    t = dict(rows)
    ratios = [f"--help / python startup {t['bertforge --help'] / t['python -c pass']:.2f}×",
              f"import torch / --help {t[TORCH] / t['bertforge --help']:.1f}×"]
    if args.baseline:
        for name in ("bertforge --help", "bertforge finetune --help"):
            ratios.append(f"{name} @ {args.baseline} / now {t[f'{name} @ {args.baseline}'] / t[name]:.1f}×")
    lines.append("# ratios: " + "; ".join(ratios))
    print(lines[-1])
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
