"""The demo's orchestration from Python: :func:`demo_with` (what ``bertforge demo`` runs) — the whole story,
real teacher → corpus → pretraining objectives → distilled students → pruning / INT8 → served → report, as a
table of ordinary ``bertforge`` commands, each with its own run dir under the demo folder.

Every stage is one :class:`Stage` row of :func:`stage_table`: a verb and its arguments, run in this process by
the command runner the caller passes (the verb passes :func:`bertforge.cli.main`; a stage's command line is
recorded in ``demo.json`` and the report, so any stage can be re-run alone). A stage whose verb is not in the
build is marked "not available"; a failing stage is marked failed, and the stages that need it are skipped.
The report (``report.md`` with plots) is built by :mod:`bertforge.pipelines.demo_report`.
"""
from __future__ import annotations

import io
import json
import os
import platform
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..errors import BertforgeError, ConfigError
from ..io import atomic_write_text

#: step/batch budgets: ``full`` fits in 10 minutes on a 2-core CPU, ``quick`` is the CI smoke run.
BUDGETS = {
    "full": {"corpus_docs": None, "pt_steps": 100, "pt_batch": 16, "pt_seq": 64,
             "da_steps": 160, "d_batch": 16, "d_seq": 64,
             "ft_steps": 150, "ft_batch": 32, "td_steps": 150, "prune_samples": 128, "prune_steps": 2,
             "eval_rounds": 5, "eval_iters": 10, "eval_samples": None,
             "serve_requests": 400, "serve_concurrency": 8},
    "quick": {"corpus_docs": 12, "pt_steps": 6, "pt_batch": 4, "pt_seq": 32,
              "da_steps": 4, "d_batch": 4, "d_seq": 32,
              "ft_steps": 6, "ft_batch": 8, "td_steps": 6, "prune_samples": 8, "prune_steps": 1,
              "eval_rounds": 2, "eval_iters": 3, "eval_samples": 64,
              "serve_requests": 16, "serve_concurrency": 4},
}


@dataclass
class DemoOptions:
    """Options of :func:`demo_with` — the flags of ``bertforge demo`` with ``_`` for ``-``, same defaults.
    ``student_layers``: the teacher blocks copied into student (a); ``student_bits``: the bits of student (b),
    (a)'s weights quantized group-wise (2, 3, 4 or 8);
    ``task`` + ``train`` + ``eval``: fine-tune the teacher on your task and task-distill the students; ``skip``:
    parts left out (``objectives``, ``distill``, ``compress``, ``serve``)."""

    out: str = "runs/demo"
    quick: bool = False
    teacher: str = "minilm"
    student_layers: str = "0,2,5"
    student_bits: int = 4
    prune_fraction: float = 0.25
    task: Optional[str] = None
    train: Optional[str] = None
    eval: Optional[str] = None
    max_train_samples: Optional[int] = None
    skip: list = field(default_factory=list)
    threads: Optional[int] = None
    overwrite: bool = False
    no_progress: bool = False


@dataclass
class DemoResult:
    """The demo folder ``out``, the ``report`` text (``out/report.md``), the ``stages`` as recorded in
    ``demo.json`` (name, command, dir, status, seconds, message) and the wall ``seconds`` in all."""

    out: Path
    report: str
    stages: list
    seconds: float

    @property
    def failed(self) -> list:
        """The names of the stages that failed."""
        return [s["name"] for s in self.stages if s["status"] == "failed"]


class _Tee(io.TextIOBase):
    """Write to the real stderr and keep the tail, to quote a stage's error message in the report."""

    def __init__(self, real):
        self.real, self.tail = real, ""

    def write(self, s):
        self.real.write(s)
        self.tail = (self.tail + s)[-4000:]
        return len(s)

    def flush(self):
        self.real.flush()

    def isatty(self):
        return self.real.isatty()

    def fileno(self):
        return self.real.fileno()


@dataclass(frozen=True)
class Stage:
    """One row of the demo's table: a bertforge verb run in-process, with its own run dir under the demo folder.

    ``args`` in command-line order: ``"--flag": value`` (True: the bare flag; None or False: left out; a
    list: ``--flag=item`` for each item) and ``"section.key": value`` recipe overrides (``section.key=value``).
    """
    name: str                   # in demo.json and the report
    verb: str                   # the bertforge verb
    args: dict
    needs: tuple = ()           # stages that must have succeeded first
    evaluated: Optional[Path] = None  # the model it adds to the results table (None: none)
    mode: str = "both"          # "embedded" (the default story), "task" (with --task) or both
    part: Optional[str] = None  # the --skip part it belongs to
    dir: Optional[Path] = None  # the folder it writes, when not its --out
    requires: tuple = ()        # other verbs it runs (not available without them)

    def argv(self) -> list:
        """The stage as a ``bertforge`` command line (without the program name)."""
        out = [self.verb]
        for key, value in self.args.items():
            if value is None or value is False:
                continue
            if not key.startswith("--"):
                out.append(f"{key}={value}")
            elif value is True:
                out.append(key)
            elif isinstance(value, list):
                out += [f"{key}={v}" for v in value]
            else:
                out += [key, str(value)]
        return out


class Pipeline:
    """Runs :class:`Stage` rows in-process and records them in demo.json.

    Args:
        out: the demo folder.
        argv: the demo's own command line (for the report).
        run_verb: the command runner, ``run_verb(argv) -> exit status`` (``bertforge.cli.main``).
        verbs: the verbs in this build (a stage naming another is "not available").
    """

    def __init__(self, out: Path, argv: list, run_verb: Callable[[list], int], verbs):
        self.out, self.verbs, self.run_verb = out, set(verbs), run_verb
        self.stages: list = []
        self.by_name: dict = {}
        self.demo_argv = argv

    def ok(self, name: str) -> bool:
        s = self.by_name.get(name)
        return bool(s and s["status"] == "ok")

    def run(self, stage: Stage) -> bool:
        """Run one row (skipped when its verb is not in this build or a stage it needs did not succeed);
        True when it exited 0. A stage's failure, even a bug, is recorded and does not stop the demo."""
        argv = stage.argv()
        name, needs = stage.name, stage.needs
        out_dir = stage.dir or stage.args.get("--out")
        rec = {"name": name, "command": "bertforge " + shlex.join(argv), "dir": str(out_dir) if out_dir else None,
               "status": "ok", "seconds": None, "message": ""}
        self.stages.append(rec)
        self.by_name[name] = rec
        missing = [n for n in needs if not self.ok(n)]
        verb = argv[0]
        n = len(self.stages)
        absent = [v for v in (verb, *stage.requires) if v not in self.verbs]
        if absent:
            rec.update(status="skipped", message=f"not available: `bertforge {absent[0]}` is not in this build")
        elif missing:
            rec.update(status="skipped", message=f"needs stage {missing[0]} ({self.by_name[missing[0]]['status']})"
                       if missing[0] in self.by_name else f"needs stage {missing[0]}")
        if rec["status"] != "ok":
            print(f"\n[demo {n}] {name}: {rec['status']} — {rec['message']}", file=sys.stderr, flush=True)
            self.save()
            return False
        print(f"\n[demo {n}] {name}: {rec['command']}", file=sys.stderr, flush=True)
        tee = _Tee(sys.stderr)
        old, sys.stderr = sys.stderr, tee
        t0 = time.perf_counter()
        try:
            rc = self.run_verb(argv)
        except SystemExit as e:  # argparse usage error inside the verb
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # a bug in a stage must not stop the rest of the demo
            traceback.print_exc()
            rc = 1
            rec["message"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            sys.stderr = old
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        if rc != 0:
            rec["status"] = "failed"
            if not rec["message"]:
                errs = [ln for ln in tee.tail.splitlines() if "error" in ln.lower()]
                rec["message"] = (errs[-1] if errs else f"exit status {rc}")[:300]
        self.save()
        return rc == 0

    def record(self, name: str, status: str, seconds: float, message: str = "", command: str = "") -> None:
        rec = {"name": name, "command": command or "bertforge " + shlex.join(self.demo_argv), "dir": None,
               "status": status, "seconds": round(seconds, 1), "message": message}
        self.stages.append(rec)
        self.by_name[name] = rec
        self.save()

    def save(self) -> None:
        atomic_write_text(self.out / "demo.json", json.dumps({"argv": self.demo_argv, "stages": self.stages},
                                                             indent=2))


def _set_threads(requested) -> int:
    """PyTorch intra-op threads for the whole demo (stages run in this process): ``requested``, else
    every CPU — unless the 1-minute load average already reaches the CPU count, then 1 (OpenMP threads
    that spin against other processes make a forward pass an order of magnitude slower)."""
    import torch
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"--threads {requested} must be ≥ 1")
        n = requested
    else:
        cpus = os.cpu_count() or 1
        try:
            busy = os.getloadavg()[0] >= cpus
        except OSError:
            busy = False
        n = 1 if busy else cpus
    torch.set_num_threads(n)
    return n


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise BertforgeError(f"--out {out} is a file; pass a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "demo.json").exists() and not overwrite:
        raise BertforgeError(f"--out {out} holds something that is not a demo; pass another --out or "
                             f"--overwrite")
    out.mkdir(parents=True, exist_ok=True)


def stage_table(args, b: dict, D: Path) -> list:  # noqa: N803  (D: the demo folder)
    """The demo's stages, one :class:`Stage` row each, in the order they run; the rows of the other mode
    and of the ``--skip`` parts are left out. ``b``: the budgets (:data:`BUDGETS`)."""
    from ..objectives.pretrain import OBJECTIVES  # the pretraining objectives, each run once
    task = args.task
    teacher, teacher_dir = args.teacher, str(D / "teacher") if task else args.teacher
    corpus, train_txt = D / "corpus", str(D / "corpus" / "train.txt")
    layers = f"layers:{args.student_layers}"
    run = {"--overwrite": True, "--no-progress": args.no_progress}  # every training verb
    sample = {"--max-train-samples": args.max_train_samples or None, "data.max_eval_samples": b["eval_samples"]}
    general = {"--max-seq-len": b["d_seq"], "--batch-size": b["d_batch"], **run, "train.log_every": 5}
    labelled = {"--task": task, "--train": args.train, "--eval": args.eval, "--max-steps": b["td_steps"],
                "--max-seq-len": 128, "--batch-size": b["ft_batch"], **run, **sample}
    onnx = D / "onnx"
    rows = [
        # 1 corpus; teacher (task mode: fine-tuned on the user's task)
        Stage("corpus", "embedded-corpus", {"--out": corpus, "--overwrite": True,
                                            "--max-documents": b["corpus_docs"]}),
        Stage("teacher", "finetune", {"--model": teacher, "--task": task, "--train": args.train, "--eval": args.eval,
                                      "--out": D / "teacher", "--max-steps": b["ft_steps"],
                                      "--batch-size": b["ft_batch"], "--max-seq-len": 128, **run, **sample},
              mode="task"),
        # 2 the pretraining objectives at a glance (embedded corpus, same shape and token budget)
        *[Stage(f"pretrain-{obj}", "pretrain",
                {"--objective": obj, "--corpus": train_txt, "--out": D / "pretrain" / obj,
                 "--max-steps": b["pt_steps"], "--batch-size": b["pt_batch"], "--max-seq-len": b["pt_seq"],
                 "--size": "tiny", "--doc-sep": "blank", "--seed": 0, **run,
                 "train.log_every": max(1, b["pt_steps"] // 25), "train.eval_every": b["pt_steps"]},
                needs=("corpus",), mode="embedded", part="objectives") for obj in OBJECTIVES],
        # 3 distillation: (a) the teacher's layers copied (its pooled vectors regressed on the teacher's)
        Stage("student-a", "distill", {"--stage": "general", "--teacher": teacher, "--student": layers,
                                       "--method": "embedding_mse", "--corpus": train_txt, "--out": D / "student-a",
                                       "--max-steps": b["da_steps"], **general},
              needs=("corpus",), evaluated=D / "student-a", mode="embedded", part="distill"),
        # EMBEDDING STUDENTS: every Stage with evaluated=<dir> is a row of the embedding-quality table (held-out
        # teacher agreement + retrieval, then Lee ρ); add further students here.
        # The static student: the teacher's vocabulary → one 256-d table (no training; docs/search.md)
        Stage("student-static", "distill", {"--method": "static", "--teacher": teacher, "--dim": 256,
                                            "--out": D / "student-static", "--overwrite": True,
                                            "--no-progress": args.no_progress},
              evaluated=D / "student-static", mode="embedded", part="distill"),
        Stage("student-a", "distill", {"--stage": "task", "--teacher": teacher_dir, "--student": layers,
                                       "--method": "kd", "--out": D / "student-a", **labelled},
              needs=("teacher",), evaluated=D / "student-a", mode="task", part="distill"),
        # 4 compression: head pruning of (a); ONNX FP32 export of (a); INT8 (ONNX Runtime) of the students
        Stage("student-a-pruned", "prune", {"--model": D / "student-a",
                                            "--data": args.eval if task else corpus / "heldout.txt",
                                            "--eval": args.eval if task else None,
                                            "--max-eval-samples": b["eval_samples"] if task else None,
                                            "--fraction": args.prune_fraction, "--steps": b["prune_steps"],
                                            "--max-samples": b["prune_samples"], "--max-seq-len": 128,
                                            "--out": D / "student-a-pruned", "--overwrite": True},
              needs=("student-a",), evaluated=D / "student-a-pruned", part="compress"),
        Stage("student-a-onnx", "export", {"--model": D / "student-a", "--out": onnx / "student-a",
                                           "--overwrite": True},
              needs=("student-a",), evaluated=onnx / "student-a" / "model.onnx", part="compress"),
        *[Stage(f"{src}-int8", "quantize", {"--model": D / src, "--out": onnx / f"{src}-int8", "--overwrite": True},
                needs=(src,), evaluated=onnx / f"{src}-int8" / "model.onnx", part="compress")
          for src in ("student-a", "student-a-pruned")],
        # student (b): (a)'s weights at 4 bits, group-wise (Q-BERT's grids; docs/compress.md) — the smallest model
        # this pipeline makes in the demo's budget (a fresh small shape keeps little after so few steps)
        Stage("student-b", "quantize", {"--model": D / "student-a", "--bits": args.student_bits, "--qat-steps": 0,
                                        "--out": onnx / "student-b", "--overwrite": True},
              needs=("student-a",), evaluated=onnx / "student-b" / "model.onnx", part="compress"),
        # 5 deployment: the INT8 student beside the teacher, both served by `bertforge serve` on loopback
        Stage("serve", "serve-bench", {"--model": [f"teacher={teacher}", f"student-a-int8={onnx / 'student-a-int8'}"],
                                       "--requests": b["serve_requests"], "--concurrency": b["serve_concurrency"],
                                       "--threads": args.threads, "--out": D / "serve" / "results.json",
                                       "--overwrite": True},
              needs=("student-a-int8",), mode="embedded", part="serve", requires=("serve",), dir=D / "serve"),
    ]
    skipped = set(args.skip) | ({"compress"} if "distill" in args.skip else set())  # compression needs (a), (b)
    skipped |= {"serve"} if "compress" in skipped else set()  # serving needs the INT8 student
    return [s for s in rows if s.mode in ("both", "task" if task else "embedded") and s.part not in skipped]


def evaluate_stage(args, b: dict, D: Path, pl: Pipeline, rows: list, threads: int) -> Stage:  # noqa: N803
    """The last row: ``embed-eval`` of the teacher and of every model an earlier stage made."""
    models = [("teacher", str(D / "teacher") if args.task else args.teacher)]
    models += [(s.name, str(s.evaluated)) for s in rows if s.evaluated and pl.ok(s.name) and s.evaluated.exists()]
    task = args.task
    return Stage("evaluate", "embed-eval",
                 {"--model": [f"{n}={p}" for n, p in models], "--rounds": b["eval_rounds"],
                  "--iters": b["eval_iters"], "--threads": threads, "--out": D / "eval" / "results.json",
                  "--overwrite": True,  # the demo owns its eval dir (a re-run replaces its results)
                  "--task": task, "--data": args.eval if task else None,
                  "--max-eval-samples": b["eval_samples"] if task else None, "--no-progress": args.no_progress,
                  # the embedding-quality headline: agreement with the teacher on held-out documents
                  "--heldout": None if task else D / "corpus" / "heldout.txt",
                  "--reference": None if task else "teacher"},
                 needs=("teacher",) if task else (), dir=D / "eval")


def demo_with(opts: DemoOptions, run_verb: Callable[[list], int], verbs) -> DemoResult:
    """Run the demo of ``opts`` into ``opts.out``: every stage of :func:`stage_table`, then ``embed-eval`` of
    every model made, then ``report.md``; ``run_verb(argv) -> exit status`` runs one ``bertforge`` command in
    this process (``bertforge.cli.main``), ``verbs`` names those in this build.

    Raises:
        ConfigError: ``task`` without ``train`` or ``eval``, a ``prune_fraction`` outside (0, 1), ``threads``
            below 1; BertforgeError: an ``out`` that is a file or a folder that is not a demo's (without
            ``overwrite``). A failing stage raises nothing: it is recorded (see :attr:`DemoResult.failed`)."""
    t_start = time.perf_counter()
    args = opts
    out = Path(args.out)
    if bool(args.task) != bool(args.train):
        raise ConfigError("--task and --train go together (and --eval for a metric); pass all or none")
    if args.task and not args.eval:
        raise ConfigError("--task needs --eval FILE to score the models on")
    if not 0.0 < args.prune_fraction < 1.0:
        raise ConfigError(f"--prune-fraction {args.prune_fraction} must be in (0, 1)")
    _prepare_out(out, args.overwrite)
    threads = _set_threads(args.threads)
    b = BUDGETS["quick" if args.quick else "full"]
    pl = Pipeline(out, _demo_argv(args), run_verb, verbs)
    rows = stage_table(args, b, out)
    for stage in rows:
        if stage.dir is not None:
            stage.dir.mkdir(parents=True, exist_ok=True)
        pl.run(stage)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    from .bundle_check import demo_stage
    demo_stage(pl, out, threads)  # the INT8 student as a torch-free bundle (docs/bundle.md)
    pl.run(evaluate_stage(args, b, out, pl, rows, threads))

    t0 = time.perf_counter()
    txt = _report(pl, out, args, b, time.perf_counter() - t_start)
    pl.record("report", "ok", time.perf_counter() - t0, command="(written by bertforge demo)")
    return DemoResult(out, txt, pl.stages, time.perf_counter() - t_start)


def _demo_argv(args) -> list:
    """This demo's own command line, with only the options that differ from the defaults (for the report)."""
    argv = ["demo", "--out", str(Path(args.out))] + (["--quick"] if args.quick else [])
    if args.task:
        argv += ["--task", args.task, "--train", args.train, "--eval", args.eval]
    for flag, val, default in [("--teacher", args.teacher, "minilm"),
                               ("--student-layers", args.student_layers, "0,2,5"),
                               ("--student-bits", args.student_bits, 4),
                               ("--prune-fraction", args.prune_fraction, 0.25),
                               ("--max-train-samples", args.max_train_samples, None),
                               ("--threads", args.threads, None)]:
        if val != default:
            argv += [flag, str(val)]
    if args.skip:
        argv += ["--skip", *args.skip]
    return argv


def _report(pl: Pipeline, D: Path, args, b: dict, elapsed: float) -> str:  # noqa: N803
    import torch

    from ..objectives.pretrain import OBJECTIVES
    from . import demo_report as rp
    rows = []
    res = D / "eval" / "results.json"
    if pl.ok("evaluate") and res.is_file():
        rows = json.loads(res.read_text())["models"]
    quality_key, quality_label = "lee_spearman", "Lee Spearman ρ (mean-pooled cosine vs human)"
    if any(r.get("heldout_ndcg@10") is not None for r in rows):
        quality_key, quality_label = "heldout_ndcg@10", "held-out retrieval NDCG@10 (passage → its sentence)"
    if args.task:
        for r in rows:
            tm = r.get("task_metrics") or {}
            r["task_score"] = next(iter(tm.values())) if tm else None
        quality_key, quality_label = "task_score", f"{args.task} dev metric (fraction)"
    curves, objective_rows = {}, []
    for obj in OBJECTIVES:
        d = D / "pretrain" / obj
        if pl.ok(f"pretrain-{obj}"):
            steps, losses = rp.read_loss_curve(d / "metrics.jsonl")
            curves[obj] = (steps, losses)
            if losses:
                objective_rows.append({"objective": obj, "steps": steps[-1], "first": losses[0], "last": losses[-1],
                                       "ratio": losses[-1] / losses[0], "dir": str(d)})
        elif f"pretrain-{obj}" in pl.by_name:
            s = pl.by_name[f"pretrain-{obj}"]
            objective_rows.append({"objective": obj, "steps": None, "first": None, "last": None, "ratio": None,
                                   "dir": f"{s['status']}: {s['message']}"})
    loss_png = "loss_curves.png" if rp.plot_loss_curves(curves, D / "loss_curves.png") else None
    q_png = "quality_vs_latency.png" if rp.plot_quality_vs_latency(rows, D / "quality_vs_latency.png",
                                                                   quality_key, quality_label) else None
    claims = (rp.checks(rows, key="task_score", label=f"{args.task} metric") if args.task else
              rp.checks(rows, key=quality_key, label=rp.QUALITY_LABELS.get(quality_key, quality_key)))
    served = None
    if pl.ok("serve") and (D / "serve" / "results.json").is_file():
        served = json.loads((D / "serve" / "results.json").read_text())
        by = {r["name"]: r for r in served.get("models", [])}
        t, q = by.get("teacher"), by.get("student-a-int8")
        if t and q and t.get("texts_per_s") and q.get("texts_per_s"):
            claims.append({"claim": "student-a-int8 served over HTTP gives more texts/s than the teacher served "
                                    "the same way",
                           "value": f"{q['texts_per_s'] / t['texts_per_s']:.2f}× ({t['texts_per_s']:.1f} → "
                                    f"{q['texts_per_s']:.1f} texts/s)", "ok": q["texts_per_s"] > t["texts_per_s"]})
    from .bundle_check import demo_claim
    claims += [c for c in [demo_claim(D)] if c]
    header = {"command": "bertforge " + shlex.join(pl.demo_argv),
              "mode": ("quick (smoke budgets)" if args.quick else "full") +
                      (f", task {args.task}" if args.task else ", embedded default"),
              "teacher": f"{args.teacher} (MiniLM-L6-H384, sentence-transformers/all-MiniLM-L6-v2)"
                         if args.teacher == "minilm" else args.teacher,
              "students": f"(a) layers:{args.student_layers} of the teacher; (b) (a) at {args.student_bits} bits",
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} intra-op threads",
              "budgets": ", ".join(f"{k}={v}" for k, v in b.items()),
              "wall time": f"{elapsed:.0f} s"}
    notes = []
    skipped = [s for s in pl.stages if s["status"] != "ok"]
    for s in skipped:
        notes.append(f"stage **{s['name']}** {s['status']}: {s['message']}")
    if torch.get_num_threads() < (os.cpu_count() or 1):
        notes.append(f"ran with {torch.get_num_threads()} intra-op thread(s) on {os.cpu_count()} CPUs "
                     f"(--threads, or the machine was busy at start: load average ≥ CPU count); latency "
                     f"ratios are measured under the same setting for every model.")
    if args.task:
        notes.append("task mode: the pretraining-objectives stage is left out (it does not use your data); "
                     "run `bertforge demo` without --task for it.")
    if args.quick:
        notes.append("quick mode: budgets are smoke-test sized; the figures show the pipeline works, not "
                     "what the methods reach.")
    return rp.write_report(D, rows, pl.stages, header, loss_png, q_png, objective_rows, claims, notes, served)


__all__ = ["BUDGETS", "DemoOptions", "DemoResult", "Stage", "Pipeline", "stage_table", "evaluate_stage", "demo_with"]
