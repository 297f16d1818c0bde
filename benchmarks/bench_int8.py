"""INT8 per host kind: accuracy against FP32 on real tasks, and speed against FP32 and the peers' INT8.

Models (real weights where accuracy is measured; latency does not depend on weight values):
  * SST-2  — MiniLM-L6-H384 fine-tuned on all 67,349 SST-2 train rows (``--sst2-model``), dev accuracy (872);
  * STS-B  — MiniLM-L6-H384 fine-tuned on STS-B train (``--stsb-model``), dev Spearman (1,500 pairs);
  * search — the shipped all-MiniLM-L6-v2 embedding model on the SQuAD-dev BEIR set's test split
             (``bertforge beir-from-squad``): NDCG@10, and the per-text cosine of INT8 vs FP32 vectors;
  * the demo's students, for speed: (a) 3 layers × 384 (``layers:0,2,5`` of MiniLM), (b) TinyBERT-4
    (4 × 312, FFN 1200), both head-less embedding encoders as the demo makes them.

Variants per model: bertforge's FP32 ONNX graph; bertforge INT8 with the scheme this host's kind gets
(``quantize`` default), with the AVX2 scheme (u8s8-7bit: exact on AVX2, so its accuracy here is the one an
AVX2 host gets), u8u8, static QDQ (entropy calibration on 128 train texts); ONNX Runtime's plain
``quantize_dynamic`` (defaults: per-tensor int8 weights) of a plain ``torch.onnx.export`` of the transformers
model; optimum's dynamic INT8 (``benchmarks/peers/optimum_int8.py``, run in ``--optimum-python``'s venv,
``AutoQuantizationConfig`` for this host; skipped when that venv is absent). Every graph is run by the same
ONNX Runtime in this venv.

Speed: seq 128, batch 1, ``--threads`` threads, ``--rounds`` interleaved rounds (each round times every
runner); p50 over all calls, and each ratio's median and range over rounds (the host's noise).

  python benchmarks/bench_int8.py --sst2-model runs/sst2-full --stsb-model runs/stsb [--rounds 5]

Fine-tunes (about 15 and 5 min on 2 cores):
  bertforge finetune --model minilm --task sst2 --train $D/glue/SST-2/train.tsv --eval $D/glue/SST-2/dev.tsv \\
      --out runs/sst2-full --epochs 1 --batch-size 32 --lr 5e-5 --max-seq-len 64
  bertforge finetune --model minilm --task stsb --train $D/glue/STS-B/train.tsv --eval $D/glue/STS-B/dev.tsv \\
      --out runs/stsb --epochs 4 --batch-size 32 --lr 5e-5 --max-seq-len 128
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

warnings.filterwarnings("ignore")
HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"
if not DATA.is_dir():
    DATA = Path("/work/shared/data")
sys.path.insert(0, str(HERE))


def build_student(path: Path, layers: int, hidden: int, ffn: int, tokenizer_dir: Path) -> Path:
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import copy_tokenizer_files
    torch.manual_seed(0)
    TaskModel(ModelConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=12,
                          intermediate_size=ffn), head="base").eval().save_pretrained(path)
    copy_tokenizer_files(tokenizer_dir, path)
    return path


def graph_dir(graph: Path, like: Path, out: Path) -> Path:
    """A dir bertforge's runner can score: ``graph`` as model.onnx beside ``like``'s config and tokenizer."""
    from bertforge.models.pooling import carry_pooling
    from bertforge.tokenizer import copy_tokenizer_files
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(graph, out / "model.onnx")
    shutil.copy(like / "config.json", out / "config.json")
    copy_tokenizer_files(like, out)
    carry_pooling(like, out)
    return out


def optimum_int8(python: str, model_dir: Path, out: Path, task: str):
    """optimum's dynamic INT8 graph of ``model_dir`` (its own venv), or None with the reason printed."""
    script = HERE / "peers" / "optimum_int8.py"
    if not python or not Path(python).exists() or not script.exists():
        print(f"  optimum: skipped (no venv at {python})", flush=True)
        return None
    r = subprocess.run([python, str(script), "--model", str(model_dir), "--out", str(out), "--task", task],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"  optimum: failed ({(r.stderr.strip().splitlines() or ['?'])[-1][:200]})", flush=True)
        return None
    return Path(json.loads(r.stdout.strip().splitlines()[-1])["onnx"])


def variants(name: str, src: Path, head: str, work: Path, args, calib: list) -> dict:
    """{variant: dir} for one source checkpoint dir."""
    from bench_compress import plain_onnx
    from bertforge.cli import main
    out = {}
    d = work / name
    reuse = lambda o: args.reuse and (o / "model.onnx").is_file()  # noqa: E731
    if not reuse(d / "fp32"):
        assert main(["export", "--model", str(src), "--out", str(d / "fp32"), "--overwrite"]) == 0
    out["bertforge FP32"] = d / "fp32"
    common = ["--model", str(src), "--overwrite", "--max-drop", "100"]
    calib_file = d / "calib.txt"
    calib_file.write_text("\n".join("\t".join(t) if isinstance(t, tuple) else t for t in calib) + "\n")
    runs = {"bertforge INT8 (this host's scheme)": ("int8-host", []),
            "bertforge INT8 u8s8-7bit (the AVX2 scheme)": ("int8-7bit", ["--scheme", "u8s8-7bit"]),
            "bertforge INT8 u8u8": ("int8-u8u8", ["--scheme", "u8u8"]),
            "bertforge INT8 static s8s8 (entropy)": ("int8-static", ["--scheme", "s8s8-static", "--calibration",
                                                                     "entropy"])}
    if args.quick:
        runs = dict(list(runs.items())[:1])
    for k, (slug, extra) in runs.items():
        o = d / slug
        if not reuse(o):
            assert main(["quantize", *common, "--out", str(o), "--calib", str(calib_file), *extra]) == 0
        out[k] = o
    if not reuse(d / "plain-int8"):
        graph_dir(plain_onnx(src, d / "plain", True, head), out["bertforge FP32"], d / "plain-int8")
    out["ORT plain quantize_dynamic"] = d / "plain-int8"
    task = "text-classification" if head == "sequence_classification" else "feature-extraction"
    if reuse(d / "optimum-int8"):
        out["optimum INT8"] = d / "optimum-int8"
    else:
        opt = optimum_int8(args.optimum_python, src, d / "optimum", task)
        if opt is not None:
            out["optimum INT8"] = graph_dir(opt, out["bertforge FP32"], d / "optimum-int8")
    return out


def flags_line() -> str:
    from bertforge.compress.int8 import host_target
    from bertforge.compress.onnx import INT8_FLAGS
    from bertforge.hardware import cpu_flags
    fl = cpu_flags()
    return (f"cpu flags (INT8-relevant): {' '.join(f for f in INT8_FLAGS if f in fl) or 'none'}; host kind "
            f"{host_target(fl)}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sst2-model", required=True)
    ap.add_argument("--stsb-model", required=True)
    ap.add_argument("--beir", default=None, help="SQuAD BEIR dir (default: built from SQuAD dev in --work)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="timed calls per runner per round")
    ap.add_argument("--optimum-python", default=str(HERE.parent / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--reuse", action="store_true", help="keep the graphs already in --work")
    ap.add_argument("--quick", action="store_true", help="fewer variants and rows (a smoke run)")
    ap.add_argument("--result", default=None)
    args = ap.parse_args(argv)
    import logging
    logging.getLogger().setLevel(logging.ERROR)
    import onnxruntime
    import transformers
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    from bertforge.pipelines.evaluate import load_for_task
    from bertforge.data.beir import read_beir
    from bertforge.runtime import bench as bb
    from bertforge.runtime.embedder import evaluate_retrieval, load_embedder
    from bertforge.checkpoint import resolve_model_dir
    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="bench_int8-")
    work = Path(args.work or tmp.name)
    lines = [f"bench_int8: {flags_line()}",
             f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, threads {threads}, "
             f"load average at start {os.getloadavg()[0]:.1f}"]
    print("\n".join(lines), flush=True)
    t0 = time.time()
    mini = resolve_model_dir("minilm")
    sst2, stsb = Path(args.sst2_model), Path(args.stsb_model)
    sst2_rows = [ln.split("\t")[0] for ln in (DATA / "glue/SST-2/train.tsv").read_text().splitlines()[1:]]
    stsb_rows = [tuple(ln.split("\t")[7:9]) for ln in (DATA / "glue/STS-B/train.tsv").read_text().splitlines()[1:]]
    rng = np.random.default_rng(0)
    beir = Path(args.beir) if args.beir else work / "squad-beir"
    if not (beir / "corpus.jsonl").is_file():
        from bertforge.cli import main as cli
        assert cli(["beir-from-squad", "--data", str(DATA / "squad/dev-v1.1.json"), "--out-dir", str(beir)]) == 0
    data = read_beir(beir, "test")
    train_q = read_beir(beir, "train")
    calib = {"sst2": [sst2_rows[i] for i in rng.choice(len(sst2_rows), 128, replace=False)],
             "stsb": [stsb_rows[i] for i in rng.choice(len(stsb_rows), 128, replace=False)],
             "search": list(train_q.queries.values())[:64] + list(train_q.corpus.values())[:64]}
    models = {"sst2": variants("sst2", sst2, "sequence_classification", work, args, calib["sst2"]),
              "stsb": variants("stsb", stsb, "sequence_classification", work, args, calib["stsb"]),
              "search": variants("search", mini, "base", work, args, calib["search"])}
    print(f"prepared in {time.time() - t0:.0f}s", flush=True)

    # ---------------------------------------------------------------- accuracy
    acc_rows = []
    for task, key, path in (("sst2", "accuracy", DATA / "glue/SST-2/dev.tsv"),
                            ("stsb", "spearman", DATA / "glue/STS-B/dev.tsv")):
        ref = None
        for v, d in models[task].items():
            _, _, adapter, runner = load_for_task(str(d), task)
            ds = adapter.load(str(path), None if not args.quick else 200)
            m = adapter.evaluate(runner, ds)
            score = 100 * m[key]
            ref = score if ref is None else ref
            acc_rows.append((task, v, f"{key} {score:.2f}", f"{score - ref:+.2f}"))
            print(acc_rows[-1], flush=True)
    ref_vecs, ref_ndcg = None, None
    if args.quick:
        data.queries = dict(list(data.queries.items())[:100])
    for v, d in models["search"].items():
        emb = load_embedder(d, threads=threads)
        res, (dv, qv) = evaluate_retrieval(emb, data, batch_size=32, max_seq_len=256, return_vectors=True)
        vecs = np.concatenate([dv, qv])
        if ref_vecs is None:
            ref_vecs, ref_ndcg = vecs, res["ndcg@10"]
        a = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
        b = ref_vecs / np.linalg.norm(ref_vecs, axis=1, keepdims=True)
        cos = (a * b).sum(1)
        acc_rows.append(("search", v, f"NDCG@10 {100 * res['ndcg@10']:.2f}",
                         f"{100 * res['ndcg@10'] / ref_ndcg:.2f}% of FP32; cosine vs FP32 median "
                         f"{np.median(cos):.4f} min {cos.min():.4f} ({len(cos)} texts)"))
        print(acc_rows[-1], flush=True)

    # ---------------------------------------------------------------- speed
    students = {"student-a (3×384)": build_student(work / "src-student-a", 3, 384, 1536, mini),
                "student-b (4×312)": build_student(work / "src-student-b", 4, 312, 1200, mini)}
    for name, src in students.items():
        models[name] = variants(name.split()[0], src, "base", work, argparse.Namespace(**{**vars(args),
                                                                                            "quick": True}),
                                calib["search"])
    timed = ["bertforge FP32", "bertforge INT8 (this host's scheme)", "bertforge INT8 u8s8-7bit (the AVX2 scheme)",
             "bertforge INT8 static s8s8 (entropy)", "ORT plain quantize_dynamic", "optimum INT8"]
    from bertforge.runtime import load_runner
    x = bb.random_inputs(30522, 1, 128, seed=0)
    runners = []
    for mname in ("sst2", "search", "student-a (3×384)", "student-b (4×312)"):
        for v in timed:
            if v in models[mname]:
                r = load_runner(models[mname][v], "onnxruntime", threads)
                runners.append((mname, v, lambda r=r: r(**x)))
    lat = {(m, v): [] for m, v, _ in runners}
    per_round = {(m, v): [] for m, v, _ in runners}
    for _ in range(args.rounds):
        for m, v, call in runners:
            ts = bb.time_calls(call, warmup=1, iters=args.calls, warmup_seconds=0.05)
            lat[(m, v)] += ts
            per_round[(m, v)].append(float(np.percentile(ts, 50)))
    speed_rows = []
    for m in ("sst2", "search", "student-a (3×384)", "student-b (4×312)"):
        fp = (m, "bertforge FP32")
        mine = (m, "bertforge INT8 (this host's scheme)")
        for v in timed:
            k = (m, v)
            if k not in lat:
                continue
            p50 = float(np.percentile(lat[k], 50))
            ratios = np.array(per_round[fp]) / np.array(per_round[k])
            line = (m, v, f"{p50:.2f} ms", f"{float(np.percentile(lat[fp], 50)) / p50:.2f}x vs FP32 "
                    f"(rounds {ratios.min():.2f}-{ratios.max():.2f})")
            if v in ("ORT plain quantize_dynamic", "optimum INT8"):
                rr = np.array(per_round[k]) / np.array(per_round[mine])
                line += (f"bertforge INT8 is {p50 / float(np.percentile(lat[mine], 50)):.2f}x faster "
                         f"(rounds {rr.min():.2f}-{rr.max():.2f})",)
            speed_rows.append(line)
    out = lines + [f"accuracy (FP32 = bertforge's FP32 ONNX graph; every INT8 graph run by onnxruntime "
                   f"{onnxruntime.__version__} here)"]
    out += [f"  {t:<8} {v:<44} {s:<18} {d}" for t, v, s, d in acc_rows]
    out += [f"speed: seq 128, batch 1, {threads} threads, {args.rounds} interleaved rounds × {args.calls} calls"]
    out += [f"  {m:<20} {v:<38} {' '.join(rest)}" for m, v, *rest in speed_rows]
    out.append(f"total {time.time() - t0:.0f}s")
    text = "\n".join(out)
    print(text)
    if args.result:
        with open(args.result, "a", encoding="utf-8") as f:
            f.write(f"# python benchmarks/bench_int8.py {' '.join(argv or sys.argv[1:])}  "
                    f"({time.strftime('%Y-%m-%d %H:%M')})\n{text}\n\n")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
