"""MobileBERT-shape students by progressive knowledge transfer (Sun et al. 2020 §3.3–3.5) against their peers.

Issue #37's "Must show": from the MiniLM-L6 teacher (``minilm``, 6 × 384, 12 heads) fine-tuned on SST-2 and on
STS-B, a MobileBERT-shape student (inter-block width 384 = the teacher's hidden size, so feature maps match
without a projection) distilled with ``--method mobilebert`` keeps ≥ 98% of the teacher's dev score at ≥ 2×
its CPU speed (batch 1, seq 128, ONNX Runtime FP32, same threads), above a plain-KD student of the same shape
(``--method kd``) and above the 3-layer ``layers:0,2,5`` student at the same speed.

Every step is a ``bertforge`` command (printed and recorded), run under ``nice -n 10`` and cached in
``--cache`` (a step whose output dir holds a ``config.json`` / ``model.onnx`` is not run again, so an
interrupted run resumes where it stopped). Per task:

1. teacher — ``finetune --model minilm`` on ``--rows`` training rows (default: all; SST-2 has 67,349);
2. (optional, ``--general-steps N``) general stage: ``distill --method mobilebert --stage general`` from the
   plain MiniLM on ``--corpus`` (progressive feature-map + attention transfer; MiniLM has no MLM head, so its
   last stage is every layer pair at once), whose student then starts the task stage;
3. students — the progressive one: the general-stage student, then the task by ``distill --method kd``
   (``--task-method kd``, the paper's order) or by ``--method mobilebert`` again (one layer per stage on the task
   data, the rest frozen, KD in the last stage only); ``distill --method kd`` of the same shape from scratch
   (plain KD); ``distill --method kd --student layers:0,2,5``;
4. dev scores (``evaluate``, PyTorch FP32) and latency (``export`` → ``bench --backend onnxruntime
   --batch-size 1 --seq-len 128 --threads T``), interleaved rounds, the median of each model.

Usage: nice -n 10 python benchmarks/bench_mobilebert.py [--tasks sst2,stsb] [--rows N] [--epochs E]
       [--student-epochs E] [--shape SHAPE] [--threads 2] [--cache DIR] [--general-steps N]
Writes benchmarks/results/mobilebert.txt (the exact commands, rows, steps, figures and CPU flags).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTFORGE_DATA", ROOT.parent / "shared" / "data"))
GLUE = {"sst2": DATA / "glue" / "SST-2", "stsb": DATA / "glue" / "STS-B"}
METRIC = {"sst2": "accuracy", "stsb": "pearson"}
#: 6 layers (the teacher's depth: layer l learns from teacher layer l), inter-block 384 = MiniLM's hidden size,
#: bottleneck 96 with the teacher's 12 heads (attention maps head for head), 4 stacked FFNs of 384, 384-wide
#: trigram embeddings (so the teacher's token, position and segment embeddings are copied)
SHAPE = "mobilebert:6L-384H-96B-12A-384I-4F-384E"
LOG: list = []


def run(argv: list, cwd=None) -> dict:
    """``bertforge argv`` under nice; the last JSON line of its stdout (``{}`` when none)."""
    cmd = ["nice", "-n", "10", sys.executable, "-m", "bertforge", *argv]
    shown = " ".join(str(a) for a in argv)
    print(f"$ bertforge {shown}", flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.time() - t0
    if p.returncode:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"bertforge {argv[0]} failed (exit {p.returncode})")
    LOG.append(f"bertforge {shown}   # {wall / 60:.1f} min")
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def done(d: Path) -> bool:
    return (d / "config.json").is_file() or (d / "model.onnx").is_file()


def train_common(args, task: str, rows: int | None = None) -> list:
    rows = ["--max-train-samples", str(rows)] if rows else []
    return ["--task", task, "--train", str(GLUE[task] / "train.tsv"), "--eval", str(GLUE[task] / "dev.tsv"),
            "--batch-size", "32", "--max-seq-len", str(args.max_seq_len), "--no-progress",
            f"impl.threads={args.threads}", f"impl.dtype={args.train_dtype}", *rows]


def teacher(args, task: str) -> Path:
    out = args.cache / f"teacher-{task}"
    if not done(out):
        run(["finetune", "--model", "minilm", "--out", str(out), "--epochs", str(args.epochs), "--lr", "5e-5",
             *train_common(args, task, args.rows)])
    return out


def general_student(args) -> str:
    """The general-stage MobileBERT student (progressive transfer from the plain MiniLM on ``--corpus``), or
    the shape itself when ``--general-steps`` is 0."""
    if not args.general_steps:
        return args.shape
    out = args.cache / "general-mobilebert"
    if not done(out):
        run(["distill", "--teacher", "minilm", "--student", args.shape, "--method", "mobilebert", "--stage",
             "general", "--corpus", str(args.corpus), "--out", str(out), "--max-steps", str(args.general_steps),
             "--batch-size", "32", "--max-seq-len", str(args.max_seq_len), "--lr", "5e-4", "--no-progress",
             f"impl.threads={args.threads}", f"impl.dtype={args.train_dtype}"])
    return str(out)


def student(args, task: str, teacher_dir: Path, name: str, spec: str, method: str) -> Path:
    out = args.cache / f"{task}-{name}"
    if not done(out):
        extra = ["--temperature", "2", "--alpha", "0.5"] if method == "kd" else []
        run(["distill", "--teacher", str(teacher_dir), "--student", spec, "--method", method, "--out", str(out),
             "--epochs", str(args.student_epochs), "--lr", args.student_lr, *extra, *train_common(args, task, args.student_rows or args.rows)])
    return out


def onnx(args, model: Path) -> Path:
    out = model.with_name(model.name + "-onnx")
    if not done(out):
        run(["export", "--model", str(model), "--out", str(out)])
    return out


def score(args, model: Path, task: str) -> float:
    cached = model / "bench_dev.json"
    if not cached.is_file():
        rec = run(["evaluate", "--model", str(model), "--data", str(GLUE[task] / "dev.tsv"), "--max-seq-len",
                   str(args.max_seq_len)])
        cached.write_text(json.dumps(rec))
    value = json.loads(cached.read_text())[METRIC[task]]
    # a regression student that predicts one constant has no Pearson (evaluate writes null): nan, so every
    # comparison with it is NO and the table prints nan
    return float("nan") if value is None else float(value)


def latencies(args, dirs: dict) -> dict:
    """Median p50 latency (ms) of each ONNX dir over ``--rounds`` interleaved rounds."""
    lat = {k: [] for k in dirs}
    info = {}
    for _ in range(args.rounds):
        for k, d in dirs.items():
            rec = run(["bench", "--model", str(d), "--backend", "onnxruntime", "--batch-size", "1", "--seq-len",
                       "128", "--threads", str(args.threads), "--iters", str(args.iters), "--warmup", "5"])
            lat[k].append(rec["latency_ms_p50"])
            info[k] = rec
    return {k: statistics.median(v) for k, v in lat.items()}, info


def untrained(args, spec: str, name: str) -> Path:
    """A freshly built student of ``spec`` from the plain MiniLM with a 2-way classifier (``--speed-only``:
    latency depends on the shape, not on the weights)."""
    out = args.cache / f"untrained-{name}"
    if not done(out):
        sys.path.insert(0, str(ROOT / "src"))
        from bertforge.checkpoint.modeldir import resolve_model_dir
        from bertforge.checkpoint.read import load_pretrained
        from bertforge.distillation.student import build_student
        teacher = load_pretrained("minilm", head="sequence_classification", num_labels=2, notes=False)
        model = teacher if spec == "teacher" else build_student(spec, teacher, head="sequence_classification")
        model.save_pretrained(out, tokenizer_dir=resolve_model_dir("minilm"))
    return out


def speed_only(args, lines: list) -> None:
    """Latency of the teacher and the students' shapes, untrained (no fine-tuning, no distillation)."""
    models = {"teacher (MiniLM-L6)": untrained(args, "teacher", "teacher"),
              f"{args.shape}": untrained(args, args.shape, "mobilebert"),
              "layers:0,2,5": untrained(args, "layers:0,2,5", "layers3")}
    lat, info = latencies(args, {k: onnx(args, d) for k, d in models.items()})
    lines.append(f"\n## speed only (untrained weights; ONNX Runtime FP32, batch 1, seq 128, {args.threads} threads, "
                 f"median of {args.rounds} interleaved rounds × {args.iters} calls)")
    base = lat["teacher (MiniLM-L6)"]
    for k in models:
        rec = info[k]
        lines.append(f"{k:44s} p50 {lat[k]:8.2f} ms   speed-up {base / lat[k]:5.2f}×   {rec.get('parameters', 0) / 1e6:6.2f} M "
                     f"params, {rec.get('gflops_per_seq', 0):.3f} GFLOP/seq, {rec.get('file_mb')} MB")
    rec = next(iter(info.values()))
    lines.append(f"# cpu: {rec.get('cpu')} ({rec.get('cpu_count')} cores), flags: {' '.join(rec.get('cpu_flags', []))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="sst2,stsb")
    ap.add_argument("--rows", type=int, default=None, help="training rows per task (default: all)")
    ap.add_argument("--student-rows", type=int, default=None,
                    help="training rows per task for the students (default: --rows); the first N rows of the "
                         "teacher's training set, so the students see a subset of what the teacher saw")
    ap.add_argument("--epochs", type=float, default=1.0, help="teacher fine-tuning epochs")
    ap.add_argument("--student-epochs", type=float, default=1.0)
    ap.add_argument("--student-lr", default="2e-4")
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--shape", default=SHAPE)
    ap.add_argument("--general-steps", type=int, default=0)
    ap.add_argument("--task-method", choices=("kd", "mobilebert"), default="kd",
                    help="the progressive student's task stage, from the general-stage student: kd (the paper: "
                         "progressive transfer in pre-training distillation, then the task) or mobilebert (the "
                         "layer-by-layer stages again on the task data, KD in the last stage only)")
    ap.add_argument("--corpus", type=Path, default=DATA / "wikitext-2-raw" / "wiki.valid.raw")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-dtype", choices=("float32", "bfloat16", "auto"), default="float32",
                    help="impl.dtype of every finetune/distill call (auto: bf16 autocast where the CPU multiplies "
                         "bf16 natively); dev scores and latency stay FP32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "bertforge" / "bench_mobilebert")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mobilebert.txt")
    ap.add_argument("--speed-only", action="store_true", help="latency of the untrained shapes only")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    lines = [f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: python benchmarks/bench_mobilebert.py "
             + " ".join(sys.argv[1:]),
             f"# rows per task: {args.rows or 'all'} (students: {args.student_rows or args.rows or 'all'}); teacher epochs {args.epochs}; student epochs "
             f"{args.student_epochs}; max_seq_len {args.max_seq_len}; student shape {args.shape}; general steps "
             f"{args.general_steps}; progressive student's task stage --method {args.task_method}; "
             f"train dtype {args.train_dtype}"]
    if args.speed_only:
        speed_only(args, lines)
        lines += ["# commands:"] + [f"#   {c}" for c in LOG]
        args.out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return
    start = general_student(args)
    for task in args.tasks.split(","):
        t = teacher(args, task)
        # the paper's order (§3.5, §4): progressive transfer + pre-training distillation in the general stage,
        # then the task; --task-method mobilebert repeats the layer-by-layer stages on the task data too
        prog = student(args, task, t, "mobilebert-progressive" if args.task_method == "mobilebert"
                       else "mobilebert-general-kd", start, args.task_method)
        models = {"teacher": t,
                  "mobilebert (progressive)": prog,
                  "mobilebert (plain KD)": student(args, task, t, "mobilebert-kd", args.shape, "kd"),
                  "layers:0,2,5 (KD)": student(args, task, t, "layers3", "layers:0,2,5", "kd")}
        scores = {k: score(args, d, task) for k, d in models.items()}
        lat, infos = latencies(args, {k: onnx(args, d) for k, d in models.items()})
        info = infos["teacher"]
        meta = {k: json.loads((d / "metrics.jsonl").read_text().splitlines()[-1]) if (d / "metrics.jsonl").is_file()
                else {} for k, d in models.items()}
        lines.append(f"\n## {task} (dev {METRIC[task]}; latency: ONNX Runtime FP32, batch 1, seq 128, "
                     f"{args.threads} threads, median of {args.rounds} rounds × {args.iters} calls)")
        lines.append(f"{'model':28s} {'dev':>8s} {'kept':>7s} {'p50 ms':>8s} {'speed-up':>9s} {'steps':>6s}")
        for k in models:
            kept = scores[k] / scores["teacher"]
            lines.append(f"{k:28s} {scores[k]:8.4f} {kept:7.1%} {lat[k]:8.2f} {lat['teacher'] / lat[k]:8.2f}× "
                         f"{meta[k].get('step', '')!s:>6s}")
        mb, kd, l3 = "mobilebert (progressive)", "mobilebert (plain KD)", "layers:0,2,5 (KD)"
        checks = [("progressive keeps ≥ 98% of the teacher", scores[mb] >= 0.98 * scores["teacher"]),
                  ("progressive ≥ 2× the teacher's speed", lat["teacher"] / lat[mb] >= 2.0),
                  ("progressive above plain KD of the same shape", scores[mb] > scores[kd]),
                  ("progressive above the 3-layer student", scores[mb] > scores[l3])]
        lines += [f"  {'YES' if ok else 'NO '}  {what}" for what, ok in checks]
    lines.append(f"\n# cpu: {info.get('cpu')} ({info.get('cpu_count')} cores), flags: "
                 f"{' '.join(info.get('cpu_flags', []))}; onnxruntime threads {args.threads}")
    lines.append("# commands (cached steps of earlier runs are not repeated here):")
    lines += [f"#   {c}" for c in LOG]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
