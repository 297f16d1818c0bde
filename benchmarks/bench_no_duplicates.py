"""In-batch negatives with repeated texts (issue 39, item 3): SQuAD retrieval fine-tuning of MiniLM on the train
pairs as they come — a paragraph is the positive of ~4.6 questions, so a batch of 32 often holds one paragraph
twice and MNRL then scores a question's own paragraph as its negative — with ``train.no_duplicates`` (the
default: no batch repeats a text; deferred / dropped pairs counted on stderr), against the same data with the
repeats removed by hand (one question per paragraph), and against the plain shuffled batches
(``train.no_duplicates=false``, what ran before).

Data and evaluation as ``bench_retrieval.py``: ``squad_to_beir`` of ``../shared/data/squad/dev-v1.1.json``
(articles split disjointly, seed 0), training on ``train.jsonl`` of the train articles, NDCG@10 of the eval
articles' questions against their own paragraphs (bertforge's Embedder, exact search). Every arm: the same
steps, batch, lr (the retrieval task's default, 2e-5), warm-up, sequence lengths and seed.

    nice -n 10 python benchmarks/bench_no_duplicates.py --threads 2 --steps 48

Writes benchmarks/results/no_duplicates.txt (command, CPU flags, one line per arm, the counts, the goal).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def run_cli(argv: list) -> tuple:
    """A bertforge verb in this process → (its JSON result line, its stderr lines that start with bertforge)."""
    from bertforge.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    if rc != 0:
        raise SystemExit(f"bertforge {' '.join(map(str, argv))} failed ({rc}): {err.getvalue()[-600:]}")
    notes = [ln for ln in err.getvalue().splitlines() if "no_duplicates" in ln]
    return json.loads(out.getvalue().strip().splitlines()[-1]), notes


def evaluate_per_query(path, beir, threads: int, max_seq_len: int) -> dict:
    """bench_retrieval.evaluate's numbers (bertforge's Embedder, exact search) and each question's NDCG@10."""
    from bertforge.metrics.retrieval import exact_search, retrieval_metrics, run_from_topk
    from bertforge.runtime.embedder import load_embedder
    emb = load_embedder(path, threads=threads)
    qids, dids = list(beir.queries), list(beir.corpus)
    q = emb.embed([beir.queries[i] for i in qids], max_seq_len, batch_size=64)
    d = emb.embed([beir.corpus[i] for i in dids], max_seq_len, batch_size=32)
    m = retrieval_metrics(run_from_topk(qids, dids, *exact_search(q, d, top_k=100)), beir.qrels, per_query=True)
    out = {k: m[k] for k in ("ndcg@10", "mrr@10", "recall@10", "recall@100")}
    out["per_query"] = {qid: v["ndcg@10"] for qid, v in m["per_query"].items()}
    return out


def paired_bootstrap(a: dict, b: dict, n: int, seed: int = 0) -> tuple:
    """Mean of a[q] − b[q] over the shared questions and its 95% percentile interval from ``n`` resamples of
    the questions with replacement (Efron & Tibshirani 1993, ch. 13; paired: both arms on the same draw)."""
    import numpy as np
    qs = sorted(set(a) & set(b))
    diff = np.array([a[q] - b[q] for q in qs])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n, len(diff)))].mean(1)
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=0, help="train every arm this many epochs of its own data instead "
                                                          "of --steps (a user's default run: raw pairs vs cleaned)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-max-seq-len", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=256, help="evaluation: texts cut at this many tokens")
    ap.add_argument("--arms", default="sampler,hand,off")
    ap.add_argument("--eval-queries", type=int, default=0, help="score this many eval questions (0: all), an even "
                                                                "spread over the eval articles (seed 0)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--reuse", action="store_true", help="an arm whose model is in --work already is not retrained")
    ap.add_argument("--bootstrap", type=int, default=2000, help="paired bootstrap resamples of the query set")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/no_duplicates.txt"))
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("BERTFORGE_NO_PROGRESS", "1")
    from bench_retrieval import SQUAD
    from bertforge.checkpoint import resolve_model_dir
    from bertforge.data.beir import read_beir, squad_to_beir
    from bertforge.hardware import cpu_flags

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-nodup-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = ["command: nice -n 10 python benchmarks/bench_no_duplicates.py "
             + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
             f"cpu flags: {' '.join(cpu_flags())}",
             f"torch threads: {args.threads}; host: 2 cores shared with other sessions"]

    def say(s):
        print(s, flush=True)
        lines.append(s)

    beir_dir = work / "squad-beir"
    counts = squad_to_beir(SQUAD, beir_dir, eval_fraction=0.2, seed=0)
    beir = read_beir(beir_dir, "test")
    eval_docs = {d for q in beir.qrels for d in beir.qrels[q]}
    beir.corpus = {d: t for d, t in beir.corpus.items() if d in eval_docs}
    if args.eval_queries and args.eval_queries < len(beir.queries):  # as bench_retrieval.py --eval-queries
        import random
        keep = sorted(random.Random(0).sample(sorted(beir.queries), args.eval_queries))
        beir.queries, beir.qrels = {q: beir.queries[q] for q in keep}, {q: beir.qrels[q] for q in keep}
    pairs = [json.loads(x) for x in (beir_dir / "train.jsonl").read_text().splitlines()]
    seen_q, seen_p, hand = set(), set(), []
    for p in pairs:  # by hand: the first question of each paragraph (and each question text once)
        if p["query"] in seen_q or p["positive"] in seen_p:
            continue
        seen_q.add(p["query"])
        seen_p.add(p["positive"])
        hand.append(p)
    hand_file = work / "train_hand.jsonl"
    hand_file.write_text("".join(json.dumps(p) + "\n" for p in hand))
    say(f"data: {SQUAD.name} → {json.dumps(counts)}; train pairs {len(pairs)} ({len({p['positive'] for p in pairs})} "
        f"distinct paragraphs), by hand {len(hand)}")
    length = f"{args.epochs} epoch(s) of each arm's own pairs" if args.epochs else f"{args.steps} steps"
    say(f"training: MNRL scale 20, {length} × batch {args.batch}, lr 2e-05 (the retrieval default), "
        f"linear, warm-up 10%, texts cut at {args.train_max_seq_len}; eval {len(beir.queries)} questions × "
        f"{len(beir.corpus)} paragraphs at {args.max_seq_len}")
    teacher = resolve_model_dir("minilm")
    arms = {"sampler": (beir_dir / "train.jsonl", []), "hand": (hand_file, []),
            "off": (beir_dir / "train.jsonl", ["train.no_duplicates=false"])}
    res = {}
    for name in [a for a in args.arms.split(",") if a]:
        data, extra = arms[name]
        out = work / f"ft-{name}"
        if args.reuse and (out / "model.safetensors").is_file() and (out / "result.json").is_file():
            r, notes = json.loads((out / "result.json").read_text()), ["(model reused from --work)"]
        else:
            r, notes = run_cli(["finetune", "--model", teacher, "--task", "retrieval", "--train", data, "--out", out,
                                "--max-seq-len", args.train_max_seq_len,
                                *(["--epochs", args.epochs] if args.epochs
                                  else ["--max-steps", args.steps, f"train.save_every={args.steps}"]),
                                "--batch-size", args.batch, "--overwrite", "train.warmup_ratio=0.1",
                                f"impl.threads={args.threads}", "--no-progress", *extra])
            (out / "result.json").write_text(json.dumps(r))
        m = evaluate_per_query(out, beir, args.threads, args.max_seq_len)
        res[name] = m
        steps = r.get("step", r.get("steps", "?"))
        say(f"{name:<8} train={data.name:<17} {' '.join(extra) or '(defaults)':<27} steps {steps}  NDCG@10 {m['ndcg@10']:.4f}  "
            f"MRR@10 {m['mrr@10']:.4f}  R@10 {m['recall@10']:.3f}  no_duplicates={json.dumps(r.get('no_duplicates'))}")
        for n in notes:
            say(f"    {n}")
    for a, b in (("sampler", "hand"), ("sampler", "off")):
        if a in res and b in res:
            d, lo, hi = paired_bootstrap(res[a]["per_query"], res[b]["per_query"], args.bootstrap)
            verdict = "better" if lo > 0 else ("worse" if hi < 0 else "the same within noise")
            say(f"{a} − {b}: NDCG@10 {d * 100:+.2f} points, paired bootstrap 95% CI [{lo * 100:+.2f}, {hi * 100:+.2f}] "
                f"over {len(res[a]['per_query'])} questions ({args.bootstrap} resamples) -> {verdict}")
            if (a, b) == ("sampler", "hand"):
                say(f"goal: the sampler on the raw pairs gives the same or better NDCG@10 than the pairs de-duplicated "
                    f"by hand (not worse beyond noise: the CI's upper end ≥ 0) -> {'MET' if hi >= 0 else 'NOT MET'}")
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
