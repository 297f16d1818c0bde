"""Low-bit (Q-BERT) quantization of MiniLM-L6 models: ``bertforge quantize --bits mixed --size-budget MB``.

For an SST-2 teacher, an STS-B teacher (MiniLM-L6-H384 fine-tuned here, cached in ``--work``) and an embedding
model (all-MiniLM-L6-v2; the demo's teacher — see the note in the results), each quantized under a size budget
of ``--size-fraction`` of its FP32 weights file:

* bits per encoder layer (Hessian-guided allocation from {2, 3, 4, 8}), average bits, true size and file size
  against FP32;
* dev score of FP32, round-to-nearest at the same bits (the same grids, no fine-tuning) and the low-bit model
  after quantization-aware fine-tuning (FP32 model as teacher); for the embedding model NDCG@10 on the SQuAD
  retrieval set (``bertforge.data.beir.squad_to_beir``, the eval articles' paragraphs as the corpus);
* per-text latency (batch 1, ONNX Runtime, same threads) of the low-bit graph vs the INT8 graph of
  ``bertforge quantize`` (interleaved rounds, median).

Run (bounded; what ran is printed and written to ``benchmarks/results/lowbit.txt``):

    nice -n 10 python benchmarks/bench_lowbit.py --work ~/.cache/bertforge/bench_lowbit
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
GLUE = DATA / "glue"
SQUAD = DATA / "squad" / "dev-v1.1.json"


def head_rows(src: Path, dst: Path, n: int) -> Path:
    """The header and the first ``n`` rows of a GLUE tsv (a bounded training / dev file)."""
    lines = src.read_text(encoding="utf-8").splitlines()
    dst.write_text("\n".join(lines[:n + 1]) + "\n", encoding="utf-8")
    return dst


def teacher(task: str, train: Path, out: Path, args, say) -> Path:
    """MiniLM-L6 fine-tuned on ``train`` (cached: an existing ``out/config.json`` is reused)."""
    import bertforge
    if (out / "config.json").is_file():
        say(f"teacher {task}: cached {out}")
        return out
    t0 = time.time()
    bertforge.finetune("minilm", task, str(train), str(out), epochs=args.ft_epochs, batch_size=32,
                       max_seq_len=args.seq, lr=args.ft_lr, overwrite=True, no_progress=True)
    rows = sum(1 for _ in train.open(encoding="utf-8")) - 1  # --ft-rows, or fewer where the task has fewer
    say(f"teacher {task}: fine-tuned on {train.name} ({rows} rows, {args.ft_epochs} epochs, seq "
        f"{args.seq}) in {time.time() - t0:.0f} s")
    return out


def lowbit(model, out: Path, budget_mb: float, args, calib=None, qat_train=None, eval_file=None, qat_steps=None):
    import bertforge
    opts = dict(bits="mixed", size_budget=budget_mb, group_size=args.group_size, overwrite=True,
                qat_steps=args.qat_steps if qat_steps is None else qat_steps, qat_batch_size=args.qat_batch,
                qat_lr=args.qat_lr, hessian_batches=args.hessian_batches, hessian_batch_size=8,
                hessian_iters=args.hessian_iters, trace_samples=args.trace_samples, max_seq_len=args.seq,
                calib_samples=args.calib_samples)
    if calib is not None:
        opts["calib"] = calib
    if qat_train is not None:
        opts.update(qat_train=str(qat_train), max_qat_samples=args.qat_rows)
    if eval_file is not None:
        opts["eval"] = str(eval_file)
    t0 = time.time()
    rec = bertforge.quantize(str(model), str(out), **opts).record
    rec["seconds"] = round(time.time() - t0, 1)
    return rec


def int8(model, out: Path) -> Path:
    import bertforge
    bertforge.quantize(str(model), str(out), overwrite=True)
    return out


def latency(dirs: dict, texts: list, threads: int, rounds: int) -> dict:
    """Median ms per text (batch 1) of each dir, interleaved rounds."""
    from bertforge.runtime import load_runner
    from bertforge.tokenizer import load_tokenizer
    import numpy as np
    runners = {k: load_runner(v, threads=threads) for k, v in dirs.items()}
    tok = load_tokenizer(next(iter(dirs.values())))
    enc = [tok.encode(t).ids[:128] for t in texts]
    feeds = [{"input_ids": np.array([e]), "attention_mask": np.ones((1, len(e)), np.int64)} for e in enc]
    times = {k: [] for k in dirs}
    for _ in range(rounds):
        for k, r in runners.items():
            t0 = time.perf_counter()
            for f in feeds:
                r(**f)
            times[k].append(1000 * (time.perf_counter() - t0) / len(feeds))
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


def ndcg(path, beir, seq: int, threads: int) -> float:
    from bertforge.metrics.retrieval import exact_search, retrieval_metrics, run_from_topk
    from bertforge.runtime.embedder import load_embedder
    emb = load_embedder(path, threads=threads)
    qids, dids = list(beir.queries), list(beir.corpus)
    q = emb.embed([beir.queries[i] for i in qids], seq, batch_size=32)
    d = emb.embed([beir.corpus[i] for i in dids], seq, batch_size=32)
    return float(retrieval_metrics(run_from_topk(qids, dids, *exact_search(q, d, top_k=100)), beir.qrels)["ndcg@10"])


def fp32_mb(model_dir) -> float:
    from bertforge.checkpoint.modeldir import ModelDir
    return sum(f.stat().st_size for f in ModelDir.open(model_dir).fp32_weights) / 2 ** 20


def report_model(name: str, rec: dict, fp32: float, metric: str, scores: dict, say) -> dict:
    """One model's lines: bits per layer, sizes, scores and the claims."""
    say(f"\n== {name}")
    say("bits per layer: " + ", ".join(f"{k.split('.')[-1]}:{v}" for k, v in rec["bits_per_layer"].items())
        + "; fixed: " + ", ".join(f"{k}:{v}" for k, v in rec["fixed_bits"].items()))
    if rec.get("sensitivity"):
        say("Hessian Ω (top eigenvalue mean+std) per layer: " + ", ".join(
            f"{k.split('.')[-1]}:{v['omega']:.3g}" for k, v in rec["sensitivity"].items()))
    ratio = rec["file_mb"] / fp32
    say(f"average bits {rec['average_bits']:.3f}; true size {rec['true_mb']:.2f} MB; file {rec['file_mb']:.2f} MB "
        f"vs FP32 {fp32:.2f} MB = 1/{1 / ratio:.2f}")
    f, r, q = scores["fp32"], scores["rtn"], scores["lowbit"]
    say(f"{metric}: FP32 {f:.4f} | round-to-nearest {r:.4f} ({100 * r / f:.1f}%) | low-bit + QAT {q:.4f} "
        f"({100 * q / f:.1f}%)")
    qat = rec.get("qat") or {}
    if "kept" in qat:
        say(f"QAT ({qat['steps']} steps, {qat['loss']} from the FP32 model): held-out loss {qat['heldout_loss_rtn']:.4g} "
            f"(round-to-nearest) → {qat['heldout_loss_qat']:.4g}: "
            + ("kept" if qat["kept"] else "not kept, the round-to-nearest weights ship"))
    claims = {"avg_bits<=4.5": rec["average_bits"] <= 4.5, "file<=1/6": ratio <= 1 / 6,
              ">=98%": q >= 0.98 * f}
    if f - r > 0.05 * (100 if f > 1.5 else 1):
        claims[">=5pts_above_rtn"] = (q - r) >= 0.05 * (100 if f > 1.5 else 1)
    say("claims: " + ", ".join(f"{k} {'YES' if v else 'NO'}" for k, v in claims.items()))
    return {"record": rec, "scores": scores, "fp32_mb": fp32, "claims": claims}


def task_model(task: str, tsv: str, args, work: Path, say) -> dict:
    train = head_rows(GLUE / tsv / "train.tsv", work / f"{task}-train.tsv", args.ft_rows)
    dev = head_rows(GLUE / tsv / "dev.tsv", work / f"{task}-dev.tsv", args.dev_rows)
    qat_train = head_rows(GLUE / tsv / "train.tsv", work / f"{task}-qat.tsv", args.qat_rows)
    t = teacher(task, train, work / f"teacher-{task}", args, say)
    fp32 = fp32_mb(t)
    rec = lowbit(t, work / f"{task}-lowbit", args.size_fraction * fp32, args, qat_train=qat_train, eval_file=dev)
    ev = rec["eval"]
    key = next((k for k in ("accuracy", "pearson", "spearman", "spearmanr") if k in ev["fp32"]),
               next(k for k, v in ev["fp32"].items() if isinstance(v, float)))
    scores = {"fp32": ev["fp32"][key], "rtn": ev["round_to_nearest"][key], "lowbit": ev["low_bit"][key]}
    out = report_model(f"{task} (MiniLM-L6 teacher), dev {key}, n={ev['n']}", rec, fp32, key, scores, say)
    out["int8"] = str(int8(t, work / f"{task}-int8"))
    out["lowbit_dir"] = str(work / f"{task}-lowbit")
    return out


def embedding_model(args, work: Path, say) -> dict:
    from bertforge.checkpoint.modeldir import resolve_model_dir
    from bertforge.data.beir import read_beir, squad_to_beir
    import random
    beir_dir = work / "squad-beir"
    squad_to_beir(SQUAD, beir_dir, eval_fraction=0.2, seed=0)
    beir = read_beir(beir_dir, "test")
    eval_docs = {d for q in beir.qrels for d in beir.qrels[q]}
    beir.corpus = {d: t for d, t in beir.corpus.items() if d in eval_docs}
    if args.eval_queries and args.eval_queries < len(beir.queries):
        keep = sorted(random.Random(0).sample(sorted(beir.queries), args.eval_queries))
        beir.queries = {q: beir.queries[q] for q in keep}
        beir.qrels = {q: beir.qrels[q] for q in keep}
    # calibration / QAT texts: SQuAD *train-split* questions and paragraphs (no eval article)
    pairs = [json.loads(x) for x in (beir_dir / "train.jsonl").read_text().splitlines()]
    texts = [t for p in pairs[:args.qat_rows // 2] for t in (p["query"], p["positive"])]
    calib = work / "embed-calib.txt"
    calib.write_text("\n".join(t.replace("\n", " ").replace("\t", " ") for t in texts) + "\n", encoding="utf-8")
    model = resolve_model_dir(args.embed_model)
    fp32 = fp32_mb(model)
    budget = args.size_fraction * fp32
    lowbit(model, work / "embed-rtn", budget, args, calib=str(calib), qat_steps=0)
    rec = lowbit(model, work / "embed-lowbit", budget, args, calib=str(calib))
    scores = {"fp32": ndcg(model, beir, args.seq, args.threads), "rtn": ndcg(work / "embed-rtn", beir, args.seq, args.threads),
              "lowbit": ndcg(work / "embed-lowbit", beir, args.seq, args.threads)}
    out = report_model(f"embeddings ({args.embed_model}), SQuAD retrieval NDCG@10, {len(beir.queries)} queries, "
                       f"{len(beir.corpus)} paragraphs", rec, fp32, "NDCG@10", scores, say)
    out["int8"] = str(int8(model, work / "embed-int8"))
    out["lowbit_dir"] = str(work / "embed-lowbit")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=str(Path.home() / ".cache" / "bertforge" / "bench_lowbit"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", nargs="*", default=["sst2", "stsb", "embed"])
    p.add_argument("--ft-rows", type=int, default=67349, help="teacher training rows (SST-2 has 67,349)")
    p.add_argument("--ft-epochs", type=float, default=1.0)
    p.add_argument("--ft-lr", type=float, default=5e-5)
    p.add_argument("--dev-rows", type=int, default=100000)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--size-fraction", type=float, default=0.95 / 6, help="size budget / FP32 weights file")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--qat-steps", type=int, default=300)
    p.add_argument("--qat-batch", type=int, default=32)
    p.add_argument("--qat-lr", type=float, default=5e-5)
    p.add_argument("--qat-rows", type=int, default=9600)
    p.add_argument("--calib-samples", type=int, default=128)
    p.add_argument("--hessian-batches", type=int, default=2)
    p.add_argument("--hessian-iters", type=int, default=20)
    p.add_argument("--trace-samples", type=int, default=8)
    p.add_argument("--eval-queries", type=int, default=None)
    p.add_argument("--embed-model", default="minilm")
    p.add_argument("--latency-texts", type=int, default=32)
    p.add_argument("--latency-rounds", type=int, default=5)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "lowbit.txt"))
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    from bertforge.hardware import cpu_flags
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    lines = ["command: python benchmarks/bench_lowbit.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
             f"cpu flags: {' '.join(f for f in cpu_flags() if f.startswith(('avx', 'amx', 'fma', 'f16c')))}",
             f"nproc {os.cpu_count()}, load average at start {os.getloadavg()[0]:.1f}, niceness {os.nice(0)}; torch / ORT "
             f"threads {args.threads}"]
    print("\n".join(lines), flush=True)

    def say(s):
        print(s, flush=True)
        lines.append(s)
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")

    results = {}
    if "sst2" in args.only:
        results["sst2"] = task_model("sst2", "SST-2", args, work, say)
    if "stsb" in args.only:
        results["stsb"] = task_model("stsb", "STS-B", args, work, say)
    if "embed" in args.only:
        results["embed"] = embedding_model(args, work, say)
    sents = [ln.split("\t")[0] for ln in (GLUE / "SST-2" / "dev.tsv").read_text().splitlines()[1:args.latency_texts + 1]]
    for k, r in results.items():
        lat = latency({"int8": r["int8"], "low-bit": r["lowbit_dir"]}, sents, args.threads, args.latency_rounds)
        r["latency_ms"] = lat
        say(f"latency {k} (batch 1, {args.threads} thread, median of {args.latency_rounds} interleaved rounds, "
            f"{len(sents)} SST-2 dev texts): INT8 {lat['int8']:.2f} ms, low-bit {lat['low-bit']:.2f} ms per text "
            f"(host-dependent)")
    (work / "results.json").write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "record"}
                                                   for k, v in results.items()}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
