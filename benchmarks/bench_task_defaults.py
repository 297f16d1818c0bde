"""Defaults that work (issue 39, item 4): ``bertforge finetune --model minilm --task goemotions`` with no tuning
flag against the same run with the tuned recipe's flags, on the same rows — and the transformers-like defaults
of before (``[CLS]`` pooler, lr 5e-5, no label weighting) for reference.

Runs (each a ``bertforge finetune`` subprocess, niced by the caller, log and JSON under ``--work``):

* ``defaults`` — only the budget flags (rows, epochs, batch, sequence length): the task's ``train_defaults``
  (lr 8e-5, ``pos_weight=sqrt``) and the pooling MiniLM declares (mean) apply;
* ``tuned`` — the docs' flags given explicitly: ``--lr 8e-5 model.pooling=mean train.pos_weight=sqrt``;
* ``old`` — the previous defaults spelt out: ``--lr 5e-5 model.pooling=pooler train.pos_weight=none``.

dev.tsv is split as in ``bench_goemotions.py``: the first ``--tune-rows`` rows are the runs' ``--eval`` (the
per-label thresholds are tuned there), the next ``--heldout-rows`` rows are scored by ``bertforge evaluate``
at the thresholds each dir carries. Goal: defaults ≥ 95% of the tuned macro-F1.

    nice -n 10 python benchmarks/bench_task_defaults.py --runs defaults,tuned,old --parallel

Writes benchmarks/results/task_defaults.txt (command, CPU flags, one line per run, the goal).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bertforge.hardware import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "goemotions"
RUNS = {"defaults": [], "tuned": ["--lr", "8e-5", "model.pooling=mean", "train.pos_weight=sqrt"],
        "old": ["--lr", "5e-5", "model.pooling=pooler", "train.pos_weight=none"]}


def start(args_list: list, log: Path, threads: int) -> tuple:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BERTFORGE_NO_PROGRESS": "1",
           "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    f = open(log, "w")
    f.write(f"$ bertforge {' '.join(args_list)}\n")
    f.flush()
    return subprocess.Popen([sys.executable, "-m", "bertforge", *args_list], env=env, stdout=f,
                            stderr=subprocess.STDOUT, text=True), f, time.perf_counter()


def last_json(log: Path) -> dict:
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="defaults,tuned", help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--train-rows", type=int, default=12000)
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--tune-rows", type=int, default=1500)
    ap.add_argument("--heldout-rows", type=int, default=3926)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--parallel", action="store_true", help="train the runs at the same time")
    ap.add_argument("--work", default="/tmp/bench_task_defaults")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "task_defaults.txt"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = (DATA / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    tune, heldout = work / "dev_tune.tsv", work / "dev_heldout.tsv"
    tune.write_text("".join(rows[:args.tune_rows]), encoding="utf-8")
    heldout.write_text("".join(rows[args.tune_rows:args.tune_rows + args.heldout_rows]), encoding="utf-8")
    names = [r for r in args.runs.split(",") if r]
    procs = {}
    for name in names:
        argv = ["finetune", "--model", "minilm", "--task", "goemotions", "--train", str(DATA / "train.tsv"),
                "--eval", str(tune), "--out", str(work / name), "--overwrite", "--max-train-samples",
                str(args.train_rows), "--epochs", f"{args.epochs:g}", "--batch-size", str(args.batch_size),
                "--max-seq-len", str(args.max_seq_len), f"impl.threads={args.threads}", *RUNS[name]]
        procs[name] = start(argv, work / f"{name}.log", args.threads)
        if not args.parallel:
            procs[name][0].wait()
    res = {}
    for name, (p, f, t0) in procs.items():
        rc = p.wait()
        f.close()
        if rc != 0:
            raise SystemExit(f"{name} exited {rc}; see {work / (name + '.log')}")
        train_s = time.perf_counter() - t0
        ev = work / f"{name}_eval.log"
        q, fe, _ = start(["evaluate", "--model", str(work / name), "--data", str(heldout)], ev, args.threads)
        q.wait()
        fe.close()
        res[name] = {**last_json(ev), "_train_s": round(train_s, 1),
                     "_notes": [ln for ln in (work / f"{name}.log").read_text().splitlines()
                                if ln.startswith("bertforge finetune:")][:2]}
    cmd = "nice -n 10 python benchmarks/bench_task_defaults.py " + " ".join(sys.argv[1:])
    lines = [f"# {cmd}", f"# cpu flags: {' '.join(cpu_flags())}",
             f"# host: 2 cores shared with other sessions; impl.threads={args.threads} per run"
             f"{' (runs trained at the same time)' if args.parallel else ''}",
             f"# data: GoEmotions train.tsv first {args.train_rows} rows, {args.epochs:g} epochs, batch "
             f"{args.batch_size}, max_seq_len {args.max_seq_len}; thresholds tuned on dev.tsv rows 1-{args.tune_rows} "
             f"(--eval); scored on dev.tsv rows {args.tune_rows + 1}-{args.tune_rows + args.heldout_rows} (held out)",
             "", "run       flags                                                     macro_f1  micro_f1  "
                 "constant  train_s"]
    for name in names:
        m = res[name]
        flags = " ".join(RUNS[name]) or "(none: the task's defaults)"
        lines.append(f"{name:<9} {flags:<57} {m.get('macro_f1', float('nan')):.4f}    "
                     f"{m.get('micro_f1', float('nan')):.4f}    {m.get('constant_macro_f1', float('nan')):.4f}    "
                     f"{m['_train_s']}")
    lines.append("")
    for name in names:
        for note in res[name]["_notes"]:
            lines.append(f"  [{name}] {note}")
    if "defaults" in res and "tuned" in res:
        ratio = res["defaults"]["macro_f1"] / res["tuned"]["macro_f1"]
        lines += ["", f"goal: defaults >= 95% of the tuned recipe's held-out macro-F1: {ratio:.1%} -> "
                      f"{'MET' if ratio >= 0.95 else 'NOT MET'}"]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
